"""scp: one large file copied from the native side into each environment's own sshd, once per cipher
(seed 000 ch.8, Table 16), MB/s over the whole transfer and scp's own rate at 50% of it.

Who runs what (``served_by_cell``): the cell (the environment measured) runs the server, the peer
(default the study's baseline, the native side) the client, as the seed sent from the physical host
into each environment. The native cell itself is served over loopback (the seed's bare-metal
column was a second machine on a real wire; ``path`` says "loopback").

Server: a foreground sshd of virtlab's own, never the environment's system one nor its
configuration: ``sshd -D -e -f /dev/null`` listening on virtlab's address for the environment (port
``port``), with a host key and an ``authorized_keys`` that virtlab makes per study (ssh-keygen on
this host) and places in a directory of its own in the environment's working directory; public-key
authentication only (``restrict``ed key), ``PidFile=none``, and ``Ciphers`` set to the one cipher
measured, so that nothing else can be negotiated and a cipher the sshd does not know stops it at
once ("Bad SSH2 cipher spec"). The privilege separation directory (/run/sshd, a fresh tmpfs in a
container) is made first.

Client: ``scp -v -c CIPHER`` (``-O``: the original scp protocol, which the seed's scp spoke;
``protocol = "sftp"``: what scp speaks by default since OpenSSH 9.0) with ``-F /dev/null`` (no
user or system ssh configuration), compression off, strict host key checking against a
known_hosts holding only virtlab's host key for the server. The source file of ``size_mb`` MiB
holds incompressible bytes; it is written before scp starts, outside the timing, and scp sends it
to ``received.bin`` beside the server's keys (an absolute path: the runner tells the client the
server's working directory). Before anything runs, each side checks that its file fits where it goes
(a VM's root disk has about 1 GiB free unless the plan's ``disk_size_mb`` gives more). Everything
virtlab placed, the file sent and the file received are removed after every trial.

scp draws its progress meter only on a terminal: the ``scpmeter`` kernel runs scp on a
pseudo-terminal and relays every line scp draws there with the time it arrived. From them:

- ``overall_mbs`` = the file's bytes / the time from scp's first meter line (both ends open, the
  first data about to go) to scp's exit (the server acknowledged the last byte): the transfer
  alone, without connecting, key exchange and authentication (``connect_s``). scp's own final
  figure is the same quotient over its own clock (``meter_final_mbs``).
- ``at_50pct_mbs`` = the rate scp's meter shows on its first line at 50% or more (the seed's
  "rate at 50% of the transfer"). The meter redraws once a second and its rate is a moving average
  (9/10 of the previous figure plus 1/10 of the last second's), so it lags behind a rate that
  changes; ``interval_mbs`` beside it is the rate over the second before that line on virtlab's
  clock. A transfer shorter than a second or two has no such line (the meter jumps to 100%, whose
  figure is the overall average): the figure is then missing, and ``at_50pct_missing`` says why.

MB/s = 10^6 bytes per second, as every other virtlab workload counts; scp's meter counts MiB
(2^20), and its figures are converted.

A cipher that either side's OpenSSH does not offer (the seed's arcfour128: gone from today's) ends
the trial at once as "<cipher>: not offered by this OpenSSH (OpenSSH_x.y ...)", stored in the
``unavailable`` phase: the report shows that as the reason of the missing figure. The client side
asks ``ssh -Q cipher`` before anything is sent; the runner also says so before the study when the
client is this host.

A cipher sweep is several workloads in the plan, one ``cipher`` each, as dd's sizes are.
"""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, line_values, register_workload, timeout_follows
from virtlab.workloads._peer import MAX_PEERS, PairParams, PeerWorkload, Role, ServerPlace

if TYPE_CHECKING:
    from virtlab.environments._base import CommandResult

PORT = 15222
KERNEL = "scpmeter"
SOURCE, RECEIVED = "source.bin", "received.bin"
MIB = 2**20
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
# Slowest rate a trial is given time for by default: 3des-cbc in a TCG guest is that slow.
SLOWEST_MBS = 1.0
# sshd wrapper, run in the server's environment: "$1" is virtlab's directory there (the keys),
# the rest sshd's options. sshd wants an absolute path to re-execute itself and absolute paths for
# its keys; the version line goes first, for the report of a cipher it does not offer.
_SSHD = r"""sshd=$(command -v sshd || echo /usr/sbin/sshd)
cd -- "$1" || exit 125
shift
echo "sshd_version=$("$sshd" -V 2>&1 | grep -m 1 '^OpenSSH')" >&2
exec "$sshd" -D -e -f /dev/null -h "$PWD/host_key" -o "AuthorizedKeysFile=$PWD/authorized_keys" "$@"
"""
# sshd as root confines its pre-authentication child to this directory; a container's /run is a
# fresh tmpfs without it. An sshd that is not root needs none (and may not make one).
_PRIVSEP_DIR = 'mkdir -p /run/sshd 2>/dev/null || [ "$(id -u)" != 0 ]'
# The file sent or received must fit where it goes ("$1" MiB, "$2" which one): said before scp
# fills the disk half way (a guest's root disk has about 1 GiB free unless the plan gives more).
_SPACE = """need=$1 what=$2
set -- $(df -Pk . | tail -n 1)
[ $(($4 / 1024)) -ge "$need" ] && exit 0
echo "only $(($4 / 1024)) MiB free in $PWD for the $need MiB file $what" >&2
exit 1
"""

