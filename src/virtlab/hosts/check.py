"""``virtlab hosts check``: is every host of a plan or an inventory ready, before a long study?

Each host gets one SSH session (strict host key checking against its known_hosts: a key that is
unknown or changed fails the host, it is never accepted), a thread each, a bounded number at once.
The session runs one fixed script (``CHECK_SCRIPT``): the facts the ssh kind records
(``DESCRIBE_SCRIPT``), privileges, NUMA nodes, /dev/kvm, and where the tools are; then it answers
clock readings, one per line it is sent, so that the remote time is read between two local
timestamps on an open connection: the offset is the reading against their midpoint, its
uncertainty half the round trip of the closest pair.

A host fails when it cannot be reached (the reason and the fix as ssh's own messages say) or lacks
a tool the plan needs there; a missing root or sudo, and a clock far off, are warnings. KVM is
probed for real, as ``virtlab doctor`` probes it here (``virtlab.hosts.kvm``: the doctor's boot
sector under KVM and TCG with the host's QEMU): it works, fails with "emulation failure" (nested
KVM), runs by emulation only, or is absent, with the reason; a check that need not know (``virtlab
run`` for hosts without VMs) only sees whether /dev/kvm exists ("present, not probed").

Where a host has a libvirt to use (the URI the plan's VMs on it connect to, else the host's own
``libvirt_uri``), this machine connects to it as a study would (``probe_libvirt``: the same call,
the host key checked strictly) and reads its hostname and version. One that does not connect fails
a host whose VMs need it, and is a warning otherwise.
"""

from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from virtlab.environments.ssh import (
    DESCRIBE_SCRIPT,
    describe_remote,
    diagnose_ssh,
    parse_sections,
    ssh_client_options,
)
from virtlab.hosts.kvm import PROBE_SCRIPT, probe_args, read_probe
from virtlab.hosts.model import Host
from virtlab.hosts.probecache import ProbeCache, parse_key
from virtlab.hosts.remote import ssh_options

MAX_PARALLEL = 16
CHECK_TIMEOUT_S = 60.0
CLOCK_ROUNDS = 8
CLOCK_TOLERANCE_S = 0.5
"""A host whose clock is further off than this (beyond the uncertainty) gets a warning."""
LIBVIRT_TIMEOUT_S = 30.0
"""How long a libvirt connection may take, on top of the SSH session's own deadline."""
BASE_TOOLS = ("runc", "virsh", "cc")
"""Looked for on every host: containers, libvirt, and the C compiler that builds the kernels there."""
_END = b"\n== end\n"
_SSH_FAILED = 255

# The facts, then the clock: a line in, a timestamp out, until the input ends. The arguments, each
# quoted on the way (shlex), never pasted into the script: "probe" or "skip" (the KVM probe), the
# tools to look for, "--", then the KVM probe's own (``hosts.kvm.probe_args``).
CHECK_SCRIPT = (
    DESCRIBE_SCRIPT
    + PROBE_SCRIPT
    + """section privilege
if [ "$(id -u)" = 0 ]; then echo root
elif ! command -v sudo >/dev/null 2>&1; then echo none
elif sudo -n true </dev/null >/dev/null 2>&1; then echo sudo
else echo password; fi
section numa; ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l
section kvm; [ -e /dev/kvm ] && echo present
section tools
probe=$1
shift
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    found=$(command -v -- "$1" 2>/dev/null) && printf '%s=%s\\n' "$1" "$found"
    shift
done
shift
[ "$probe" = probe ] && probe_kvm "$@"
section end
while read -r _; do date +%s.%N; done
"""
)


