"""The peer protocol: one trial of a network workload (``PeerWorkload``) across environments.

A network workload has a server side: its trial places the workload's files and runs its set-up
commands on both sides, starts the servers in the peer environment(s) (or in the cell, for a
workload the cell serves), runs the client(s) at once, stops the servers, runs the clean-up commands
and parses the clients' output (see ``virtlab.workloads._peer`` for who runs what). Any study uses
it: the grid for a cell of a network workload, the all-at-once studies for a served workload loaded
from the host.
"""

from __future__ import annotations

import posixpath
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from virtlab import ports
from virtlab.environments import CommandResult, Environment, EnvironmentError_
from virtlab.environments._base import BackgroundCommand
from virtlab.samples import ParseError, Sample
from virtlab.study.measure import environment_failure, error_log
from virtlab.study.outcome import UNAVAILABLE, TrialFailure
from virtlab.workloads._peer import LOOPBACK, Link, PeerWorkload, Role, ServerPlace, combine

LISTEN_WAIT_S = 30.0
"""How long a client keeps trying to connect while its server starts (a TCG guest is slow)."""
RETRY_S = 0.25
SERVER_STOP_S = 5.0
STEP_TIMEOUT_S = 120.0
"""A peer workload's set-up and clean-up commands (mkdir, rm of a large file in a slow guest)."""


def measure_peers(
    environments: Mapping[str, Environment], links: list[Link], workload: PeerWorkload
) -> list[Sample]:
    """One trial of a network workload: the workload's files and set-up on both sides of every link,
    the servers started, the clients run at once (each trying again while its server comes up), the
    servers stopped, the clean-up run, the clients' outputs parsed and combined; a failure anywhere
    is the trial's, with the logs of both sides."""
    servers = CellServers.start(environments, links, workload)
    try:
        results = servers.run_clients()
    except TrialFailure:
        servers.stop()
        raise
    stopped, leftovers = servers.stop()
    return servers.judged(results, stopped, leftovers)


