"""``kind = "container"`` with ``host =`` a remote host of the plan: runc on that host, reached over
OpenSSH exactly as a native environment there is (the ssh kind's machinery: strict host keys, the
host's identity, known_hosts, port, user and workdir). Not registered: its kind is container, and
the plan chooses this class when a container names a remote host.

On the remote host::

    <workdir>/                   the ssh kind's remote workdir (virtlab-<random>), removed at teardown
        bin/                     the kernels, built there or copied (``build``), the container's
                                 /opt/virtlab/bin (read-only)
        scratch/                 the container's /mnt: a directory on the host's disk, the volume
                                 storage workloads write to
    <rootfs cache>/<key>/rootfs  the guest tree this machine builds (``virtlab.image``), shipped once
                                 per image key and kept: the read-only root of every container there
    /run/virtlab/...             the bundle and runc's state (``environments.runc``)

The rootfs cache is ``rootfs_cache``, by default ``<host workdir>/virtlab/rootfs`` when the host
names a workdir, else ``~/.cache/virtlab/rootfs`` of the remote user. It is content-addressed by the
image's key (a hash of everything that decides the tree). A tree is shipped (tar over the SSH
connection) into ``.partial-<key>_<owner>`` and renamed to ``<key>`` once whole, so a copy cut short
is never taken for a complete one; the partial copy of a killed run is removed by the next
container this machine provisions there.

The container is the local kind's: the same ``oci_config`` (with the open-files limit and swap
accounting of that host), the same runc steps (``environments.runc``), each command an argument
list over SSH. Networks: ``none`` (the default here: its own namespace, loopback only) and ``host``
(the host's namespace: its address is the host's, where peers on other hosts reach it). virtlab's
bridge exists only on this machine, so ``network = "bridge"`` is a plan error.

Teardown removes the container (``runc delete --force``), its cgroups and bundle, then the workdir,
whatever happened. A run killed before its teardown leaves them; the next container this machine
provisions on that host removes them: their owner record names this machine (its boot id) and the
owner's PID, which only this machine can judge.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import posixpath
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import Field, field_validator

from virtlab.cpulist import parse_cpu_list
from virtlab.environments import runc
from virtlab.environments._base import (
    BackgroundCommand,
    CommandResult,
    EnvironmentError_,
    EnvironmentOptions,
    HostScope,
    split_sections,
)
from virtlab.environments.container import (
    NETWORK_MODES,
    ContainerOptions,
    HostLimits,
    cpu_problems,
    describe_inside,
    guest_tool_problems,
    memory_problems,
    oci_config,
    probe_inside,
    scratch_relative,
)
from virtlab.environments.ssh import SshEnvironment, SshOptions, remote_directory
from virtlab.image import GUEST_BIN, GuestImage

PARTIAL = ".partial-"
_UNLIMITED = 2**64 - 1  # RLIM_INFINITY as runc reads it
# Output of a detached runc run to a file there, never the SSH channel: the container's init keeps
# it, and a session whose channel stays open never ends.
_TO_LOG = 'log=$1; shift; exec "$@" </dev/null >>"$log" 2>&1'
_WRITE = 'printf %s "$2" > "$1.tmp" && mv -f -- "$1.tmp" "$1"'
_NAMES = """cd -- "$1" 2>/dev/null || exit 0
for name in "$2"*; do { [ -e "$name" ] || [ -L "$name" ]; } && printf '%s\\n' "$name"; done
exit 0
"""
# Each readable file after a line "<marker><its index>"; an unreadable one has no such line.
_READ_ALL = """marker=$1; shift; i=0
for path in "$@"; do
  if [ -r "$path" ] && [ -f "$path" ]; then printf '\\n%s%d\\n' "$marker" $i; cat -- "$path"; fi
  i=$((i+1))
