"""An existing machine reached over SSH: a Xen, ESXi or Hyper-V guest, a cloud instance, another host.

This is how platforms that cannot run here are measured for real. virtlab drives OpenSSH's own
``ssh`` and ``scp`` clients (argument lists, never a local shell) with key authentication and
strict host key checking against the plan's ``known_hosts``; every command of one environment
shares one connection (a ControlMaster socket in the environment's local workdir).

On the remote::

    <workdir>/            default <workdir_parent>/virtlab-<random> (/tmp, or a plan host's workdir),
                          created by provision (it must not exist:
                          teardown removes it, so virtlab refuses a directory it did not create)
    <workdir>/bin         the kernels, compiled there (build = "remote") or copied from this host
                          (build = "copy": only when the remote's CPU and libc match this host's)
    <workdir>/src         the kernels' C sources (build = "remote")
    <workdir>/run         one PID file per running command, so a timeout can kill it remotely

Commands run with ``<workdir>`` as their working directory; relative paths given to
``copy_in`` / ``copy_out`` are relative to it.

Why commands are safe to pass: the SSH protocol carries a command as one string that the
remote user's shell parses, so an argument list cannot be sent as such. Every element is quoted
with ``shlex.quote`` (``shlex.join``) and the remote shell's parsing turns the string back into
exactly that list: spaces, quotes, ``;``, ``$(...)``, globs arrive verbatim. No string from a plan
or a workload is ever pasted into a command unquoted. (The remote login shell must be a POSIX-like
one, which is what every sshd target virtlab measures has.)

A timeout or Ctrl-C kills the command on the remote too (its process group, by the PID file), not
only the local ``ssh``. A connection that breaks during a command raises ``EnvironmentError_``;
the next command reconnects. After a crash of virtlab the shared connection ends by itself after
``control_persist_s`` unused; the remote workdir stays (its path is in the manifest).
"""

from __future__ import annotations

import getpass
import ipaddress
import itertools
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import Field, field_validator

from virtlab.build import KernelBuild, compile_argv, kernel_sources, link_libs
from virtlab.environments._base import (
    BackgroundCommand,
    CommandResult,
    Environment,
    EnvironmentError_,
    EnvironmentOptions,
    HostScope,
    ProcessCommand,
    register_environment,
    split_sections,
)
from virtlab.environments._process import run_process
from virtlab.metadata import cpu_flags_summary

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")  # host names, IPv4/IPv6 addresses, user names
_PROGRAM = re.compile(r"^[A-Za-z0-9_./+-]+$")
_REMOTE_PATH = re.compile(r"^[A-Za-z0-9_./+,:@=-]+$")
# A unix socket path holds at most 107 bytes; ssh appends a random suffix while it binds.
_SOCKET_PATH_MAX = 80
# Provisioning steps (mkdir, scp, one compiler run) and teardown get this long beyond the connect.
_STEP_TIMEOUT_S = 300.0
_KILL_TIMEOUT_S = 20.0
_PARALLEL_COMPILES = 4
# ssh's own exit status for its errors; a remote command's 255 is told apart by ssh's messages.
_SSH_FAILED = 255

