"""Finds out, by running guest code, whether QEMU can use KVM on this host.

Opening ``/dev/kvm`` proves nothing: on the nested hosts this project runs on, ``KVM_CREATE_VM``
succeeds and the guest then stops with "KVM internal error. Suberror: 1 ... emulation failure".
So the probe boots a 512-byte boot sector (built into this module, no assembler needed) under
``-accel kvm`` and, as the control, under ``-accel tcg``. The boot sector climbs from real mode to
long mode and then does what every guest kernel does early on (SSE, ``lock cmpxchg16b``) before a
timed spin loop; it reports each step on the serial port. A guest that finishes the spin loop
about as slowly as instruction-by-instruction emulation is not accelerated either, whatever the
device node says.

When a guest kernel and initramfs are given, they are booted as well (only once the boot sector
passed under KVM) and must print a marker line. Results are cached per boot id, because the
answer cannot change before the next reboot and ``virtlab doctor`` should be quick the second time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from virtlab.build import cache_root

Accelerator = Literal["kvm", "tcg"]
KvmState = Literal["works", "absent", "no access", "emulation failure", "emulated", "fails", "not probed"]
"""What the probe found of KVM: it runs guest code; no /dev/kvm; /dev/kvm not open to this user; the
guest stopped with KVM's "emulation failure" (nested hosts); it ran by instruction emulation only;
it failed otherwise; or nothing could be probed (no QEMU, or the TCG control failed too)."""

QEMU = "qemu-system-x86_64"
# The line a guest initramfs prints once its init runs; the VM environment's initramfs prints it too.
GUEST_READY_MARKER = "VIRTLAB-GUEST-READY"
PROBE_MARKER = "VLPROBE"
# Marker lines the boot sector prints, in order; "done" follows the spin loop.
PROBE_STAGES = ("real", "protected", "long", "sse", "cx16", "done")
# What the boot sector attempts after each stage, to name where a guest stopped.
_NEXT_STEP = {
    None: "firmware and boot-sector load (real mode)",
    "real": "switch to protected mode",
    "protected": "switch to long mode (paging)",
    "long": "SSE instructions (pxor, paddq, movdqu)",
    "sse": "lock cmpxchg16b",
    "cx16": "spin loop of 500,000 iterations",
}
# The spin loop takes well under 1 ms natively and about 4 ms under TCG; about 0.5 s when the host
# kernel emulates every instruction. A probe above both limits is not hardware-accelerated.
_EMULATED_SPIN_S = 0.1
_EMULATED_SPIN_RATIO = 3.0
_PROBE_FORMAT = 2
_CACHE_FILE = "accel-probe.json"

# Source of BOOT_SECTOR, for reading and for re-assembling with `nasm -f bin` (tests do).
BOOT_SECTOR_ASM = r"""
; virtlab accelerator probe: real -> protected -> long mode, SSE, cmpxchg16b, a timed spin loop.
bits 16
org 0x7c00
    cli
    xor ax, ax
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov sp, 0x7c00
    mov si, m_real
    call print16
    in al, 0x92                 ; fast A20
    or al, 2
    out 0x92, al
    lgdt [gdtr]
    mov eax, cr0
    or al, 1
    mov cr0, eax
    jmp 0x08:pmode

bits 32
pmode:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov esi, m_prot
    call print
    mov edi, 0x1000             ; identity-map the first 2 MiB: PML4 0x1000, PDPT 0x2000, PD 0x3000
    xor eax, eax
    mov ecx, 0xc00
    rep stosd
    mov dword [0x1000], 0x2003
    mov dword [0x2000], 0x3003
    mov dword [0x3000], 0x83
    mov eax, cr4
    or eax, 0x620               ; PAE, OSFXSR, OSXMMEXCPT
    mov cr4, eax
    mov eax, 0x1000
    mov cr3, eax
    mov ecx, 0xc0000080         ; EFER.LME
    rdmsr
    or eax, 0x100
    wrmsr
    mov eax, cr0
    and eax, 0xfffffffb         ; no FPU emulation, paging on
    or eax, 0x80000002
    mov cr0, eax
    jmp 0x18:lmode

bits 64
lmode:
    mov esi, m_long
    call print
    pxor xmm0, xmm0             ; guest kernels use SSE early; so does this probe
    pcmpeqd xmm1, xmm1
    paddq xmm0, xmm1
    movdqu [0x4000], xmm0
    cmp dword [0x4000], 0xffffffff
    jne fail
    mov esi, m_sse
    call print
    or rax, -1                  ; so do their atomics: [0x4000] holds all ones; swap in zeros
    mov rdx, rax
    xor ebx, ebx
    xor ecx, ecx
    lock cmpxchg16b [0x4000]
    jnz fail
    mov esi, m_cx16
    call print
    mov ecx, 500000             ; native: well under 1 ms; instruction-by-instruction emulation: ~0.5 s