@dataclass(frozen=True)
class HostCheck:
    host: Host
    reached: bool
    facts: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    """Why the host fails (each with its fix)."""
    warnings: tuple[str, ...] = ()
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reached and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.host.name,
            "target": self.host.target,
            "ok": self.ok,
            "reached": self.reached,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "facts": self.facts,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def check_hosts(
    hosts: Sequence[Host],
    tools: Mapping[str, Sequence[str]],
    needs: Mapping[str, Sequence[str]],
    max_parallel: int = MAX_PARALLEL,
    timeout_s: float = CHECK_TIMEOUT_S,
    probe_kvm: bool = True,
    libvirt: Mapping[str, str] | None = None,
    probe_cache: ProbeCache | None = None,
    reprobe: bool = False,
    root: Collection[str] = (),
) -> list[HostCheck]:
    """Every host checked at once (at most ``max_parallel`` at a time), in the order given.
    ``tools``: what to look for on each host (by name), ``needs``: what of it the host must have;
    ``probe_kvm``: the KVM probe's result there (booted when the host's kernel, /dev/kvm or QEMU
    differ from its stored result's, in ``probe_cache``, by default ``ProbeCache()``; always with
    ``reprobe``), or only whether /dev/kvm exists; ``libvirt``: the libvirt URI that must connect
    for each host whose VMs use it; ``root``: the hosts where what the plan runs needs root."""
    if not hosts:
        return []
    required = libvirt or {}
    cache = probe_cache or ProbeCache()

    def one(host: Host) -> HostCheck:
        wanted, needed = tools.get(host.name, ()), needs.get(host.name, ())
        stored = cache if probe_kvm else None
        return check_host(
            host,
            wanted,
            needed,
            timeout_s,
            probe_kvm,
            required.get(host.name),
            stored,
            reprobe,
            needs_root=host.name in root,
        )

    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def check_host(
    host: Host,
    tools: Sequence[str],
    needs: Sequence[str],
    timeout_s: float,
    probe_kvm: bool = True,
    libvirt_uri: str | None = None,
    probe_cache: ProbeCache | None = None,
    reprobe: bool = False,
    needs_root: bool = False,
) -> HostCheck:
    """One host; ``libvirt_uri``: a libvirt there that must connect (without it, the host's own
    ``libvirt_uri`` is tried, and only warned about); ``probe_cache``: the KVM probe's stored
    results (None: boot it, keep nothing), ``reprobe``: boot it whatever is stored; ``needs_root``:
    a login that is not root fails it (else it is a warning)."""
    started = time.monotonic()
    looked_for = sorted({*BASE_TOOLS, *tools, *needs})
    cached_key = probe_cache.key(host) if probe_cache is not None and not reprobe else ""
    probe = (
        ["probe", *looked_for, "--", *probe_args(cached_key)] if probe_kvm else ["skip", *looked_for, "--"]
    )
    script = ["sh", "-c", CHECK_SCRIPT, "virtlab-check", *probe]
    if host.is_local:
        argv, options = script, None
    else:
        options = ssh_options(host)
        # No -n: the session's input carries the clock's questions. One string to the remote shell,
        # each element quoted (see environments/ssh.py).
        argv = ["ssh", *ssh_client_options(options), "-p", str(options.port), options.host]
        argv.append("exec " + shlex.join(script))
    try:
        session = _Session(argv, started + timeout_s)
    except OSError as error:
        problem = f"cannot start {argv[0]}: {error.strerror}; install the OpenSSH client (openssh-client)"
        return HostCheck(host, False, problems=(problem,), elapsed_s=time.monotonic() - started)
    try:
        head = session.read_until(_END)
        if head is None:
            status, stderr = session.finish()
            reason = _unreachable(status, stderr, session.timed_out, timeout_s, options)
            return HostCheck(host, False, problems=(reason,), elapsed_s=time.monotonic() - started)
        sections = parse_sections(head.decode(errors="replace"))
        facts = read_facts(sections, looked_for, host)
        if probe_cache is not None:
            facts.update(kept_probe(sections, facts, probe_cache, host))
        facts.update(_clock(session))
        session.finish()
    finally:
        session.close()
    uri = libvirt_uri or host.libvirt_uri
    connection = probe_libvirt(uri, LIBVIRT_TIMEOUT_S) if uri else None
    if connection is not None and not connection["connects"] and options is not None:
        connection["diagnosis"] = diagnose_libvirt(host, options, uri)
    facts["libvirt_connection"] = connection
    problems, warnings = verdict(
        facts, needs, libvirt_required=libvirt_uri is not None, needs_root=needs_root
    )
    return HostCheck(host, True, facts, problems, warnings, time.monotonic() - started)