done
exit 0
"""
# Renames a whole shipped tree into place; another run that shipped the same key first wins.
_SETTLE = """if mv -T -- "$1" "$2" 2>/dev/null; then echo shipped
elif [ -d "$2/rootfs" ]; then rm -rf -- "$1"; echo found
else exit 1; fi
"""
# What of the host a container needs to know, in sections (one round trip).
_HOST_SCRIPT = """section() { printf '\\n== %s\\n' "$1"; }
section uid; id -u
section cache
cache=
if [ -n "$1" ]; then cache=$1; elif [ -n "$2" ]; then cache=$2/virtlab/rootfs
elif [ -n "$HOME" ] && [ "$HOME" != / ]; then cache=$HOME/.cache/virtlab/rootfs; fi
[ -n "$cache" ] && printf '%s\\n' "$cache"
section cached; [ -n "$cache" ] && [ -d "$cache/$3/rootfs" ] && echo yes
section partials
if [ -n "$cache" ]; then
  for p in "$cache"/.partial-*; do [ -e "$p" ] && printf '%s\\n' "${p##*/}"; done
fi
section nofile; ulimit -S -n; ulimit -H -n
section swap
if [ -e /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes ] || [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  echo yes
fi
section cpus; sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status
section memory_kib; sed -n 's/^MemTotal:[[:space:]]*\\([0-9]*\\).*/\\1/p' /proc/meminfo
section runc; runc --version 2>/dev/null | head -n 1
section end
"""


class RemoteContainerOptions(ContainerOptions, SshOptions):
    network: Literal["bridge", "none", "host"] = Field(
        default="none",
        description='on a remote host: "none" (the default: its own namespace, loopback only) or "host" '
        "(the host's network namespace: the host's address, reachable from other hosts); virtlab's "
        "bridge exists only on this machine",
    )
    rootfs_cache: str | None = Field(
        default=None,
        description="remote directory where the guest tree is shipped once per image and kept; default "
        "<host workdir>/virtlab/rootfs, or ~/.cache/virtlab/rootfs of the remote user",
    )

    @field_validator("network")
    @classmethod
    def _no_bridge_there(cls, value: str) -> str:
        if value == "bridge":
            raise ValueError("virtlab's bridge network exists only on this machine, not on a remote host")
        return value

    @field_validator("rootfs_cache")
    @classmethod
    def _cache_dir(cls, value: str | None) -> str | None:
        return remote_directory(value)


class RemoteContainerEnvironment(SshEnvironment):
    kind = "container"
    summary = "an OCI container run by runc on a remote host of the plan, over SSH"
    Options = RemoteContainerOptions
    remote_needs_root = True

    options: RemoteContainerOptions

    # Set by _prepare, cleared by _cleanup.
    container_id: str = ""
    bundle: str = ""
    scratch: str = ""
    init_pid: int | None = None
    """The container's init on the remote host (a PID there, not here)."""
    cgroup_paths: dict[str, str] | None = None
    image: GuestImage | None = None
    rootfs: str = ""
    _host: SshRuncHost | None = None
    _scratch_real: str = ""
    _execs: Iterator[int] = itertools.count(1)

    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        return None, "a container on a remote host runs there: virtlab has no process of it here"

    @classmethod
    def remote_host_needs(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        # The workload's tools come from the guest tree, not from the host.
        assert isinstance(options, RemoteContainerOptions)
        return ["runc", "tar", *([options.compiler] if options.build == "remote" else [])]

    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        problems = super().preflight(options, tools, image_packages)
        if shutil.which("tar") is None:
            problems.append(
                "tar is not installed on this host (it ships the guest tree): apt-get install tar"
            )
        return problems + guest_tool_problems(tools, image_packages)

    @property
    def bin_dir(self) -> str:
        return GUEST_BIN

    # -- provisioning (after the ssh kind's connection, workdir and kernels) ---------------------
    def _prepare(self) -> dict[str, Any]:
        self._host = host = SshRuncHost(self)
        self.image = self.build_guest_image()
        facts, limits = self._read_host(self.image.key)
        runc.cleanup_leftovers(host)
        shipping = self._ship_rootfs(self.image, facts["rootfs_cache"], facts.pop("rootfs_cached"))
        safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)[:40] or "c"
        suffix = secrets.token_hex(3)
        self.container_id = f"{runc.ID_PREFIX}{safe_name}-{suffix}"
        self.bundle = f"{runc.BUNDLES}/{self.container_id}"
        self.scratch, self._scratch_real = f"{self.remote_dir}/scratch", ""
        self._execs = itertools.count(1)  # names the exec pid files; next() is thread-safe
        runc.remove_at_exit(self, lambda: self._cleanup(quiet=True))
        host.make_dirs(self.bundle, self.scratch)
        self._write_owner()  # before runc runs: a crash from here on leaves a record
        config = oci_config(
            self.options, PurePosixPath(self.rootfs), PurePosixPath(self.remote_bin),
            PurePosixPath(self.scratch), f"{runc.CGROUP_PARENT}/{safe_name}-{suffix}",
            hostname=safe_name[:63], limits=limits,
        )  # fmt: skip
        host.write_text(f"{self.bundle}/config.json", json.dumps(config, indent=1) + "\n")
        self.init_pid, self.cgroup_paths = runc.start_container(host, self.bundle, self.container_id)
        self._write_owner()
        return {**facts, **shipping}

    def _read_host(self, image_key: str) -> tuple[dict[str, Any], HostLimits]:
        """The host's facts a container needs, where its rootfs cache is and whether it holds the
        tree of ``image_key``; refuses a host where a container cannot run as asked."""
        o = self.options
        # the host's workdir (or the environment's own) when one is given, not the default /tmp
        workdir = o.workdir_parent if "workdir_parent" in o.model_fields_set else ""
        done = self._remote(
            ["sh", "-c", _HOST_SCRIPT, "virtlab-host", o.rootfs_cache or "", workdir, image_key]
        )
        sections = split_sections(done.stdout, "== ")
        if not done.ok or "end" not in sections:
            raise EnvironmentError_(
                f"ssh {self.target}: reading what the host offers a container failed", done.log()
            )
        if sections.get("uid") != "0":
            raise EnvironmentError_(
                f"ssh {self.target}: containers need root there (runc with cgroup limits and namespaces); "
                'log in as root (user = "root" on the host)',
                done.log(),
            )
        if not sections.get("runc"):
            raise EnvironmentError_(f"ssh {self.target}: runc is not installed there: apt-get install runc")
        memory_kib = sections.get("memory_kib", "")
        problems = cpu_problems(self.options.cpus, list(parse_cpu_list(sections.get("cpus", ""))))
        problems += memory_problems(
            self.options.memory_mb, int(memory_kib) * 1024 if memory_kib.isdigit() else None
        )
        if problems:
            raise EnvironmentError_(f"ssh {self.target}: {problems[0]}", done.log())
        nofile = [
            _UNLIMITED if v == "unlimited" else int(v) if v.isdigit() else None
            for v in sections.get("nofile", "").split()
        ]
        if len(nofile) != 2 or None in nofile:
            raise EnvironmentError_(f"ssh {self.target}: the open-files limit there is not known", done.log())
        limits = HostLimits((nofile[0], nofile[1]), sections.get("swap") == "yes")
        cache = sections.get("cache", "")
        if not cache.startswith("/"):
            raise EnvironmentError_(
                f"ssh {self.target}: the remote user has no home directory for the guest tree's cache; "
                "give the host a workdir, or rootfs_cache = DIR",
                done.log(),
            )
        self._sweep_partials(cache, sections.get("partials", "").split())
        facts = {
            "runc_version": sections["runc"],
            "rootfs_cache": cache,
            "rootfs_cached": bool(sections.get("cached")),
        }
        return facts, limits

    def _ship_rootfs(self, image: GuestImage, cache: str, cached: bool) -> dict[str, Any]:
        """The guest tree in the host's cache, shipped there unless an earlier run did (``cached``)."""
        assert self._host is not None
        final = f"{cache}/{image.key}"
        self.rootfs = f"{final}/rootfs"
        facts = {"rootfs": self.rootfs, "rootfs_bytes": image.size_bytes}
        if cached:
            return {**facts, "rootfs_shipped": False, "rootfs_ship_s": None}
        self._host.make_dirs(cache)
        partial = f"{cache}/{PARTIAL}{image.key}_{owner_tag()}"
        self._host.make_dirs(partial)
        self.say(f"shipping the guest tree ({image.size_bytes / 2**20:.0f} MiB) to {self.target}")
        started = time.monotonic()
        try:
            self._send_tree(image.rootfs.parent, image.rootfs.name, partial, image.size_bytes)
            settled = self._remote(["sh", "-c", _SETTLE, "virtlab-settle", partial, final])
        except BaseException:
            with contextlib.suppress(EnvironmentError_):  # a lost host keeps it: the next sweep removes it
                self._host.remove_trees(partial)
            raise
        if not settled.ok:
            self._host.remove_trees(partial)
            raise EnvironmentError_(
                f"ssh {self.target}: the shipped tree could not be renamed to {final}", settled.log()
            )
        shipped = settled.stdout.strip() == "shipped"
        return {**facts, "rootfs_shipped": shipped, "rootfs_ship_s": round(time.monotonic() - started, 3)}

    def _sweep_partials(self, cache: str, names: list[str]) -> None:
        """Remove the partial copies among ``names`` in ``cache`` that a run of this machine left
        when it was killed while shipping (a partial copy of a live run, or of another machine's, stays)."""
        assert self._host is not None
        dead = [
            f"{cache}/{name}"
            for name in names
            if (record := owner_from_tag(name)) is not None and runc.owner_gone(record, local=False)
        ]
        if dead:
            self._host.remove_trees(*dead)

    def _send_tree(self, parent: Path, name: str, destination: str, size_bytes: int) -> None:
        """``parent/name`` into ``destination`` there: tar here, piped into tar there over SSH."""
        unpack = ["tar", "-C", destination, "--numeric-owner", "-xf", "-"]
        send_tar(self, ["tar", "-C", str(parent), "--numeric-owner", "-cf", "-", name], unpack, size_bytes,
                 "shipping the guest tree")  # fmt: skip

    def _write_owner(self) -> None:
        assert self._host is not None
        record = runc.owner_record(
            self.container_id, self.cgroup_paths, scratch=self.scratch, workdir=self.remote_dir
        )
        runc.write_owner(self._host, self.bundle, record)

    def _resolved(self, path: str) -> str:
        done = self._remote(["readlink", "-f", "--", path])
        return done.stdout.strip() if done.ok else ""

    def _kernels_fix(self) -> str:
        if self.options.build == "remote":
            return (
                "the kernels built on the host do not run in the guest's userland (the host's libraries "
                'are newer?): use build = "copy", this machine\'s binaries for the same guest tree'
            )
        return super()._kernels_fix()

    # -- commands -------------------------------------------------------------------------------
    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        assert self._host is not None
        pid_file = f"{self.bundle}/exec-{next(self._execs)}.pid"
        result = runc.exec_in(self._host, self.container_id, pid_file, argv, timeout_s)
        self._check_connection(result)
        if not result.ok and not result.timed_out and not runc.running(self._host, self.container_id):
            raise EnvironmentError_(
                f"container {self.container_id} on {self.target} is not running any more", result.log()
            )
        return result

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        assert self._host is not None
        pid_file = f"{self.bundle}/exec-{next(self._execs)}.pid"
        return runc.exec_in_background(self._host, self.container_id, pid_file, argv)

    def network_address(self) -> str | None:
        return self.options.host if self.options.network == "host" else None

    def _remote_path(self, path: str) -> str:
        """Where ``path`` inside (absolute, or relative to /mnt) is on the host: only the scratch
        directory is reachable, and a symbolic link made inside must not lead out of it."""
        if not self.scratch:
            raise RuntimeError(f"environment {self.name!r} copies files before provision()")
        there = posixpath.normpath(f"{self.scratch}/{scratch_relative(path)}")
        self._scratch_real = self._scratch_real or self._resolved(self.scratch)
        real = self._resolved(there)
        if not real or (real != self._scratch_real and not real.startswith(self._scratch_real + "/")):
            raise ValueError(f"{path} leads outside /mnt (a symbolic link)")
        return there

    # -- description ------------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        facts = dict(self._facts or {})
        o = self.options
        inside = describe_inside(
            probe_inside(self, self.container_id),
            {
                "kind": self.kind,
                "provision_s": self.provision_s,
                "network": f"{NETWORK_MODES[o.network]} (on {self.host_name or self.target})",
                "network_mode": o.network,
                "address": self.network_address(),
                "storage": f"root: guest image tree shipped to the host ({self.rootfs}), read-only bind (no "
                f"overlay); /mnt: a directory on the host's disk ({self.scratch}), the host's page cache",
                "runtime": facts.pop("runc_version", None),
                "image_key": self.image.key if self.image else None,
                "container_id": self.container_id,
            },
        )
        placed = {key: facts.pop(key, None) for key in ("host", "hostname")}
        return {
            **inside,
            "host_name": self.host_name,
            **placed,
            "host_facts": facts,
            **self.image_packages_manifest(),
        }

    # -- teardown ---------------------------------------------------------------------------------
    def _cleanup(self, quiet: bool) -> None:
        problem = None
        if self.container_id and self._host is not None:
            try:
                runc.remove_container(self._host, self.container_id, self.cgroup_paths or {}, self.bundle)
                self.container_id = ""
            except EnvironmentError_ as error:
                problem = EnvironmentError_(
                    f"ssh {self.target}: removing container {self.container_id} failed: {error}", error.log
                )
            runc.removed(self)
            self.init_pid = None
        try:
            super()._cleanup(quiet)
        finally:
            if problem is not None and not quiet:
                raise problem


class SshRuncHost(runc.RuncHost):
    """The remote host of a container: each runc call and file operation one command over the
    environment's SSH connection (an argument list, quoted for the remote shell with shlex)."""

    is_local = False

    def __init__(self, environment: SshEnvironment) -> None:
        self.environment = environment

    def call(self, argv: list[str], timeout_s: float, log: str | None = None) -> CommandResult:
        if log is not None:
            argv = ["sh", "-c", _TO_LOG, "virtlab-log", log, *argv]
        return self.environment._remote(argv, timeout_s)

    def command(self, argv: list[str]) -> tuple[list[str], dict[str, Any]]:
        return self.environment._ssh_argv(argv), {"start_new_session": True}

    def signal_leader(self, pid_file: str, sig: int, waiting: subprocess.Popen[Any] | None = None) -> bool:
        if waiting is not None and sig == signal.SIGKILL:
            return self.environment._kill_remote(pid_file)  # waits a moment for the file there
        return self.environment._signal_remote(pid_file, sig)

    def finish(self, process: subprocess.Popen[str]) -> tuple[str, str]:
        return self.environment._end_client(process)

    def read_text(self, path: str) -> str | None:
        done = self.environment._remote(["cat", "--", path])
        return done.stdout if done.ok else None

    def read_texts(self, paths: list[str]) -> list[str | None]:
        if not paths:
            return []
        marker = f"== virtlab-{secrets.token_hex(8)} "
        done = self._must(["sh", "-c", _READ_ALL, "virtlab-read", marker, *paths], "reading files")
        sections = split_sections(done.stdout, marker)
        return [sections.get(str(i)) for i in range(len(paths))]

    def write_text(self, path: str, text: str) -> None:
        self._must(["sh", "-c", _WRITE, "virtlab-write", path, text], f"writing {path}")

    def exists(self, path: str) -> bool:
        return self.environment._remote(["sh", "-c", '[ -e "$1" ] || [ -L "$1" ]', "virtlab-exists", path]).ok

    def names(self, directory: str, prefix: str) -> list[str]:
        done = self._must(["sh", "-c", _NAMES, "virtlab-names", directory, prefix], f"listing {directory}")
        return sorted(done.stdout.splitlines())

    def make_dirs(self, *paths: str) -> None:
        self._must(["mkdir", "-p", "--", *paths], f"creating {', '.join(paths)}")

    def remove_trees(self, *paths: str) -> None:
        self._must(["rm", "-rf", "--", *paths], f"removing {', '.join(paths)}")

    def remove_empty_dirs(self, *paths: str) -> None:
        self.environment._remote(["rmdir", "--", *paths])  # one not empty (or gone) stays as it is

    def _must(self, argv: list[str], what: str) -> CommandResult:
        done = self.environment._remote(argv)
        if not done.ok:
            raise EnvironmentError_(f"ssh {self.environment.target}: {what} failed", done.log())
        return done


def send_tar(
    environment: SshEnvironment, pack_argv: list[str], remote_argv: list[str], size_bytes: int, what: str
) -> CommandResult:
    """``pack_argv`` (a tar here) piped into ``remote_argv`` there over the environment's SSH
    connection (tar unpacking, ``podman import``); EnvironmentError_ when either side fails."""
    timeout_s = 300 + size_bytes / 10e6  # at least 10 MB/s
    receive = environment._ssh_argv(remote_argv, takes_input=True)
    with tempfile.TemporaryFile() as tar_errors:
        pack = subprocess.Popen(
            pack_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=tar_errors,
            start_new_session=True,
        )  # fmt: skip
        assert pack.stdout is not None
        try:
            ssh = subprocess.Popen(
                receive, stdin=pack.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, errors="replace", start_new_session=True,
            )  # fmt: skip
        finally:
            pack.stdout.close()  # ssh holds it now: tar sees a broken pipe if ssh ends early
        started = time.monotonic()
        try:
            out, err = ssh.communicate(timeout=timeout_s)
            pack.wait(timeout=60)
        except BaseException as error:
            for process in (pack, ssh):
                _kill_group(process)
                process.wait()
            if isinstance(error, subprocess.TimeoutExpired):
                raise EnvironmentError_(
                    f"ssh {environment.target}: {what} took longer than {timeout_s:.0f} s"
                ) from None
            raise
        tar_errors.seek(0)
        packed_errors = tar_errors.read().decode(errors="replace")
    result = CommandResult(tuple(receive), ssh.returncode, out, err, time.monotonic() - started)
    if pack.returncode != 0 or not result.ok:
        environment._check_connection(result)
        raise EnvironmentError_(
            f"ssh {environment.target}: {what} failed (tar here: exit {pack.returncode}, "
            f"there: exit {ssh.returncode})",
            f"--- tar here ---\n{packed_errors[-4000:]}\n{result.log()}",
        )
    return result


def owner_tag() -> str:
    """This process as a partial copy's name holds it: ``<boot id>_<pid>_<start time>``."""
    record = runc.owner_record("", None)
    return f"{record['owner_machine']}_{record['owner_pid']}_{record['owner_start']}"


def owner_from_tag(name: str) -> dict[str, Any] | None:
    """The owner a partial copy's name records (``owner_tag``), or None when it names none."""
    parts = name.rsplit("_", 3)
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    return {"owner_machine": parts[1], "owner_pid": int(parts[2]), "owner_start": int(parts[3])}


def _kill_group(process: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # a session of its own: its group is its PID
    except (ProcessLookupError, PermissionError):
        pass
