"""The KVM probe on a host, over the SSH session of ``virtlab hosts check``: what ``virtlab doctor``
finds here (``virtlab.accel``), found there.

Opening /dev/kvm proves nothing (nested hosts open it, then stop every guest with "emulation
failure"), so the host boots the doctor's own 512-byte boot sector under KVM and, as the control,
under TCG, with its QEMU. Nothing is installed there: the boot sector travels as an argument
(``printf`` octal escapes), QEMU's command is the doctor's (``accel.boot_sector_argv``) and the
shell script below runs both at once, each bounded, and answers in sections:

    kvm_key             the kernel (uname -srv), the boot id, the device's state, QEMU's path and version
    kvm_cached          "yes" when the key is the stored result's: nothing below follows
    kvm_device          ok | absent | denied (opening /dev/kvm read-write, as QEMU does)
    kvm_qemu            QEMU's path and version line, or nothing
    kvm_<accel>         started=, ended= (date +%s.%N), status= (QEMU's, or killed), timed_out=
    kvm_<accel>_serial  the serial port's lines, each after the time it was read (there, not here)
    kvm_<accel>_stderr  the tail of QEMU's standard error

A KVM guest that hits an internal error is paused by QEMU, not ended: the script ends it once the
register dump is out, as the doctor does. ``read_probe`` turns the sections into the doctor's
``GuestRun``s and its verdict (``accel.decide``), so both say the same of the same host.
"""

from __future__ import annotations

from dataclasses import replace

from virtlab import accel
from virtlab.accel import AccelProbe, GuestRun, QemuOutput

PROBE_TIMEOUT_S = 20.0
"""Each QEMU run's bound (KVM and TCG run side by side), as the doctor's."""
IMAGE = "probe.img"

# $1 the boot sector (octal escapes for printf), $2 the bound (s), $3 the key of the host's stored
# result ("" for none), then QEMU's argv without -accel. Everything happens in a private temporary
# directory, removed at the end.
PROBE_SCRIPT = r"""probe_kvm() {
    sector=$1 limit=$2 cached=$3
    shift 3
    if [ ! -e /dev/kvm ]; then device=absent
    elif (: <>/dev/kvm) 2>/dev/null; then device=ok
    else device=denied; fi
    qemu=$(command -v "$1" 2>/dev/null) && version=$("$qemu" --version 2>/dev/null | head -n 1)
    # what the result depends on (hosts.probecache): the same as the stored result's, no boot
    key="$(uname -srv) | $(cat /proc/sys/kernel/random/boot_id 2>/dev/null) | $device | $qemu | $version"
    section kvm_key; echo "$key"
    [ -n "$cached" ] && [ "$key" = "$cached" ] && { section kvm_cached; echo yes; return 0; }
    section kvm_device; echo "$device"
    section kvm_qemu
    [ -n "$qemu" ] || return 0
    echo "$qemu"
    echo "$version"
    dir=$(mktemp -d "${TMPDIR:-/tmp}/virtlab-kvm-probe.XXXXXX") || return 0
    printf "$sector" >"$dir/probe.img"
    accelerators=tcg
    [ "$device" = ok ] && accelerators="tcg kvm"
    for accel in $accelerators; do probe_run "$accel" "$dir" "$limit" "$@" & done
    wait
    for accel in $accelerators; do
        section "kvm_$accel"; cat "$dir/$accel.result"
        section "kvm_${accel}_serial"; cat "$dir/$accel.serial"
        section "kvm_${accel}_stderr"; head -c 65536 "$dir/$accel.err"
    done
    rm -rf -- "$dir"
}
probe_run() {
    accel=$1 dir=$2 limit=$3
    shift 3
    out=$dir/$accel
    # each run its own image: QEMU locks the one it boots
    mkdir "$out" && cp "$dir/probe.img" "$out/" && mkfifo "$out.fifo" && : >"$out.err" && : >"$out.serial" ||
        return 0
    started=$(date +%s.%N)
    # sh execs QEMU, so the pid it writes is QEMU's; the subshell keeps QEMU's status.
    (cd "$out" && sh -c 'echo $$ >"$0"; exec "$@"' "$out.pid" "$@" -accel "$accel"
     echo $? >"$out.status") </dev/null >"$out.fifo" 2>"$out.err" &
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done <"$out.fifo" >"$out.serial" &
    ticks=0 last=$((limit * 10)) erred=0 killed=0
    while [ $ticks -lt $last ] && [ ! -s "$out.status" ]; do
        if [ $erred = 0 ] && grep -q 'KVM internal error' "$out.err"; then
            # QEMU pauses the guest: a second at most for the register dump, ending with its code
            erred=1 last=$((ticks + 10))
        fi
        [ $erred = 1 ] && grep -q '^Code=' "$out.err" && { sleep 0.1; break; }
        # the boot sector's last line: QEMU ends by itself, or is ended a second later
        grep -q ' VLPROBE done' "$out.serial" && [ $last -gt $((ticks + 10)) ] && last=$((ticks + 10))
        sleep 0.1
        ticks=$((ticks + 1))
    done
    timed_out=0
    if [ ! -s "$out.status" ]; then
        [ $erred = 0 ] && ! grep -q ' VLPROBE done' "$out.serial" && timed_out=1
        kill -9 "$(cat "$out.pid" 2>/dev/null)" 2>/dev/null && killed=1
    fi
    wait
    ended=$(date +%s.%N)
    status=$(cat "$out.status" 2>/dev/null)
    [ $killed = 1 ] && status=killed
    printf 'started=%s\nended=%s\nstatus=%s\ntimed_out=%s\n' "$started" "$ended" "$status" "$timed_out" \
        >"$out.result"
}
"""