@dataclass
class CellServers:
    """A network workload's servers while they run: started for one trial (``measure_peers``), or,
    for a workload whose server is the cell's own service (``server_per_cell``), from the cell's
    first trial to its last (``measure`` once per trial, ``stop`` after the cell)."""

    environments: Mapping[str, Environment]
    links: list[Link]
    workload: PeerWorkload
    lease: ports.Lease
    addresses: dict[Link, str] = field(default_factory=dict)
    places: dict[Link, ServerPlace] = field(default_factory=dict)
    running: list[tuple[Link, BackgroundCommand]] = field(default_factory=list)
    prepared: list[tuple[str, Role, int]] = field(default_factory=list)
    """The sides whose clean-up is due."""

    @classmethod
    def start(
        cls, environments: Mapping[str, Environment], links: list[Link], workload: PeerWorkload
    ) -> CellServers:
        """The ports leased, both sides of every link prepared, the servers started and ready; on a
        failure everything started is stopped and cleaned up again, and the failure raised."""
        try:
            slots, lease = ports.lease_slots(workload.ports, len(links), workload.slot_count())
        except ports.PortsBusy as busy:
            if workload.settings.ports is not None:
                first, last = workload.settings.ports
                held = f'[study] peer_ports = "{first}-{last}" holds them all'
                raise TrialFailure(f"{busy}; {held}", "") from None
            raise TrialFailure(str(busy), "") from None
        # The slots this trial holds, in place of the ones its links were planned with.
        links = [replace(link, slot=s) for link, s in zip(links, slots, strict=True)]
        servers = cls(environments, links, workload, lease)
        try:
            servers._start()
        except (TrialFailure, EnvironmentError_, OSError, NotImplementedError) as error:
            stopped, _ = servers.stop()
            if isinstance(error, TrialFailure):
                message, log, phase = str(error), error.log, error.phase
            else:
                message, log, phase = f"environment error: {error}", error_log(error), "run"
            logs = [log, *(_server_log(link, result) for link, _, result in stopped)]
            raise TrialFailure(message, "\n".join(logs), phase) from None
        except BaseException:
            servers.stop()
            raise
        return servers

    def _start(self) -> None:
        environments, workload = self.environments, self.workload
        self.addresses = {link: _server_address(environments, link) for link in self.links}
        if workload.client_knows_server:
            self.places = {link: _server_place(environments, link) for link in self.links}
        for link in self.links:
            for name, role in ((link.server, "server"), (link.client, "client")):
                self.prepared.append((name, role, link.slot))
                _prepare(environments[name], name, workload, role, link.slot)
        for link in self.links:
            server = environments[link.server]
            for argv in workload.server_commands(server.bin_dir, link.slot, bind=self.addresses[link]):
                self.running.append((link, server.start(argv)))
        for link in self.links:
            for name, role in ((link.server, "server"), (link.client, "client")):
                _run_step(environments[name], name, role, workload.ready_commands(role, link.slot))

    def run_clients(self) -> list[CommandResult]:
        """Every link's client at once, against its running server."""

        def client(link: Link) -> CommandResult:
            own = [command for where, command in self.running if where == link]
            environment = self.environments[link.client]
            return _run_client(
                environment, link, self.workload, self.addresses[link], own, self.places.get(link)
            )

        try:
            with ThreadPoolExecutor(max_workers=len(self.links)) as pool:
                return list(pool.map(client, self.links))
        except (EnvironmentError_, OSError, NotImplementedError) as error:
            raise environment_failure("environment error", error) from None

    def measure(self) -> list[Sample]:
        """One trial against the servers started before it, which keep running when it succeeds;
        when it fails they are stopped (the cell fails, and their output is its log's)."""
        results = self.run_clients_or_stop()
        try:
            return self.judged(results, [], [])
        except TrialFailure:
            stopped, leftovers = self.stop()
            return self.judged(results, stopped, leftovers)

    def run_clients_or_stop(self) -> list[CommandResult]:
        try:
            return self.run_clients()
        except TrialFailure as failure:
            stopped, _ = self.stop()
            logs = [failure.log, *(_server_log(link, result) for link, _, result in stopped)]
            raise TrialFailure(str(failure), "\n".join(logs), failure.phase) from None

    def stop(self) -> tuple[list[tuple[Link, bool, CommandResult]], list[tuple[str, str]]]:
        """The servers stopped, every prepared side cleaned up and the ports given back: returns each
        server's (link, whether it had ended before, result) and the clean-up's failures as
        (message, log). It never raises, and a second call has nothing left to do."""
        try:
            stopped = [
                (link, not command.running(), command.stop(SERVER_STOP_S)) for link, command in self.running
            ]
            leftovers = _clean_up(self.environments, self.workload, self.prepared)
        finally:
            self.running, self.prepared = [], []
            self.lease.release()
        return stopped, leftovers

    def judged(
        self,
        results: list[CommandResult],
        stopped: list[tuple[Link, bool, CommandResult]],
        leftovers: list[tuple[str, str]],
    ) -> list[Sample]:
        """The clients' outputs parsed and combined, or the trial's failure with the logs of both
        sides (``stopped``: the servers' results, none while they still run)."""
        workload = self.workload
        parsed = []
        for link, result in zip(self.links, results, strict=True):
            own = [(ended, server) for where, ended, server in stopped if where == link]
            log = _peer_log(link, result, [server for _, server in own])
            where = f"client in {link.client} -> server in {link.server}"
            if not result.ok:
                reason = workload.unavailable(result, [server for _, server in own])
                if reason is not None:
                    raise TrialFailure(f"{reason}; {where}", log, UNAVAILABLE)
            if result.timed_out:
                raise TrialFailure(f"{where}: timed out after {workload.timeout_s:g} s", log)
            if workload.not_listening(result.stdout, result.stderr):
                ended = [f"exit status {server.exit_code}" for early, server in own if early]
                why = f"the server ended ({', '.join(ended)})" if ended else f"within {LISTEN_WAIT_S:g} s"
                raise TrialFailure(f"{where}: no server listening: {why}", log)
            if result.exit_code != 0:
                raise TrialFailure(f"{where}: exit status {result.exit_code}", log)
            try:
                samples = workload.parse(result.stdout)
            except ParseError as error:
                raise TrialFailure(f"{where}: output not understood: {error}", log) from None
            path = "loopback" if link.client == link.server else "network"
            info = {
                "client": link.client,
                "server": link.server,
                "address": self.addresses[link],
                "path": path,
            }
            parsed.append((info, samples))
        if leftovers:
            message, log = leftovers[0]
            raise TrialFailure(message, "\n".join(log for _, log in leftovers))
        return combine(parsed)