spin:
    dec ecx
    jnz spin
    mov esi, m_done
    call print
    mov al, 0x21                ; isa-debug-exit: QEMU exits with (0x21 << 1) | 1 = 67
    out 0xf4, al
    jmp halt
fail:
    mov esi, m_fail
    call print
    mov al, 0x10                ; QEMU exits with 33
    out 0xf4, al
halt:
    hlt
    jmp halt

bits 16
print16:
.next:
    lodsb
    test al, al
    jz .done
    mov ah, al
    mov dx, 0x3fd               ; wait for the transmitter holding register to be empty
.busy:
    in al, dx
    test al, 0x20
    jz .busy
    mov al, ah
    mov dx, 0x3f8
    out dx, al
    jmp .next
.done:
    ret

bits 32
; These bytes decode the same in 32- and 64-bit code (lodsb reads [esi] or [rsi]), so one routine serves both.
print:
.next:
    lodsb
    test al, al
    jz .done
    mov ah, al
    mov dx, 0x3fd               ; wait for the transmitter holding register to be empty
.busy:
    in al, dx
    test al, 0x20
    jz .busy
    mov al, ah
    mov dx, 0x3f8
    out dx, al
    jmp .next
.done:
    ret

align 8
gdt:
    dq 0
    dq 0x00cf9a000000ffff       ; 0x08 code, 32-bit
    dq 0x00cf92000000ffff       ; 0x10 data
    dq 0x00af9a000000ffff       ; 0x18 code, 64-bit
gdtr:
    dw gdtr - gdt - 1
    dd gdt