# Runs every command (``exec sh -c WRAPPER virtlab-run WORKDIR PIDFILE ARGV...``). sshd starts a
# session's shell as a session and process group leader, and ``exec`` keeps that PID for sh, so
# the PID written here is the process group of the command and of all it forks: a timeout kills
# it with ``kill -9 -PGID`` (closing the ssh channel alone would leave it running remotely).
_WRAPPER = """cd -- "$1" || exit 125
pidfile=$2
shift 2
echo $$ > "$pidfile"
"$@"
status=$?
rm -f -- "$pidfile"
exit $status
"""
# Waits a moment for a command that was only just starting to write its PID file. (``kill -9 -PGID``
# is the spelling that dash, busybox and bash all read as a process group; dash refuses ``--``.)
# Exit status 3: there was no PID file, nothing was killed.
_KILL = """i=0
while [ ! -s "$1" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
[ -s "$1" ] || exit 3
pgid=$(cat -- "$1")
kill -9 "-$pgid" 2>/dev/null || kill -9 "$pgid" 2>/dev/null
rm -f -- "$1"
"""
# Sends a signal (a number) to a background command's process group, leaving its PID file (exit
# status 3: no PID file yet).
_SIGNAL = """[ -s "$1" ] || exit 3
pgid=$(cat -- "$1")
kill "-$2" "-$pgid" 2>/dev/null || kill "-$2" "$pgid" 2>/dev/null
exit 0
"""
# What the remote looks like, in sections; every read may fail on an unusual system. Public for
# ``virtlab hosts check``, which reads the same facts (``describe_remote``) and a few more.
DESCRIBE_SCRIPT = """section() { printf '\\n== %s\\n' "$1"; }
section uname_m; uname -m
section uname_r; uname -r
section hostname; uname -n
section cores; getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null
section cpuinfo; cat /proc/cpuinfo 2>/dev/null
section meminfo; cat /proc/meminfo 2>/dev/null
section stat; head -n 1 /proc/stat 2>/dev/null
section clocksource; cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null
section governor; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null
section os; cat /etc/os-release 2>/dev/null
section virt_vm; command -v systemd-detect-virt >/dev/null 2>&1 && systemd-detect-virt --vm 2>/dev/null
section virt_container; command -v systemd-detect-virt >/dev/null 2>&1 && \
systemd-detect-virt --container 2>/dev/null
section product; cat /sys/class/dmi/id/product_name 2>/dev/null
section vendor; cat /sys/class/dmi/id/sys_vendor 2>/dev/null
"""
_PROBE = DESCRIBE_SCRIPT + "section end\n"
# DMI product or vendor names of common hypervisors, for remotes without systemd-detect-virt.
_DMI_HYPERVISORS = (
    ("VMware", "vmware"), ("VirtualBox", "oracle"), ("HVM domU", "xen"), ("Xen", "xen"),
    ("Virtual Machine", "microsoft"), ("Microsoft Corporation", "microsoft"), ("KVM", "kvm"),
    ("QEMU", "qemu"), ("Amazon EC2", "amazon"), ("Google Compute Engine", "google"),
    ("OpenStack", "kvm"), ("Bochs", "bochs"), ("Parallels", "parallels"),
)  # fmt: skip
# ssh's own messages -> what went wrong and what fixes it. Checked in order.
_DIAGNOSES = (
    (("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key for", "key mismatch"),
     "host key mismatch: the key {target} offers is not the one in {known_hosts}",
     "if the host was reinstalled, verify its new fingerprint out of band and replace its line "
     "in {known_hosts} (ssh-keygen -R, then ssh-keyscan -p {port} {host} >> {known_hosts})"),
    (("Host key verification failed", "No ED25519 host key is known", "host key is known for"),
     "host key not known: {known_hosts} has no key for {target} (strict host key checking)",
     "verify the host's fingerprint out of band, then: ssh-keyscan -p {port} {host} >> "
     "{known_hosts} (or set accept_new_host_key = true for a first contact you trust)"),
    (("Permission denied",),
     "permission denied: {target} does not accept the key {identity}",
     "add the public key ({identity}.pub) to ~{user}/.ssh/authorized_keys on the host"),
    (("closed by remote host", "Connection reset by", "Broken pipe", "Timeout, server",
      "client_loop: send disconnect"),
     "connection lost: the SSH connection to {target} broke",
     "check the host (rebooted, out of memory, network down?); the next command reconnects"),
    (("Connection refused", "Connection timed out", "No route to host", "Network is unreachable",
      "Could not resolve hostname", "Name or service not known", "Operation timed out",
      "Connection closed by", "kex_exchange_identification"),
     "host does not answer: no SSH service reachable at {target}",
     "check that the host is up, that sshd listens on port {port} and that {host} is the right "
     "address; connect_timeout_s bounds the wait"),
)  # fmt: skip