_METER = re.compile(
    r"(?<!\S)(?P<pct>\d{1,3})%\s+(?P<done>\d+)(?P<done_unit>[KMGTP]?)B?\s+"
    r"(?P<rate>\d+\.\d)(?P<rate_unit>[KMGTP])B/s"
)
_KEX = re.compile(r"kex: client->server cipher: (?P<cipher>\S+) MAC: (?P<mac>\S+) compression: (?P<comp>\S+)")
_CIPHER = r"^[A-Za-z0-9][A-Za-z0-9@.+_-]*$"


class ScpParams(PairParams):
    timeout_s: float = Field(
        default=60.0 + 64 * MIB / 1e6 / SLOWEST_MBS,
        gt=0,
        description=f"a trial running longer fails; unless given, 60 s plus the file at {SLOWEST_MBS:g} MB/s",
    )
    cipher: str = Field(
        default="aes128-ctr",
        pattern=_CIPHER,
        description="the one cipher of this workload (a sweep is several workloads); seed 000: 3des-cbc, "
        "aes128-ctr, aes128-cbc, arcfour128",
    )
    size_mb: int = Field(
        default=64, ge=1, le=64 * 1024, description="the file copied, MiB (seed 000: 1300, a DVD image)"
    )
    protocol: Literal["scp", "sftp"] = Field(
        default="scp",
        description='"scp": the original scp protocol (scp -O), as the seed; "sftp": what scp speaks '
        "by default since OpenSSH 9.0",
    )
    port: int = Field(
        default=PORT, ge=1024, le=65535 - MAX_PEERS, description="the sshd's port (plus the client's slot)"
    )

    @property
    def directory(self) -> str:
        """Where the received file goes in the cell: its working directory (the runner's space check
        before the study reads this, as it reads a disk workload's ``directory``)."""
        return "."

    @model_validator(mode="before")
    @classmethod
    def _timeout_follows_size(cls, data: Any) -> Any:
        return timeout_follows(cls, data, lambda v: v["size_mb"] * MIB / 1e6 / SLOWEST_MBS, 60.0)