m_real: db "VLPROBE real", 10, 0
m_prot: db "VLPROBE protected", 10, 0
m_long: db "VLPROBE long", 10, 0
m_sse:  db "VLPROBE sse", 10, 0
m_cx16: db "VLPROBE cx16", 10, 0
m_fail: db "VLPROBE bad", 10, 0
m_done: db "VLPROBE done", 10, 0
times 510-($-$$) db 0
dw 0xaa55
"""

_BOOT_CODE = bytes.fromhex(
    "fa31c08ed88ec08ed0bc007cbe767de80c01e4920c02e6920f0116707d0f20c00c010f22c0ea2a7c080066b810008ed8"
    "8ec08ed0be847d0000e8f8000000bf0010000031c0b9000c0000f3abc7050010000003200000c7050020000003300000"
    "c70500300000830000000f20e00d200600000f22e0b8001000000f22d8b9800000c00f320d000100000f300f20c083e0"
    "fb0d020000800f22c0eaa07c00001800be977d0000e88c000000660fefc0660f76c9660fd4c1f30f7f04250040000083"
    "3c2500400000ff7544bea57d0000e8630000004883c8ff4889c231db31c9f0480fc70c25004000007523beb27d0000e8"
    "42000000b920a10700ffc975fcbecd7d0000e82f000000b021e6f4eb0ebec07d0000e81f000000b010e6f4f4ebfdac84"
    "c0741288c4bafd03eca82074fb88e0baf803eeebe9c3ac84c0741488c466bafd03eca82074fb88e066baf803eeebe7c3"
    "0000000000000000ffff0000009acf00ffff00000092cf00ffff0000009aaf001f00507d0000564c50524f4245207265"
    "616c0a00564c50524f42452070726f7465637465640a00564c50524f4245206c6f6e670a00564c50524f424520737365"
    "0a00564c50524f424520637831360a00564c50524f4245206261640a00564c50524f424520646f6e650a"
)
BOOT_SECTOR = _BOOT_CODE.ljust(510, b"\0") + b"\x55\xaa"
# isa-debug-exit turns the guest's `out 0xf4, 0x21` into this QEMU exit status.
_BOOT_SECTOR_EXIT = (0x21 << 1) | 1


@dataclass(frozen=True)
class GuestRun:
    """One QEMU run of the probe: what the guest printed, how QEMU ended, and how long it took."""

    accelerator: str
    guest: Literal["boot-sector", "kernel"]
    ok: bool
    stages: tuple[str, ...]  # boot sector: probe stages reached; kernel: ("ready",) once the marker came
    exit_status: int | None  # None when the probe had to kill QEMU
    timed_out: bool
    elapsed_s: float
    spin_s: float | None = None  # boot sector only: from the "cx16" line to the "done" line
    error: str = ""  # QEMU's own complaint, condensed to one line
    stderr: str = ""  # the tail of QEMU's standard error, kept for the record

    def where_stopped(self) -> str:
        """The step the guest was attempting when it stopped (boot sector only)."""
        return _NEXT_STEP.get(self.stages[-1] if self.stages else None, "")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GuestRun:
        return cls(**{**data, "stages": tuple(data["stages"])})


@dataclass(frozen=True)
class AccelProbe:
    """Which accelerator virtlab uses for VMs on this host, and why."""

    accelerator: Accelerator
    kvm_usable: bool
    reason: str
    elapsed_s: float
    qemu_version: str | None = None
    runs: tuple[GuestRun, ...] = ()
    boot_id: str | None = None
    cached: bool = False
    # The TCG control run reached its end: False means this probe proves nothing either way.
    control_ok: bool = True
    kvm: KvmState = "not probed"

    def run(self, accelerator: str, guest: str = "boot-sector") -> GuestRun | None:
        return next((r for r in self.runs if r.accelerator == accelerator and r.guest == guest), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AccelProbe:
        runs = tuple(GuestRun.from_dict(r) for r in data.get("runs", ()))
        return cls(**{**data, "runs": runs})


def probe_kvm(
    timeout_s: float = 20,
    *,
    kernel: str | os.PathLike[str] | None = None,
    initrd: str | os.PathLike[str] | None = None,
    kernel_marker: str = GUEST_READY_MARKER,
    append: str = "",
    cpu: str | None = None,
    qemu: str = QEMU,
    refresh: bool = False,
    cache: bool = True,
) -> AccelProbe:
    """Boot real guest code under KVM and TCG and decide whether virtlab's VMs can use KVM.

    ``timeout_s`` bounds each QEMU run (KVM and TCG run side by side). ``cpu`` is passed as
    ``-cpu`` (None: QEMU's default model). The answer is cached per boot id unless ``refresh``.
    """
    started = time.monotonic()
    qemu_path = shutil.which(qemu)
    if qemu_path is None:
        return no_qemu(qemu)
    qemu_version = _first_line([qemu_path, "--version"])
    boot_id = _boot_id()
    key = _cache_key(qemu_path, qemu_version, cpu, kernel, initrd, kernel_marker, append)
    if cache and not refresh and boot_id:
        hit = _cache_load(boot_id, key)
        if hit is not None:
            return replace(hit, cached=True)

    probe = _probe(qemu_path, timeout_s, kernel, initrd, kernel_marker, append, cpu)
    probe = replace(
        probe,
        elapsed_s=round(time.monotonic() - started, 3),
        qemu_version=qemu_version,
        boot_id=boot_id,
    )
    # A probe whose TCG control failed is broken, not informative: do not keep it for the whole boot.
    if cache and boot_id and probe.control_ok:
        _cache_store(boot_id, key, probe)
    return probe


def no_qemu(qemu: str = QEMU) -> AccelProbe:
    """The probe of a host without QEMU: nothing could be booted."""
    return AccelProbe(
        "tcg", False, f"{qemu} not found (apt-get install qemu-system-x86)", 0.0, control_ok=False
    )


def boot_sector_argv(qemu: str, image: str, cpu: str | None = None) -> list[str]:
    """QEMU booting the boot sector in ``image`` with its serial port on stdout, but for the
    accelerator (``-accel``, added last): the same command here and on a remote host."""
    return [
        qemu, "-nodefaults", "-no-user-config", "-machine", "pc", "-m", "16", "-display", "none",
        "-no-reboot", "-serial", "stdio", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-drive", f"file={image},format=raw,if=ide", "-boot", "c", *(["-cpu", cpu] if cpu else []),
    ]  # fmt: skip


def run_boot_sector(
    accelerator: str,
    timeout_s: float = 20,
    *,
    cpu: str | None = None,
    qemu: str = QEMU,
    boot_sector: bytes = BOOT_SECTOR,
) -> GuestRun:
    """Boot the probe's boot sector once under ``accelerator`` ("kvm" or "tcg")."""
    if len(boot_sector) != 512 or not boot_sector.endswith(b"\x55\xaa"):
        raise ValueError("a boot sector is 512 bytes ending in 55 aa")
    with tempfile.TemporaryDirectory(prefix="virtlab-probe-") as tmp:
        image = Path(tmp) / "probe.img"
        image.write_bytes(boot_sector)
        argv = [*boot_sector_argv(shutil.which(qemu) or qemu, str(image), cpu), "-accel", accelerator]
        # The boot sector ends QEMU itself right after its last line, with a known exit status.
        out = _run_qemu(argv, timeout_s, lambda line: line == f"{PROBE_MARKER} done", grace_s=1.0)
    return boot_sector_run(accelerator, out)


def boot_sector_run(accelerator: str, out: QemuOutput) -> GuestRun:
    """What one QEMU run of the boot sector shows: the stages it reached, its spin time, QEMU's error."""
    stages: list[str] = []
    times: dict[str, float] = {}
    for at, line in out.lines:
        if line.startswith(PROBE_MARKER + " "):
            stage = line.split(" ", 1)[1].strip()
            stages.append(stage)
            times[stage] = at
    spin = times["done"] - times["cx16"] if {"done", "cx16"} <= times.keys() else None
    ok = tuple(stages) == PROBE_STAGES and out.exit_status in (_BOOT_SECTOR_EXIT, None)
    error = _qemu_error(out.stderr)
    if not error and "bad" in stages:
        error = "the guest computed a wrong result"
    if not error and not ok and out.exit_status is not None:
        error = f"QEMU exited with status {out.exit_status}"
    return GuestRun(
        accelerator, "boot-sector", ok, tuple(stages), out.exit_status, out.timed_out,
        round(out.elapsed_s, 3), None if spin is None else round(spin, 4), error, out.stderr[-4000:],
    )  # fmt: skip


def boot_kernel(
    accelerator: str,
    kernel: str | os.PathLike[str],
    initrd: str | os.PathLike[str] | None = None,
    timeout_s: float = 20,
    *,
    marker: str = GUEST_READY_MARKER,
    append: str = "",
    cpu: str | None = None,
    memory_mib: int = 256,
    qemu: str = QEMU,
) -> GuestRun:
    """Boot ``kernel`` (+ ``initrd``) with its console on the serial port until ``marker`` appears."""
    argv = [
        shutil.which(qemu) or qemu, "-nodefaults", "-no-user-config", "-machine", "pc",
        "-accel", accelerator, "-m", str(memory_mib), "-display", "none", "-no-reboot",
        "-serial", "stdio", "-kernel", os.fspath(kernel),
        *(["-initrd", os.fspath(initrd)] if initrd is not None else []),
        "-append", f"console=ttyS0 panic=-1 {append}".strip(),
        *(["-cpu", cpu] if cpu else []),
    ]  # fmt: skip
    out = _run_qemu(argv, timeout_s, lambda line: marker in line)
    ready = any(marker in line for _, line in out.lines)
    error = _qemu_error(out.stderr)
    if not ready and not error:
        if out.timed_out:
            error = f"no {marker!r} line within {timeout_s:g} s"
        else:
            tail = " | ".join(line for _, line in out.lines[-3:])
            error = f"QEMU exited with status {out.exit_status} before {marker!r}; console: {tail}"
    return GuestRun(
        accelerator, "kernel", ready, ("ready",) if ready else (), out.exit_status, out.timed_out,
        round(out.elapsed_s, 3), None, error, out.stderr[-4000:],
    )  # fmt: skip


def _probe(
    qemu_path: str,
    timeout_s: float,
    kernel: str | os.PathLike[str] | None,
    initrd: str | os.PathLike[str] | None,
    kernel_marker: str,
    append: str,
    cpu: str | None,
) -> AccelProbe:
    device_problem = _kvm_device_problem()
    with ThreadPoolExecutor(max_workers=2) as pool:
        tcg_future = pool.submit(run_boot_sector, "tcg", timeout_s, cpu=cpu, qemu=qemu_path)
        kvm_future = None
        if device_problem is None:
            kvm_future = pool.submit(run_boot_sector, "kvm", timeout_s, cpu=cpu, qemu=qemu_path)
        tcg = tcg_future.result()
        kvm = kvm_future.result() if kvm_future is not None else None
    decided = decide(kvm, tcg, device_problem)
    if not decided.kvm_usable or kernel is None:
        return decided
    runs, reason = decided.runs, decided.reason

    def boot(accelerator: str) -> GuestRun:
        return boot_kernel(
            accelerator, kernel, initrd, timeout_s, marker=kernel_marker, append=append, cpu=cpu,
            qemu=qemu_path,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=2) as pool:
        kvm_kernel, tcg_kernel = pool.map(boot, ("kvm", "tcg"))
    runs = (*runs, kvm_kernel, tcg_kernel)
    if kvm_kernel.ok:
        reason += f"; the guest kernel printed {kernel_marker!r} under KVM after {kvm_kernel.elapsed_s:.1f} s"
        return replace(decided, reason=reason, runs=runs)
    if tcg_kernel.ok:
        reason = (
            f"the boot sector passed under KVM, but the guest kernel failed under KVM ({kvm_kernel.error}) "
            f"while it printed {kernel_marker!r} under TCG after {tcg_kernel.elapsed_s:.1f} s"
        )
        return AccelProbe("tcg", False, reason, 0.0, runs=runs, control_ok=tcg.ok, kvm="fails")
    reason += (
        f"; the guest kernel failed under KVM ({kvm_kernel.error}) and under TCG ({tcg_kernel.error}),"
        " so the kernel or initramfs is at fault, not KVM"
    )
    return replace(decided, reason=reason, runs=runs)


def decide(kvm: GuestRun | None, tcg: GuestRun, device_problem: str | None) -> AccelProbe:
    """The verdict of the boot sector's runs under KVM (None: /dev/kvm could not be opened, for
    ``device_problem``) and under TCG, the control; wherever they ran, here or on another host."""
    runs = tuple(r for r in (kvm, tcg) if r is not None)
    control = ""
    if not tcg.ok:
        control = f"; the TCG control failed as well ({_describe(tcg)}), so the probe itself is broken"

    if kvm is None:
        state: KvmState = "absent" if device_problem == NO_DEVICE else "no access"
        reason = f"{device_problem}{control}"
        return AccelProbe("tcg", False, reason, 0.0, runs=runs, control_ok=tcg.ok, kvm=state)
    if not kvm.ok:
        if not tcg.ok:
            reason = f"probe broken: under TCG {_describe(tcg)}; under KVM {_describe(kvm)}"
            return AccelProbe("tcg", False, reason, 0.0, runs=runs, control_ok=False)
        reason = f"under KVM the guest {_describe(kvm)}; under TCG it ran to the end"
        state = "emulation failure" if "emulation failure" in kvm.error else "fails"
        return AccelProbe("tcg", False, reason, 0.0, runs=runs, control_ok=tcg.ok, kvm=state)
    if _emulated(kvm, tcg):
        under_tcg = f"{tcg.spin_s:.3f} s" if tcg.spin_s is not None else "unknown"
        reason = (
            f"KVM runs guest code by instruction emulation: the spin loop took {kvm.spin_s:.3f} s under "
            f"KVM and {under_tcg} under TCG{control}"
        )
        return AccelProbe("tcg", False, reason, 0.0, runs=runs, control_ok=tcg.ok, kvm="emulated")
    reason = f"boot sector reached long mode and ran its spin loop in {kvm.spin_s:.4f} s under KVM{control}"
    return AccelProbe("kvm", True, reason, 0.0, runs=runs, control_ok=tcg.ok, kvm="works")


def _emulated(kvm: GuestRun, tcg: GuestRun) -> bool:
    if kvm.spin_s is None or kvm.spin_s < _EMULATED_SPIN_S:
        return False
    return tcg.spin_s is None or kvm.spin_s > _EMULATED_SPIN_RATIO * tcg.spin_s


def _describe(run: GuestRun) -> str:
    """One phrase for a boot-sector run that did not finish: where it stopped and why."""
    reached = f"after reaching {run.stages[-1]} mode" if run.stages else "before printing anything"
    if run.stages and run.stages[-1] in ("sse", "cx16"):
        reached = f"after its {run.stages[-1]} step"
    why = run.error or (f"timed out after {run.elapsed_s:.0f} s" if run.timed_out else "stopped")
    if "bad" in run.stages:
        return f"computed a wrong result ({why})"
    return f"stopped {reached}, during the {run.where_stopped()}: {why}"


NO_DEVICE = "no /dev/kvm (this machine exposes no hardware virtualization, or kvm is not loaded)"
NO_ACCESS = "/dev/kvm is not accessible to this user (add it to group kvm)"


def _kvm_device_problem() -> str | None:
    """Why QEMU cannot even open /dev/kvm, or None when it can."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return NO_DEVICE
        if exc.errno in (errno.EACCES, errno.EPERM):
            return NO_ACCESS
        return f"cannot open /dev/kvm: {exc.strerror}"
    os.close(fd)
    return None


@dataclass
class QemuOutput:
    """What one QEMU run printed: its serial lines, timed, and its standard error and end."""

    lines: list[tuple[float, str]] = field(default_factory=list)  # serial lines, seconds after start
    stderr: str = ""
    exit_status: int | None = None
    timed_out: bool = False
    elapsed_s: float = 0.0


def _run_qemu(
    argv: Sequence[str], timeout_s: float, finished: Callable[[str], bool], grace_s: float = 0.0
) -> QemuOutput:
    """Run QEMU with the guest's serial port on stdout until it exits, ``finished(line)`` holds for a
    serial line, KVM reports an internal error (QEMU then pauses the guest instead of exiting), or
    ``timeout_s`` passes; QEMU gets ``grace_s`` to exit by itself after ``finished``, then is killed."""
    out = QemuOutput()
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    selector.register(proc.stderr, selectors.EVENT_READ)
    partial, err = b"", bytearray()
    internal_error_at: float | None = None
    done = False
    try:
        while selector.get_map() and not done:
            deadline = started + timeout_s
            if internal_error_at is not None:
                deadline = min(deadline, internal_error_at + 1.0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out.timed_out = internal_error_at is None
                break
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    now = time.monotonic() - started
                    *complete, partial = (partial + chunk).split(b"\n")
                    for raw in complete:
                        line = raw.decode(errors="replace").strip("\r\x00")
                        out.lines.append((now, line))
                        done = done or finished(line)
                else:
                    err += chunk
                    if internal_error_at is None and b"KVM internal error" in err:
                        internal_error_at = time.monotonic()
                    # The register dump ends with the code bytes; nothing more is coming.
                    if internal_error_at is not None and re.search(rb"\nCode=[^\n]*\n", err):
                        done = True
        if done and grace_s > 0:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            out.exit_status = None
        else:
            out.exit_status = proc.returncode
        # Whatever is still buffered in the pipes belongs to the record.
        partial += proc.stdout.read()
        err += proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        selector.close()
    if partial.strip():
        out.lines.append((time.monotonic() - started, partial.decode(errors="replace").strip()))
    out.stderr = err.decode(errors="replace")
    out.elapsed_s = time.monotonic() - started
    return out


_CODE_BYTES = re.compile(r"^Code=.*<([0-9a-f]{2})>((?: [0-9a-f]{2}){0,7})", re.MULTILINE)


def _qemu_error(stderr: str) -> str:
    """QEMU's complaint in one line: a KVM internal error with its faulting bytes, or its own errors."""
    if "KVM internal error" in stderr:
        head = next(line for line in stderr.splitlines() if "KVM internal error" in line).strip()
        kind = next((line.strip() for line in stderr.splitlines() if line.strip() == "emulation failure"), "")
        text = f"{head} ... {kind}" if kind else head
        code = _CODE_BYTES.search(stderr)
        if code:
            text += f" (faulting bytes {code.group(1)}{code.group(2)})"
        return text
    errors = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip() and "warning:" not in line and "terminating on signal" not in line
    ]
    return " / ".join(errors[:3])