class SshOptions(EnvironmentOptions):
    host: str = Field(description="host name or address of the machine")
    port: int = Field(default=22, ge=1, le=65535, description="TCP port of its sshd")
    user: str = Field(default_factory=getpass.getuser, description="remote user (default: yours)")
    identity_file: Path | None = Field(
        default=None, description="private key to log in with; unset: ssh's default keys and agent"
    )
    known_hosts: Path = Field(
        default=Path("~/.ssh/known_hosts"),
        description="known_hosts file holding the host's key; the key is checked strictly",
    )
    accept_new_host_key: bool = Field(
        default=False,
        description="on first contact, trust and record a host key not yet in known_hosts "
        "(a changed key is refused all the same); default: unknown keys are refused",
    )
    connect_timeout_s: int = Field(default=10, ge=1, le=600, description="give up connecting after this")
    control_persist_s: int = Field(
        default=600,
        ge=10,
        description="the shared connection closes after this long unused (reopened when needed), "
        "so a crashed run leaves no ssh process for long",
    )
    workdir: str | None = Field(
        default=None,
        description="remote directory for the kernels and the commands, created at provision and "
        "removed at teardown (must not exist yet); default <workdir_parent>/virtlab-<random>",
    )
    workdir_parent: str = Field(
        default="/tmp",
        description="existing remote directory in which the default workdir is made "
        "(a host's workdir in the plan or inventory)",
    )
    test_address: str | None = Field(
        default=None,
        description="the IP address of its dedicated benchmark NIC: network workloads reach it there "
        "and its servers bind to it alone; default: host",
    )
    build: Literal["remote", "copy"] = Field(
        default="remote",
        description="remote: compile the C kernels there with its own compiler and -march=native; "
        "copy: copy this host's binaries (only when its CPU and libc match this host's)",
    )
    compiler: str = Field(default="cc", description="the remote's C compiler (build = remote)")
    ssh_config: Path | None = Field(
        default=None,
        description="an ssh_config file to read (ProxyJump, ciphers, ...); default: none, only the plan",
    )

    @field_validator("host", "user")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # Nothing that ssh could read as an option or expand as a %-token.
        if not _NAME.match(value) or value.startswith("-"):
            raise ValueError(f"{value!r} is not a plain name (letters, digits, '.', '-', '_', ':')")
        return value

    @field_validator("test_address")
    @classmethod
    def _ip_address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (a server binds to it)") from None

    @field_validator("compiler")
    @classmethod
    def _program(cls, value: str) -> str:
        if not _PROGRAM.match(value) or value.startswith("-"):
            raise ValueError(f"{value!r} is not a program name or path (e.g. cc, gcc-12, /usr/bin/clang)")
        return value

    @field_validator("workdir", "workdir_parent")
    @classmethod
    def _remote_dir(cls, value: str | None) -> str | None:
        return remote_directory(value)

    def expanded(self, path: Path) -> Path:
        return Path(os.path.expanduser(path))