@register_workload
class Scp(PeerWorkload):
    kind: ClassVar[str] = "scp"
    summary: ClassVar[str] = (
        "scp of a large file from the native side into the environment's own sshd, one cipher "
        "(seed 000 Table 16), MB/s overall and at 50% of the transfer"
    )
    Params: ClassVar[type[WorkloadParams]] = ScpParams
    kernels: ClassVar[tuple[str, ...]] = (KERNEL,)
    tools: ClassVar[tuple[str, ...]] = ("scp", "ssh", "sshd", "sh", "grep", "timeout")
    served_by_cell: ClassVar[bool] = True
    client_knows_server: ClassVar[bool] = True
    params: ScpParams

    @property
    def required_space_mb(self) -> int:
        """MiB the received file needs in the cell's working directory."""
        return self.params.size_mb

    # -- what goes where -------------------------------------------------------------
    @cached_property
    def _token(self) -> str:
        """Names this workload's directories: studies running at once never share one."""
        return secrets.token_hex(4)

    def directory(self, slot: int = 0) -> str:
        """virtlab's directory in either side's working directory, for one client's slot."""
        return f"virtlab-scp-{self._token}-{slot}"

    @cached_property
    def _keys(self) -> dict[str, bytes]:
        """A host key for the sshd and a key for the client, made once per study on this host."""
        keygen = shutil.which("ssh-keygen")
        if keygen is None:
            raise OSError("scp: ssh-keygen is not installed on this host: apt-get install openssh-client")
        keys = {}
        with tempfile.TemporaryDirectory(prefix="virtlab-scp-keys-") as tmp:
            for name in ("host_key", "id"):
                path = Path(tmp) / name
                argv = [keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"virtlab-scp-{name}", "-f", str(path)]
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
                if done.returncode != 0:
                    raise OSError(f"scp: ssh-keygen failed: {done.stderr.strip()}")
                keys[name], keys[f"{name}.pub"] = path.read_bytes(), path.with_suffix(".pub").read_bytes()
        return keys

    def _alias(self) -> str:
        return f"virtlab-scp-{self._token}"

    def files(self, role: Role, slot: int = 0) -> dict[str, bytes]:
        keys, where = self._keys, self.directory(slot)
        if role == "server":
            # restrict: no forwarding, no terminal; running scp -t / the sftp subsystem is all it does
            return {
                f"{where}/host_key": keys["host_key"],
                f"{where}/authorized_keys": b"restrict " + keys["id.pub"],
            }
        host_key = b" ".join(keys["host_key.pub"].split()[:2])
        return {
            f"{where}/id": keys["id"],
            f"{where}/known_hosts": self._alias().encode() + b" " + host_key + b"\n",
        }

    def setup_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        space = [
            "sh",
            "-c",
            _SPACE,
            "space",
            str(self.params.size_mb),
            "received" if role == "server" else "sent",
        ]
        return [["sh", "-c", _PRIVSEP_DIR], space] if role == "server" else [space]

    def cleanup_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        return [["rm", "-rf", "--", self.directory(slot)]]

    # -- the programs ------------------------------------------------------------------
    def server_commands(self, bin_dir: str, slot: int = 0, bind: str | None = None) -> list[list[str]]:
        p = self.params
        options = {
            "ListenAddress": bind or "127.0.0.1",
            "Ciphers": p.cipher,
            "PidFile": "none",  # never the system sshd's /run/sshd.pid
            "StrictModes": "no",  # virtlab's files may sit in a group-writable working directory
            "PubkeyAuthentication": "yes",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "PermitRootLogin": "prohibit-password",
            "Compression": "no",
            "Subsystem": "sftp internal-sftp",
        }
        argv = ["sh", "-c", _SSHD, "virtlab-sshd", self.directory(slot), "-p", str(self.ports(slot)[0])]
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        return [self.bounded(argv)]

    def own_first_port(self) -> int:
        return self.params.port

    def client_command(
        self, bin_dir: str, server_address: str, slot: int = 0, server: ServerPlace | None = None
    ) -> list[str]:
        p = self.params
        if server is None:
            raise ValueError("scp: the client needs the server's working directory (client_knows_server)")
        mine = self.directory(slot)
        target = f"{server.directory.rstrip('/')}/{mine}/{RECEIVED}"
        # The original protocol hands the path to the remote user's shell (scp -t PATH) unquoted.
        target = shlex.quote(target) if p.protocol == "scp" else target
        options = {
            "BatchMode": "yes",
            "IdentitiesOnly": "yes",
            "IdentityAgent": "none",
            "UserKnownHostsFile": f"{mine}/known_hosts",
            "GlobalKnownHostsFile": "/dev/null",
            "StrictHostKeyChecking": "yes",
            "HostKeyAlias": self._alias(),
            "Compression": "no",
        }
        scp = ["scp", "-v", "-O" if p.protocol == "scp" else "-s", "-F", "/dev/null", "-c", p.cipher,
               "-P", str(self.ports(slot)[0]), "-i", f"{mine}/id"]  # fmt: skip
        for key, value in options.items():
            scp += ["-o", f"{key}={value}"]
        scp += [f"{mine}/{SOURCE}", f"{server.user}@{server_address}:{target}"]
        kernel = [f"{bin_dir}/{KERNEL}", "-s", str(p.size_mb), "-f", f"{mine}/{SOURCE}", "-c", p.cipher]
        return [*kernel, "--", *scp]

    def not_listening(self, stdout: str, stderr: str) -> bool:
        return "Connection refused" in stdout or "Connection refused" in stderr

    # -- what it says --------------------------------------------------------------------
    def unavailable(self, client: CommandResult, servers: list[CommandResult]) -> str | None:
        cipher = self.params.cipher
        said = line_values(client.stdout)
        if said.get("offered") == "0":
            version = short_version(said.get("openssh"))
            return f"{cipher}: not offered by this OpenSSH ({version}, the client's)"
        for server in servers:
            if "Bad SSH2 cipher spec" in server.stderr:
                version = short_version(line_values(server.stderr).get("sshd_version"))
                return f"{cipher}: not offered by this OpenSSH ({version}, the server's sshd)"
        return None

    def notices(self) -> list[str]:
        cipher = self.params.cipher
        try:
            listed = subprocess.run(["ssh", "-Q", "cipher"], capture_output=True, text=True, timeout=30)
            version = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return []  # the study's own checks say what is missing
        if listed.returncode != 0 or cipher in listed.stdout.split():
            return []
        return [
            f"{cipher}: not offered by this host's OpenSSH ({short_version(version.stderr)}); its cells "
            "will be reported as not measured, with that reason"
        ]

    def parse(self, output: str) -> list[Sample]:
        p = self.params
        said = line_values(output)
        if said.get("offered") == "0":
            raise ParseError(f"scp: {p.cipher} is not offered by this OpenSSH")
        records = tty_records(output)
        meters = [(t, match) for t, text in records if (match := _METER.search(text))]
        if not meters:
            raise ParseError("scp: no progress meter in the output (was scp run on a terminal by scpmeter?)")
        if said.get("valid") != "1":
            raise ParseError(f"scp: the copy did not succeed (scp_status={said.get('scp_status')})")
        expected = p.size_mb * MIB
        size = _number(said, "source_bytes", int)
        if size != expected:
            raise ParseError(f"scp: the file sent has {size} bytes, the parameters say {expected}")
        last = meters[-1][1]
        if last["pct"] != "100":
            raise ParseError(f"scp: the meter ended at {last['pct']}%, not 100%")
        kex = next((m for _, text in records if (m := _KEX.search(text))), None)
        if kex is not None and kex["cipher"] != p.cipher:
            raise ParseError(f"scp: ssh negotiated {kex['cipher']}, the workload asked for {p.cipher}")
        started, wall = meters[0][0], _number(said, "wall_s")
        if wall <= started:
            raise ParseError(f"scp: wall_s={wall} does not follow the first meter line at {started} s")
        common = {
            "tool": "scp",
            "cipher": p.cipher,
            "protocol": p.protocol,
            "mac": kex["mac"] if kex else None,
            "compression": kex["comp"] if kex else None,
            "size_mb": p.size_mb,
            "openssh": said.get("openssh"),
        }
        overall = {
            **common,
            "bytes": size,
            "transfer_s": round(wall - started, 6),
            "connect_s": round(started, 6),
            "wall_s": wall,
            "meter_final_mbs": round(meter_rate(last), 3),
            "meter_lines": len(meters),
        }
        samples = [Sample("overall_mbs", size / (wall - started) / 1e6, "MB/s", "higher", overall)]
        half = halfway(meters)
        if isinstance(half, str):
            overall["at_50pct_missing"] = half
            return samples
        t, match, interval = half
        at = {**common, "meter_pct": int(match["pct"]), "meter_at_s": round(t - started, 3),
              "interval_mbs": interval}  # fmt: skip
        samples.append(Sample("at_50pct_mbs", meter_rate(match), "MB/s", "higher", at))
        return samples