def _first_line(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _file_identity(path: str | os.PathLike[str] | None) -> list[Any] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return [os.fspath(path)]
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


def _cache_key(
    qemu_path: str,
    qemu_version: str | None,
    cpu: str | None,
    kernel: str | os.PathLike[str] | None,
    initrd: str | os.PathLike[str] | None,
    kernel_marker: str,
    append: str,
) -> str:
    parts = [
        _PROBE_FORMAT, qemu_path, qemu_version, cpu, _file_identity(kernel), _file_identity(initrd),
        kernel_marker if kernel else None, append if kernel else None,
        hashlib.sha256(BOOT_SECTOR).hexdigest(),
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def cache_path() -> Path:
    return cache_root() / _CACHE_FILE


def _cache_load(boot_id: str, key: str) -> AccelProbe | None:
    try:
        data = json.loads(cache_path().read_text())
        if data.get("boot_id") != boot_id:
            return None
        entry = data.get("probes", {}).get(key)
        return AccelProbe.from_dict(entry) if entry else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _cache_store(boot_id: str, key: str, probe: AccelProbe) -> None:
    path = cache_path()
    try:
        data = json.loads(path.read_text())
        if data.get("boot_id") != boot_id:
            data = {}
    except (OSError, ValueError):
        data = {}
    probes = data.get("probes") if isinstance(data.get("probes"), dict) else {}
    probes[key] = probe.to_dict()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"boot_id": boot_id, "probes": probes}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs the next run a few seconds