def _prepare(environment: Environment, name: str, workload: PeerWorkload, role: Role, slot: int) -> None:
    """A side's files placed (their directories made first) and its set-up commands run."""
    files = workload.files(role, slot)
    for path in files:
        parts = posixpath.normpath(path).split("/")
        if posixpath.isabs(path) or ".." in parts or path in ("", "."):
            raise TrialFailure(f"{workload.kind}: {path!r} is not a path inside the working directory", "")
    directories = sorted({posixpath.dirname(posixpath.normpath(path)) for path in files} - {""})
    commands = [["mkdir", "-p", "--", *directories]] if directories else []
    _run_step(environment, name, role, commands)
    if files:
        with tempfile.TemporaryDirectory(prefix="virtlab-place-") as staging:
            for index, (path, content) in enumerate(files.items()):
                local = Path(staging) / str(index)
                local.write_bytes(content)
                local.chmod(0o600)  # keys among them: ssh refuses a private key others can read
                environment.copy_in(local, path)
    _run_step(environment, name, role, workload.setup_commands(role, slot))


def _run_step(environment: Environment, name: str, role: Role, commands: list[list[str]]) -> None:
    for argv in commands:
        result = environment.run(argv, STEP_TIMEOUT_S)
        if not result.ok:
            raise TrialFailure(f"setting up the {role} in {name}: {argv[0]}: {result.status()}", result.log())


def _clean_up(
    environments: Mapping[str, Environment], workload: PeerWorkload, prepared: list[tuple[str, Role, int]]
) -> list[tuple[str, str]]:
    """Every prepared side's clean-up commands, none skipped for another's failure; returns the
    failures as (message, log). It never raises: it runs while a trial's own failure may be on its way."""
    failures = []
    for name, role, slot in prepared:
        for argv in workload.cleanup_commands(role, slot):
            try:
                result = environments[name].run(argv, STEP_TIMEOUT_S)
            except (EnvironmentError_, OSError) as error:
                failures.append((f"cleaning up the {role} in {name}: {error}", error_log(error)))
                continue
            if not result.ok:
                failures.append(
                    (f"cleaning up the {role} in {name}: {argv[0]}: {result.status()}", result.log())
                )
    return failures


def _server_place(environments: Mapping[str, Environment], link: Link) -> ServerPlace:
    """The server environment's working directory (absolute) and user, as its commands see them."""
    result = environments[link.server].run(["sh", "-c", "pwd && id -un"], STEP_TIMEOUT_S)
    lines = result.stdout.splitlines()
    if not result.ok or len(lines) != 2 or not lines[0].startswith("/"):
        raise TrialFailure(f"the working directory and user of {link.server} are not known", result.log())
    return ServerPlace(directory=lines[0], user=lines[1])


def _server_address(environments: Mapping[str, Environment], link: Link) -> str:
    """Where the client reaches the server: loopback within one environment, else the server's
    address on virtlab's network (the client's is asked for too: native joins the network then)."""
    if link.client == link.server:
        return LOOPBACK
    addresses = {}
    for name in (link.server, link.client):
        environment = environments[name]
        address = addresses[name] = environment.network_address()
        if address is None:
            raise TrialFailure(
                f"environment {name!r} ({environment.kind}) has no address on virtlab's network: "
                'a container needs network = "bridge", a VM network = "bridge"',
                "",
            )
    return str(addresses[link.server])


def _run_client(
    environment: Environment,
    link: Link,
    workload: PeerWorkload,
    address: str,
    servers: list[BackgroundCommand],
    place: ServerPlace | None = None,
) -> CommandResult:
    if place is None:
        argv = workload.client_command(environment.bin_dir, address, link.slot)
    else:
        argv = workload.client_command(environment.bin_dir, address, link.slot, server=place)
    deadline = time.monotonic() + LISTEN_WAIT_S
    while True:
        result = environment.run(argv, workload.timeout_s)
        refused = not result.timed_out and workload.not_listening(result.stdout, result.stderr)
        if not refused or time.monotonic() > deadline or not all(s.running() for s in servers):
            return result
        time.sleep(RETRY_S)


def _peer_log(link: Link, client: CommandResult, servers: list[CommandResult]) -> str:
    parts = [f"=== client in {link.client} ===", client.log()]
    parts += [_server_log(link, server) for server in servers]
    return "\n".join(parts)


def _server_log(link: Link, server: CommandResult) -> str:
    return f"=== server in {link.server} ===\n{server.log()}"