@register_environment
class SshEnvironment(Environment):
    kind = "ssh"
    summary = (
        "an existing machine over SSH (key auth, strict host keys): a guest of Xen/ESXi/Hyper-V, a cloud host"
    )
    Options = SshOptions
    host_tools = {"ssh": "openssh-client", "scp": "openssh-client"}

    options: SshOptions

    # Set by _create, cleared by _delete.
    remote_dir: str = ""
    control_path: Path | None = None
    _socket_dir: Path | None = None
    _created_remote_dir: bool = False
    _facts: dict[str, Any] | None = None
    _runs: Iterator[int] = itertools.count(1)

    # -- checks before anything runs -------------------------------------------------------
    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        return None, "an SSH host's processes run on that host: virtlab has no process of it here"

    @classmethod
    def runs_elsewhere(cls, options: EnvironmentOptions) -> bool:
        return True

    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        assert isinstance(options, SshOptions)
        problems = [
            f"{tool} ({package}) is not installed on this host: apt-get install {package}"
            for tool, package in cls.host_tools.items()
            if shutil.which(tool) is None
        ]
        if options.identity_file is not None:
            key = options.expanded(options.identity_file)
            if not os.access(key, os.R_OK) or not key.is_file():
                problems.append(
                    f"identity_file {key} is not a readable file: give the private key that "
                    f"{options.user}@{options.host} accepts (ssh-keygen -t ed25519 makes one)"
                )
        known = options.expanded(options.known_hosts)
        if not options.accept_new_host_key and not (known.is_file() and os.access(known, os.R_OK)):
            problems.append(
                f"known_hosts {known} is not a readable file: verify the host's key fingerprint out of "
                f"band, then: ssh-keyscan -p {options.port} {options.host} >> {known}"
            )
        if options.ssh_config is not None and not options.expanded(options.ssh_config).is_file():
            problems.append(f"ssh_config {options.ssh_config} does not exist")
        # The tools a workload needs are on the remote: they are looked for at provision, not here.
        return problems

    @classmethod
    def remote_host_needs(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        assert isinstance(options, SshOptions)
        return [*tools, *([options.compiler] if options.build == "remote" else [])]

    # -- the environment ---------------------------------------------------------------------
    @property
    def bin_dir(self) -> str:
        return self.remote_bin

    @property
    def remote_bin(self) -> str:
        """Where the kernels are on the remote host."""
        return f"{self.remote_dir}/bin"

    @property
    def target(self) -> str:
        return ssh_target(self.options)

    def _create(self, kernels: KernelBuild) -> None:
        self._runs = itertools.count(1)
        self.remote_dir = (
            self.options.workdir or f"{self.options.workdir_parent}/virtlab-{os.urandom(4).hex()}"
        )
        try:
            connect_s = self._connect()
            self._make_remote_dir()
            if self.options.build == "copy":
                build = self._copy_kernels(kernels)
            else:
                build = self._build_remote(kernels)
            prepared = self._prepare()
            check = self._check_kernels()
            self._facts = {
                "connect_s": round(connect_s, 4),
                "exec_round_trip_s": round(check.elapsed_s, 4),
                **build,
                **prepared,
            }
            self._facts.update(self._probe())
        except BaseException:
            self._cleanup(quiet=True)
            raise

    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        pidfile = f"{self.remote_dir}/run/{next(self._runs)}.pid"
        wrapped = ["sh", "-c", _WRAPPER, "virtlab-run", self.remote_dir, pidfile, *argv]
        started = time.monotonic()
        process = subprocess.Popen(
            self._ssh_argv(wrapped),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        timed_out = False
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stdout, stderr = self._stop(process, pidfile)
        except BaseException:
            self._stop(process, pidfile)  # Ctrl-C: the remote command goes too
            raise
        result = CommandResult(
            tuple(argv), process.returncode, stdout, stderr, time.monotonic() - started, timed_out
        )
        self._check_connection(result)
        return result

    def _check_connection(self, result: CommandResult) -> None:
        """Raise EnvironmentError_ when a command's status 255 was ssh's: the connection broke."""
        if result.exit_code == _SSH_FAILED and not result.timed_out:
            # A multiplexed client says nothing when the connection drops (the master would, to
            # /dev/null); a master that is gone tells that from a command's own status 255.
            diagnosis = self._diagnose(result.stderr)
            if diagnosis is None and not self._master_alive():
                diagnosis = self._diagnose("closed by remote host")
            if diagnosis is not None:
                raise EnvironmentError_(f"ssh {self.target}: {diagnosis[0]} (during a command)", result.log())

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        pidfile = f"{self.remote_dir}/run/{next(self._runs)}.pid"
        wrapped = ["sh", "-c", _WRAPPER, "virtlab-run", self.remote_dir, pidfile, *argv]

        def send_signal(process: subprocess.Popen[bytes], sig: int) -> None:
            # The remote command first: the local ssh ends when it does (see _stop).
            self._signal_remote(pidfile, sig)
            if sig == signal.SIGKILL:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        return ProcessCommand(argv, self._ssh_argv(wrapped), send_signal, start_new_session=True)

    def network_address(self) -> str | None:
        """Its benchmark NIC's address where the plan gives one (``test_address``), else where ssh
        reaches it: the address network workloads use, and their servers bind to."""
        return self.options.test_address or self.options.host

    def _master_alive(self) -> bool:
        return run_process(self._ssh_argv(None, ("-O", "check")), _KILL_TIMEOUT_S).exit_code == 0

    def _stop(self, process: subprocess.Popen[str], pidfile: str) -> tuple[str, str]:
        """Kill a command on the remote and its local ssh; returns what it had printed.

        The remote side goes first: a multiplexed ssh hands its pipes to the master connection,
        which keeps them open until the remote command ends, killed local client or not."""
        self._kill_remote(pidfile)
        return self._end_client(process)

    def _end_client(self, process: subprocess.Popen[str]) -> tuple[str, str]:
        """Kill the local ssh of a command already killed on the remote; what it had printed."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            return process.communicate(timeout=_KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # The remote is unreachable: closing the master releases the pipes.
            run_process(self._ssh_argv(None, ("-O", "exit")), _KILL_TIMEOUT_S)
        try:
            return process.communicate(timeout=_KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for pipe in (process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
            return "", "(virtlab: the output was lost with the connection)"

    def _delete(self) -> None:
        self._cleanup(quiet=False)

    def copy_in(self, source: Path, destination: str) -> None:
        remote = self._remote_path(destination)
        self._scp([str(source), f"{self._scp_host()}:{remote}"], f"copying {source} to {remote}")

    def copy_out(self, source: str, destination: Path) -> None:
        remote = self._remote_path(source)
        # scp's SFTP mode (OpenSSH >= 9.0) passes the path to no shell, but expands wildcards in it.
        escaped = re.sub(r"([\\*?\[\]{}])", r"\\\1", remote)
        self._scp([f"{self._scp_host()}:{escaped}", str(destination)], f"copying {remote} to {destination}")

    def manifest(self) -> dict[str, Any]:
        facts = self._facts or {}
        first = ("host", "virtualization", "cpu_model", "cores", "memory_bytes", "kernel")
        return {
            **super().manifest(),
            "host_name": self.host_name,
            **{key: facts.get(key) for key in first},
            **{key: value for key, value in facts.items() if key not in first},
        }

    # -- provisioning steps ------------------------------------------------------------------
    def _connect(self) -> float:
        self.control_path = self._control_path()
        started = time.monotonic()
        # -f -N: ssh authenticates, then leaves a master in the background that holds the
        # connection for every later ssh/scp (ControlPersist closes it when unused).
        result = run_process(self._ssh_argv(None, ("-f", "-N")), self.options.connect_timeout_s + 30)
        if not result.ok:
            status = "timed out" if result.timed_out else f"exit status {result.exit_code}"
            message, fix = self._diagnose(result.stderr) or (
                f"connecting failed ({status})",
                "run the same ssh by hand (see the log) to see why",
            )
            raise EnvironmentError_(f"ssh {self.target}: {message}; {fix}", result.log())
        return time.monotonic() - started

    def _make_remote_dir(self) -> None:
        d = self.remote_dir
        result = self._remote(["sh", "-c", 'mkdir -m 700 -- "$1" && mkdir -- "$1/bin" "$1/src" "$1/run"',
                               "virtlab-mkdir", d])  # fmt: skip
        if not result.ok:
            if "exists" in result.stderr:
                raise EnvironmentError_(
                    f"ssh {self.target}: the remote workdir {d} already exists; virtlab removes its "
                    "workdir at teardown, so it uses only one it creates: remove it or choose another",
                    result.log(),
                )
            raise EnvironmentError_(f"ssh {self.target}: cannot create the remote workdir {d}", result.log())
        self._created_remote_dir = True

    def _build_remote(self, kernels: KernelBuild) -> dict[str, Any]:
        compiler = self.options.compiler
        version = self._remote([compiler, "--version"])
        if not version.ok:
            raise EnvironmentError_(
                f"ssh {self.target}: the remote has no working C compiler {compiler!r}, needed for "
                'build = "remote"; install one there (Debian/Ubuntu: apt-get install build-essential '
                'libgmp-dev libmpfr-dev), or set build = "copy" if its CPU and libc match this host\'s',
                version.log(),
            )
        sources = kernel_sources()
        staging = self.workdir / "src"
        staging.mkdir(parents=True, exist_ok=True)
        files = []
        for name, text in sorted(sources.items()):
            (staging / f"{name}.c").write_text(text)
            files.append(str(staging / f"{name}.c"))
        self._scp([*files, f"{self._scp_host()}:{self.remote_dir}/src/"], "copying the kernels' sources")
        # The same flags and libraries as the host's build, so both run the same program; a few
        # compilers at once, each a session of the one connection (sshd allows 10 by default).
        with ThreadPoolExecutor(max_workers=_PARALLEL_COMPILES) as pool:
            results = list(
                pool.map(lambda name: self._remote(self._compile_argv(name, kernels)), sorted(sources))
            )
        for name, done in zip(sorted(sources), results, strict=True):
            if not done.ok:
                libs = link_libs(name)
                hint = f" (it links {' '.join(libs)}: install those libraries' -dev packages)" if libs else ""
                raise EnvironmentError_(
                    f"ssh {self.target}: compiling kernel {name} on the remote failed{hint}", done.log()
                )
        # Java programs are bytecode: this host's jars run on any JRE there, nothing to compile.
        jars = [str(kernels.path(name)) for name in kernels.kernels if name.endswith(".jar")]
        if jars:
            self._scp(["-p", *jars, f"{self._scp_host()}:{self.remote_bin}/"], "copying the Java programs")
        return {
            "build": "remote",
            "compiler": compiler,
            "compiler_version": version.stdout.splitlines()[0] if version.stdout else None,
            "cflags": " ".join(kernels.cflags),
        }

    def _compile_argv(self, name: str, kernels: KernelBuild) -> list[str]:
        source, output = f"{self.remote_dir}/src/{name}.c", f"{self.remote_bin}/{name}"
        return compile_argv(self.options.compiler, name, source, output, kernels.cflags)

    def _copy_kernels(self, kernels: KernelBuild) -> dict[str, Any]:
        arch = self._remote(["uname", "-m"])
        remote_arch = arch.stdout.strip()
        if remote_arch != platform.machine():
            raise EnvironmentError_(
                f"ssh {self.target}: the remote is {remote_arch or 'of unknown architecture'}, this "
                f'host {platform.machine()}: its binaries cannot run there; use build = "remote"',
                arch.log(),
            )
        binaries = [str(kernels.path(name)) for name in kernels.kernels]
        self._scp(["-p", *binaries, f"{self._scp_host()}:{self.remote_bin}/"], "copying the kernels")
        return {
            "build": "copy",
            "compiler": kernels.compiler,
            "compiler_version": f"{kernels.compiler_version} (on the virtlab host, copied)",
            "cflags": " ".join(kernels.cflags),
        }

    def _prepare(self) -> dict[str, Any]:
        """What a kind built on this one sets up once the kernels are there, before they are
        checked the way commands run (a container on the host); its facts for the manifest."""
        return {}

    def _check_kernels(self) -> CommandResult:
        """Runs ``noop`` the way every command runs: proves the binaries execute there."""
        check = self._run([f"{self.bin_dir}/noop"], _STEP_TIMEOUT_S)
        if not check.ok or "ok=1" not in check.stdout:
            raise EnvironmentError_(
                f"ssh {self.target}: the kernels do not run on the remote; {self._kernels_fix()}", check.log()
            )
        return check

    def _kernels_fix(self) -> str:
        if self.options.build == "copy":
            return 'the host\'s binaries do not run there (CPU features or libc differ): use build = "remote"'
        return f"is {self.remote_dir} on a filesystem mounted noexec? choose another workdir"

    def _probe(self) -> dict[str, Any]:
        result = self._remote(["sh", "-c", _PROBE])
        if not result.ok:
            raise EnvironmentError_(
                f"ssh {self.target}: reading the remote's description failed", result.log()
            )
        return {
            "host": self.target,
            "workdir": self.remote_dir,
            **describe_remote(parse_sections(result.stdout)),
            "ssh_client": _ssh_version(),
        }

    # -- teardown ----------------------------------------------------------------------------
    def _cleanup(self, quiet: bool) -> None:
        problem = None
        if self._created_remote_dir:
            try:
                done = self._remote(["rm", "-rf", "--", self.remote_dir], _KILL_TIMEOUT_S)
                if not done.ok:
                    raise EnvironmentError_("rm failed", done.log())
                self._created_remote_dir = False
            except EnvironmentError_ as error:
                problem = EnvironmentError_(
                    f"ssh {self.target}: removing the remote workdir {self.remote_dir} failed", error.log
                )
        if self.control_path is not None:
            run_process(self._ssh_argv(None, ("-O", "exit")), _KILL_TIMEOUT_S)
            self.control_path.unlink(missing_ok=True)
            self.control_path = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        if problem is not None and not quiet:
            raise problem

    def _kill_remote(self, pidfile: str) -> bool:
        """SIGKILL to the process group whose PID ``pidfile`` holds, once it is written (a moment's
        wait); False when there was none."""
        done = run_process(self._ssh_argv(["sh", "-c", _KILL, "virtlab-kill", pidfile]), _KILL_TIMEOUT_S)
        return done.exit_code != 3

    def _signal_remote(self, pidfile: str, sig: int) -> bool:
        """``sig`` to the process group whose PID ``pidfile`` holds; False when there is none yet."""
        remote = ["sh", "-c", _SIGNAL, "virtlab-signal", pidfile, str(int(sig))]
        return run_process(self._ssh_argv(remote), _KILL_TIMEOUT_S).exit_code != 3

    # -- ssh and scp -------------------------------------------------------------------------
    def _common_options(self) -> list[str]:
        return ssh_client_options(self.options, self.control_path)

    def _ssh_argv(
        self, remote_argv: list[str] | None, extra: tuple[str, ...] = (), takes_input: bool = False
    ) -> list[str]:
        """``takes_input``: the remote command reads what is written to the local ssh's stdin."""
        argv = ["ssh", *self._common_options(), "-p", str(self.options.port), *extra]
        argv += (
            ["-n", self.options.host] if remote_argv is not None and not takes_input else [self.options.host]
        )
        if remote_argv is not None:
            # One string, because that is what the protocol carries; each element quoted, and
            # ``exec`` so that the command keeps the session leader's PID (see _WRAPPER).
            argv.append("exec " + shlex.join(remote_argv))
        return argv

    def _remote(self, argv: list[str], timeout_s: float = _STEP_TIMEOUT_S) -> CommandResult:
        """A provisioning command (no wrapper, no working directory); ssh failures raise."""
        result = run_process(self._ssh_argv(argv), timeout_s)
        diagnosis = self._diagnose(result.stderr) if result.exit_code == _SSH_FAILED else None
        if diagnosis is not None:
            raise EnvironmentError_(f"ssh {self.target}: {diagnosis[0]}; {diagnosis[1]}", result.log())
        return result

    def _scp(self, args: list[str], what: str) -> None:
        argv = ["scp", "-q", *self._common_options(), "-P", str(self.options.port), *args]
        result = run_process(argv, _STEP_TIMEOUT_S)
        if not result.ok:
            message, fix = self._diagnose(result.stderr) or (f"{what} failed", "see the log")
            raise EnvironmentError_(f"ssh {self.target}: {what}: {message}", result.log())

    def _scp_host(self) -> str:
        host = self.options.host
        return f"[{host}]" if ":" in host else host  # IPv6 literal

    def _remote_path(self, path: str) -> str:
        if not path:
            raise ValueError("an empty remote path")
        return path if path.startswith("/") else f"{self.remote_dir}/{path}"

    def _control_path(self) -> Path:
        path = self.workdir.resolve() / "ssh-control.sock"
        if len(str(path)) > _SOCKET_PATH_MAX:
            # A deep results directory: the socket goes to a private short directory instead.
            self._socket_dir = Path(tempfile.mkdtemp(prefix="virtlab-ssh-"))
            path = self._socket_dir / "control.sock"
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _diagnose(self, stderr: str) -> tuple[str, str] | None:
        return diagnose_ssh(self.options, stderr)


def remote_directory(value: str | None) -> str | None:
    """A remote directory an option names, normalised: absolute, not /, no '..', and plain: none of
    the shell's characters (``$``, quotes, spaces, ``;``...), since remote scripts and libvirt's
    pool definitions carry it (ValueError)."""
    if value is None:
        return None
    path = PurePosixPath(value)
    if not path.is_absolute() or path == PurePosixPath("/") or ".." in path.parts:
        raise ValueError(f"{value!r} must be an absolute remote directory (not /, no '..')")
    if not _REMOTE_PATH.match(value):
        raise ValueError(
            f"{value!r} is not a plain directory (letters, digits and / . _ - + , : @ = only: "
            "no shell characters)"
        )
    return str(path)


def ssh_target(options: SshOptions) -> str:
    return f"{options.user}@{options.host}:{options.port}"


def ssh_client_options(options: SshOptions, control_path: Path | None = None) -> list[str]:
    """The options of every ssh and scp that reaches the machine ``options`` names; with a
    ``control_path``, commands share one connection (a ControlMaster there), without, each
    connects alone and no master is left behind."""
    o = options
    strict = "accept-new" if o.accept_new_host_key else "yes"
    argv = [
        "-F", str(o.expanded(o.ssh_config)) if o.ssh_config else "none",
        "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={strict}",
        "-o", f"UserKnownHostsFile={o.expanded(o.known_hosts)}",
        # Only the plan's known_hosts vouches for the host.
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={o.connect_timeout_s}",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
    ]  # fmt: skip
    if control_path is not None:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_path}",
                 "-o", f"ControlPersist={o.control_persist_s}"]  # fmt: skip
    else:
        argv += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    argv += ["-o", "LogLevel=ERROR", "-o", f"User={o.user}"]
    if o.identity_file is not None:
        argv += ["-i", str(o.expanded(o.identity_file)), "-o", "IdentitiesOnly=yes"]
    return argv