def host_record(check: HostCheck) -> dict[str, Any]:
    """A host as a study's results record it: its entry (the path of its key, never the key), the
    facts its check read (None when it could not be reached) and why not."""
    return {**check.host.to_dict(), "facts": check.facts if check.reached else None,
            "problems": list(check.problems)}  # fmt: skip


def probe_libvirt(uri: str, timeout_s: float) -> dict[str, Any]:
    """Whether the libvirt at ``uri`` connects from here, as a study's VMs connect (the same call,
    host key checked strictly), with its hostname and version; a URI that would accept a host key
    unchecked is not tried. A connection that takes longer than ``timeout_s`` is left to its
    thread (libvirt cannot abandon one) and reported as no answer."""
    from virtlab.environments import EnvironmentError_
    from virtlab.environments.libvirt import daemon_facts
    from virtlab.hosts.libvirt_uri import uri_problem

    found: dict[str, Any] = {
        "uri": uri, "connects": False, "hostname": None, "daemon_version": None, "error": None
    }  # fmt: skip
    problem = uri_problem(uri)
    if problem is not None:
        return {**found, "error": problem}
    answer: dict[str, Any] = {}

    def attempt() -> None:
        try:
            facts = daemon_facts(uri)
        except EnvironmentError_ as error:
            answer["error"] = str(error)
            return
        answer.update(connects=True, hostname=facts["hostname"], daemon_version=facts["daemon_version"])

    thread = threading.Thread(target=attempt, name=f"libvirt-check-{uri}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return {**found, "error": f"no answer within {timeout_s:g} s"}
    return {**found, **answer}


# Run on the host by ``diagnose_libvirt``: what the far end of libvirt's SSH transport says when it
# connects to the daemon's socket there. With no input it ends at once, having connected or not.
_LIBVIRT_HELPER_SCRIPT = """if ! command -v virt-ssh-helper >/dev/null 2>&1; then
    echo 'virtlab: no virt-ssh-helper'
    exit 127
fi
exec virt-ssh-helper "$1" </dev/null 2>&1
"""
_SSH_TRANSPORTS = ("ssh", "libssh2", "libssh")
# virt-ssh-helper's words -> what is wrong with the host's libvirt, and what fixes it. In order.
_LIBVIRT_DIAGNOSES = (
    (("virtlab: no virt-ssh-helper",),
     "libvirt is not installed on {host} (no virt-ssh-helper on the PATH of {user} there)",
     "install libvirt there (apt-get install libvirt-daemon-system) and start libvirtd"),
    (("No such file or directory",),
     "no libvirtd runs on {host}: its socket is not there ({said})",
     "start libvirtd on {host} (and name it in virtlab_libvirt_uri); a test fleet's host runs "
     "one only when the fleet is started with --libvirt {host}"),
    (("Connection refused",),
     "libvirt on {host} refuses the connection: its socket is there but no libvirtd accepts on it, "
     "stopped or crashed ({said})",
     "restart libvirtd on {host}, then check it again"),
    (("Permission denied", "authentication", "not authorized", "access denied"),
     "libvirt on {host} refuses {user}: {said}",
     "log in to {host} as root (ansible_user=root), or let {user} use libvirt (the libvirt group)"),
)  # fmt: skip


def diagnose_libvirt(host: Host, options: Any, uri: str) -> dict[str, str] | None:
    """Why the libvirt at ``uri`` (on ``host``, reached with ``options``) did not connect, as
    the host itself says it: ``virt-ssh-helper``, what libvirt's SSH transport runs there, run over
    ssh and its words read (``_LIBVIRT_DIAGNOSES``); None when ``uri`` is not over SSH to that host
    or its words say nothing known (the daemon accepted: the fault is in libvirt's own SSH leg)."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme.partition("+")[2] not in _SSH_TRANSPORTS or parts.hostname != options.host.lower():
        return None
    script = ["sh", "-c", _LIBVIRT_HELPER_SCRIPT, "virtlab-libvirt", f"qemu://{parts.path or '/system'}"]
    argv = ["ssh", *ssh_client_options(options), "-n", "-p", str(options.port), options.host,
            "exec " + shlex.join(script)]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=LIBVIRT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    said = " ".join(done.stdout.split())[:300]
    if done.returncode == _SSH_FAILED:
        return None  # ssh itself failed: the host's own check says why
    names = {"host": host.name, "user": options.user, "said": said}
    for needles, problem, fix in _LIBVIRT_DIAGNOSES:
        if any(needle in said for needle in needles):
            return {"problem": problem.format(**names), "fix": fix.format(**names)}
    return None


_PRIVILEGES = {"root": "root", "sudo": "passwordless sudo", "password": "sudo asks for a password"}


def read_facts(sections: dict[str, str], looked_for: Sequence[str], host: Host) -> dict[str, Any]:
    """The check script's sections (before the clock) -> the host's facts."""
    described = describe_remote(sections)
    found = dict(line.split("=", 1) for line in sections.get("tools", "").splitlines() if "=" in line)
    numa = sections.get("numa", "").strip()
    return {
        "host_key": "not used (this machine)" if host.is_local else f"verified against {host.known_hosts}",
        "privilege": _PRIVILEGES.get(sections.get("privilege", ""), "none"),
        **{
            key: described[key]
            for key in (
                "hostname",
                "cpu_model",
                "cpu_flags",
                "cores",
                "memory_bytes",
                "kernel",
                "arch",
                "os",
                "clocksource",
                "governor",
            )
        },  # fmt: skip
        "virtualization": described["virtualization"],
        "numa_nodes": int(numa) if numa.isdigit() and int(numa) > 0 else None,
        **_kvm(sections),
        "runc": found.get("runc"),
        "libvirt": found.get("virsh"),
        "tools": {tool: found.get(tool) for tool in looked_for},
    }


def _kvm(sections: dict[str, str]) -> dict[str, Any]:
    """What the KVM probe found there (``kvm``, ``kvm_reason``, the probe), or, not probed, whether
    /dev/kvm exists."""
    if "kvm_device" not in sections:
        return {"kvm": "present, not probed" if sections.get("kvm") == "present" else "absent"}
    probe = read_probe(sections)
    return {"kvm": probe.kvm, "kvm_reason": probe.reason, "kvm_probe": probe.to_dict()}


KVM_FACTS = ("kvm", "kvm_reason", "kvm_probe")


def kept_probe(
    sections: dict[str, str], facts: dict[str, Any], cache: ProbeCache, host: Host
) -> dict[str, Any]:
    """The KVM facts of a check through the probe cache: a probe booted now is stored (unless its
    TCG control failed: a broken probe tells nothing to keep); one not booted, because the host's
    kernel, /dev/kvm and QEMU are those of its stored result, is that result, marked cached."""
    key = next(iter(sections.get("kvm_key", "").splitlines()), "")  # as the script compares it
    if "kvm_cached" not in sections:
        if key and facts.get("kvm_probe", {}).get("control_ok"):
            cache.store(host, key, {name: facts[name] for name in KVM_FACTS})
        return {}
    entry = cache.entry(host)
    if entry is None or entry["key"] != key:  # removed or rewritten meanwhile: not probed this time
        return {"kvm": "present, not probed" if sections.get("kvm") == "present" else "absent"}
    stored = entry["facts"]
    probe = {**stored["kvm_probe"], "cached": True}
    return {
        **stored,
        "kvm_probe": probe,
        "kvm_probed_at": entry["probed_at"],
        "kvm_probed_on": parse_key(key),
    }


def _clock(session: _Session) -> dict[str, Any]:
    """The remote clock against this one, from the round trip that was shortest."""
    best: tuple[int, float] | None = None
    for _ in range(CLOCK_ROUNDS):
        before = time.time_ns()
        session.write(b"\n")
        line = session.read_until(b"\n")
        after = time.time_ns()
        if line is None:
            break
        try:
            remote = float(line.decode().strip())
        except ValueError:
            break  # a date(1) without %N: no reading to trust
        offset = remote - (before + after) / 2e9
        if best is None or after - before < best[0]:
            best = (after - before, offset)
    if best is None:
        return {"clock_offset_s": None, "clock_uncertainty_s": None}
    return {"clock_offset_s": round(best[1], 6), "clock_uncertainty_s": round(best[0] / 2e9, 6)}


def verdict(
    facts: dict[str, Any], needs: Sequence[str], libvirt_required: bool = False, needs_root: bool = False
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A reached host's problems (it fails) and warnings, from its facts and what it ``needs``
    (``libvirt_required``: the plan's VMs use its libvirt, so it must connect; ``needs_root``: what
    the plan runs there needs root)."""
    problems, warnings = [], []
    missing = sorted(tool for tool in needs if not facts["tools"].get(tool))
    if missing:
        problems.append(
            f"missing what the plan runs there: {', '.join(missing)}; install it on that host "
            "(or place those environments elsewhere)"
        )
    connection = facts.get("libvirt_connection")
    if connection is not None and not connection["connects"]:
        diagnosis = connection.get("diagnosis")
        (problems if libvirt_required else warnings).append(
            f"its libvirt at {connection['uri']} does not connect: {diagnosis['problem']}; {diagnosis['fix']}"
            if diagnosis
            else f"its libvirt at {connection['uri']} does not connect: {connection['error']}; "
            "libvirtd must run there, with virt-ssh-helper (libvirt-daemon) or nc on its PATH, and "
            "each of its host keys must be in the known_hosts file (libvirt's SSH client may choose "
            "another key type than ssh does)"
        )
    if facts["privilege"] in ("none", _PRIVILEGES["password"]):
        said = "sudo asks for a password there" if facts["privilege"] != "none" else "no sudo there"
        (problems if needs_root else warnings).append(
            f"the user it logs in as is not root, and {said}: containers and Pods there "
            "need root, and virtlab never types a password; log in as root (ansible_user=root)"
        )
    offset, uncertainty = facts["clock_offset_s"], facts["clock_uncertainty_s"]
    if offset is None:
        warnings.append("its clock could not be read (date +%s.%N)")
    elif abs(offset) - uncertainty > CLOCK_TOLERANCE_S:
        warnings.append(
            f"its clock is {offset:+.3f} s off this machine's: timestamps of trials on different hosts "
            "disagree; run NTP (chrony) on both"
        )
    return tuple(problems), tuple(warnings)


def _unreachable(status: int | None, stderr: str, timed_out: bool, timeout_s: float, options: Any) -> str:
    if options is not None and (status == _SSH_FAILED or timed_out):
        diagnosis = diagnose_ssh(options, stderr)
        if diagnosis is not None:
            return f"{diagnosis[0]}; {diagnosis[1]}"
    if timed_out:
        return f"no answer within {timeout_s:g} s"
    last = stderr.strip().splitlines()[-1:] or ["(nothing said)"]
    return f"the check ended early (exit status {status}): {last[0][:300]}"


class _Session:
    """One check's process: its output read up to a marker against a deadline, its input written."""

    def __init__(self, argv: list[str], deadline: float) -> None:
        self.deadline = deadline
        self.timed_out = False
        self._buffer = b""
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )

    def read_until(self, marker: bytes) -> bytes | None:
        """What comes before ``marker``; None when the output ends or the deadline passes first."""
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        while marker not in self._buffer:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or not select.select([descriptor], [], [], remaining)[0]:
                self.timed_out = True
                return None
            chunk = os.read(descriptor, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        head, _, self._buffer = self._buffer.partition(marker)
        return head

    def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(data)
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the read that follows sees the end

    def finish(self) -> tuple[int | None, str]:
        """End the input (the clock loop ends), wait a moment, then the exit status and stderr."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        # A session that timed out gets a moment, one that answered the rest of its deadline.
        wait_s = 1.0 if self.timed_out else max(1.0, self.deadline - time.monotonic())
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self._kill()
        self._stderr.seek(0)
        return self.process.returncode, self._stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self._kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()

    def _kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


# --------------------------------------------------------------------------------- the table


def render(checks: Sequence[HostCheck], console: Console) -> None:
    table = Table(
        title="hosts",
        title_justify="left",
        caption="kvm: what the doctor's probe found there (works, emulation failure, emulated, "
        "fails, absent, no access; why below); clock: the host's minus this machine's, ms ± uncertainty",
        caption_justify="left",
    )
    for column in ("host", "result", "reached as", "privilege", "CPU", "memory", "NUMA", "kvm", "runc",
                   "libvirt", "tools", "clock"):  # fmt: skip
        table.add_column(column)
    for check in checks:
        result = "[green]ok[/green]" if check.ok else "[red]FAIL[/red]"
        if not check.reached:
            table.add_row(check.host.name, result, f"{check.host.target}: [red]unreachable[/red]", *[""] * 9)
            continue
        f = check.facts
        found = sum(1 for path in f["tools"].values() if path)
        table.add_row(
            check.host.name,
            result,
            check.host.target,
            {"passwordless sudo": "sudo"}.get(f["privilege"], f["privilege"]),
            f"{f['cores'] or '?'} × {f['cpu_model'] or '?'}",
            f"{f['memory_bytes'] / 2**30:.1f} GiB" if f["memory_bytes"] else "?",
            str(f["numa_nodes"] or "?"),
            f["kvm"],
            "yes" if f["runc"] else "no",
            _libvirt_text(f),
            f"{found}/{len(f['tools'])}",
            _offset_text(f["clock_offset_s"], f["clock_uncertainty_s"]),
        )
    console.print(table)
    for check in checks:
        connection = check.facts.get("libvirt_connection")
        if connection is not None and connection["connects"]:
            console.print(
                f"{check.host.name}: libvirt {connection['uri']} connects: libvirtd "
                f"{connection['daemon_version']} on {connection['hostname']}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        missing = [tool for tool, path in check.facts.get("tools", {}).items() if not path]
        if missing:
            console.print(f"{check.host.name}: not found: {', '.join(missing)}", highlight=False)
        for problem in check.problems:
            console.print(f"[red]{check.host.name}[/red]: {escape(problem)}", highlight=False)
        for warning in check.warnings:
            console.print(f"[yellow]{check.host.name}[/yellow]: {escape(warning)}", highlight=False)
        if check.facts.get("kvm_reason"):
            said = escape(f"{check.host.name}: KVM {check.facts['kvm']}: {check.facts['kvm_reason']}")
            console.print(said, highlight=False)


def _libvirt_text(facts: dict[str, Any]) -> str:
    """The libvirt column: whether its URI connects, else whether virsh is there at all."""
    connection = facts.get("libvirt_connection")
    if connection is not None:
        return "connects" if connection["connects"] else "[red]fails[/red]"
    return "virsh" if facts["libvirt"] else "no"


def _offset_text(offset: float | None, uncertainty: float | None) -> str:
    if offset is None or uncertainty is None:
        return "unknown"
    return f"{offset * 1000:+.1f} ± {uncertainty * 1000:.1f}"