def tty_records(output: str) -> list[tuple[float, str]]:
    """The records scp drew on its terminal, with the seconds since scp started."""
    records = []
    for line in output.splitlines():
        if line.startswith("tty="):
            stamp, _, text = line[4:].partition(" ")
            try:
                records.append((float(stamp), text))
            except ValueError:
                raise ParseError(f"scp: a terminal record without its time: {line[:80]!r}") from None
    return records


def meter_done(match: re.Match[str]) -> int:
    """A meter line's bytes sent so far, to its unit's precision."""
    return int(match["done"]) * UNITS[match["done_unit"]]


def meter_rate(match: re.Match[str]) -> float:
    """A meter line's rate in MB/s (10^6); scp counts in 2^10 steps."""
    return float(match["rate"]) * UNITS[match["rate_unit"]] / 1e6


def halfway(meters: list[tuple[float, re.Match[str]]]) -> tuple[float, re.Match[str], float | None] | str:
    """The first meter line at 50% or more short of the end, with the rate over the interval before
    it on virtlab's clock; or why there is none."""
    for index, (t, match) in enumerate(meters):
        pct = int(match["pct"])
        if pct >= 100:
            break
        if pct >= 50:
            interval = None
            if index and t > meters[index - 1][0]:
                t0, before = meters[index - 1]
                interval = round((meter_done(match) - meter_done(before)) / (t - t0) / 1e6, 3)
            return t, match, interval
    seconds = meters[-1][0] - meters[0][0]
    return (
        f"no meter line between 50% and 100%: the transfer took {seconds:.2f} s and scp redraws its "
        "meter once a second (a larger size_mb gives one)"
    )


def short_version(line: str | None) -> str:
    """``OpenSSH_9.2p1`` of ``OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 ...``."""
    first = (line or "").split()
    return first[0].rstrip(",") if first else "version unknown"


def _number(pairs: dict[str, str], key: str, kind: type = float) -> Any:
    try:
        return kind(pairs[key])
    except (KeyError, ValueError):
        raise ParseError(f"scp: no {key}= in the output (did scpmeter run?)") from None