def diagnose_ssh(options: SshOptions, stderr: str) -> tuple[str, str] | None:
    """What ssh's own messages in ``stderr`` say went wrong, and what fixes it; None: nothing known."""
    o = options
    names = {
        "target": ssh_target(o), "host": o.host, "port": o.port, "user": o.user,
        "known_hosts": o.expanded(o.known_hosts),
        "identity": o.expanded(o.identity_file) if o.identity_file else "(ssh's default keys)",
    }  # fmt: skip
    for needles, message, fix in _DIAGNOSES:
        if any(needle in stderr for needle in needles):
            return message.format(**names), fix.format(**names)
    return None


# --------------------------------------------------------------------------- the remote's description


def parse_sections(text: str) -> dict[str, str]:
    """``== name`` headed sections of the probe's output -> name: text."""
    return split_sections(text, "== ")


def describe_remote(s: dict[str, str]) -> dict[str, Any]:
    cpuinfo = _colon_values(s.get("cpuinfo", ""))
    meminfo = _colon_values(s.get("meminfo", ""))
    flags = cpuinfo.get("flags", "")
    memory = meminfo.get("MemTotal", "").split()
    steal_ticks, steal_pct = _steal(s.get("stat", ""))
    os_name = next(
        (
            line.split("=", 1)[1].strip("\"'")
            for line in s.get("os", "").splitlines()
            if line.startswith("PRETTY_NAME=")
        ),
        None,
    )
    return {
        "virtualization": _virtualization(s, "hypervisor" in flags.split()),
        "container": s.get("virt_container") or None,
        "cpu_model": cpuinfo.get("model name") or cpuinfo.get("Model") or cpuinfo.get("cpu") or None,
        "cpu_flags": cpu_flags_summary(flags),
        "cores": int(s["cores"]) if s.get("cores", "").isdigit() else None,
        "memory_bytes": int(memory[0]) * 1024 if memory and memory[0].isdigit() else None,
        "kernel": s.get("uname_r") or None,
        "arch": s.get("uname_m") or None,
        "os": os_name,
        "hostname": s.get("hostname") or None,
        "clocksource": s.get("clocksource") or None,
        "governor": s.get("governor") or "unavailable",
        "steal_ticks": steal_ticks,
        "steal_pct_since_boot": steal_pct,
    }