def probe_args(cached_key: str = "", timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """``probe_kvm``'s arguments: the boot sector, the bound, the stored result's key (the probe is
    not booted when the host's is the same), QEMU's command."""
    sector = "".join(f"\\{byte:03o}" for byte in accel.BOOT_SECTOR)
    return [sector, str(int(timeout_s)), cached_key, *accel.boot_sector_argv(accel.QEMU, IMAGE)]


def read_probe(sections: dict[str, str]) -> AccelProbe:
    """The probe's sections (see the module doc) -> the doctor's verdict on that host."""
    qemu = sections.get("kvm_qemu", "").splitlines()
    if not qemu:
        return accel.no_qemu()
    version = qemu[1] if len(qemu) > 1 else None
    kvm, tcg = _guest_run("kvm", sections), _guest_run("tcg", sections)
    if tcg is None:
        reason = "the probe could not run QEMU there (no temporary directory?)"
        return AccelProbe("tcg", False, reason, 0.0, qemu_version=version, control_ok=False)
    device = sections.get("kvm_device", "").strip()
    problem = {"ok": None, "absent": accel.NO_DEVICE}.get(device, accel.NO_ACCESS)
    started, ended = _times(sections, "started"), _times(sections, "ended")
    elapsed = round(max(ended) - min(started), 3) if started and ended else 0.0
    if problem is None and kvm is not None and kvm.ok and kvm.spin_s is None:
        # Reaching the end proves little: only the spin loop's time tells hardware from emulation.
        reason = (
            "the host's date(1) has no %N: the spin loop could not be timed, so whether KVM runs guest "
            "code natively is unknown"
        )
        return AccelProbe("tcg", False, reason, elapsed, version, (kvm, tcg), control_ok=tcg.ok)
    decided = accel.decide(kvm if problem is None else None, tcg, problem)
    return replace(decided, elapsed_s=elapsed, qemu_version=version)


def _guest_run(accelerator: str, sections: dict[str, str]) -> GuestRun | None:
    """One run's record as the doctor keeps it; the serial lines' times are the host's own."""
    if f"kvm_{accelerator}" not in sections:
        return None
    values = _values(sections, accelerator)
    started = _seconds(values.get("started"))
    out = QemuOutput(
        stderr=sections.get(f"kvm_{accelerator}_stderr", ""),
        exit_status=int(values["status"]) if values.get("status", "").isdigit() else None,
        timed_out=values.get("timed_out") == "1",
    )
    timed = started is not None
    for line in sections.get(f"kvm_{accelerator}_serial", "").splitlines():
        stamp, _, text = line.partition(" ")
        at = _seconds(stamp)
        timed = timed and at is not None
        since = at - started if at is not None and started is not None else 0.0
        out.lines.append((since, text.strip("\r\x00")))
    ended = _seconds(values.get("ended"))
    out.elapsed_s = ended - started if ended is not None and started is not None else 0.0
    run = accel.boot_sector_run(accelerator, out)
    return run if timed else replace(run, spin_s=None)  # lines without times time nothing


def _seconds(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None  # a date(1) without %N


def _times(sections: dict[str, str], key: str) -> list[float]:
    """The ``key=`` times (started, ended) of every run that has one."""
    found = [_seconds(_values(sections, accelerator).get(key)) for accelerator in ("kvm", "tcg")]
    return [seconds for seconds in found if seconds is not None]


def _values(sections: dict[str, str], accelerator: str) -> dict[str, str]:
    """A run's ``key=value`` lines (started, ended, status, timed_out)."""
    lines = sections.get(f"kvm_{accelerator}", "").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)