def _virtualization(s: dict[str, str], hypervisor_flag: bool) -> str:
    """What the remote believes it runs on: systemd-detect-virt, else DMI names, else the CPU flag."""
    detected = s.get("virt_vm", "").strip()
    if detected:
        return detected
    dmi = f"{s.get('product', '')} {s.get('vendor', '')}"
    for needle, name in _DMI_HYPERVISORS:
        if needle in dmi:
            return f"{name} (from DMI: {dmi.strip()})"
    return "unknown hypervisor (CPU hypervisor flag)" if hypervisor_flag else "none seen"


def _steal(stat_line: str) -> tuple[int | None, float | None]:
    """Steal time since boot from /proc/stat's ``cpu`` line: ticks, and percent of all ticks."""
    fields = stat_line.split()
    if len(fields) < 9 or fields[0] != "cpu":
        return None, None
    ticks = [int(v) for v in fields[1:9] if v.isdigit()]
    if len(ticks) < 8 or not sum(ticks):
        return None, None
    return ticks[7], round(100.0 * ticks[7] / sum(ticks), 4)


def _colon_values(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            values.setdefault(name.strip(), value.strip())
    return values


def _ssh_version() -> str | None:
    done = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).strip() or None


class RemoteNativeEnvironment(SshEnvironment):
    """``kind = "native"`` with ``host =`` a remote host of the plan: that machine itself, as its
    own baseline, driven exactly as the ssh kind drives a machine. Not registered: its kind is
    native, and the plan chooses this class when a native environment names a remote host."""

    kind = "native"
    summary = "a remote host of the plan itself, as its own baseline (plain processes over SSH)"
