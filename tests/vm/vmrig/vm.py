"""Boot the image in qemu and run one job in it.

The job is an executable `job` in a host directory shared over 9p (tag "job"); the
guest's PID 1 (bootfiles/vminit) runs it, writes its exit status to `rc` in the share
and powers off. The serial console goes to a log file. A hard timeout kills a hung VM.
"""

import hashlib
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .image import CACHE_ROOT, Image

MEMORY_MB = 4096    # torchrun and four ranks importing torch (the rig's writers ran in 1536); TCG allocates lazily
CPUS = 2
CONSOLE_TAIL = 40
BOOT_ATTEMPTS = 2   # a second boot only after a kernel crash before the job (crashed_before_job)
# Set when the test session ends: every VM still running is killed (within a second).
STOP = threading.Event()


class VMError(RuntimeError):
    pass


class VMTimeout(VMError):
    pass


@dataclass
class Share:
    tag: str
    path: Path
    readonly: bool = False


@dataclass
class Result:
    rc: int
    seconds: float
    accel: str
    clock: str          # "wall", or "icount shift=N": see icount_args


def icount_args(shift):
    """The guest's clock counts emulated instructions instead of following the host's: each
    instruction takes 2**shift ns of guest time, and an idle guest jumps to its next timer
    (sleep=off). The host's speed and load then do not enter guest timings, which makes a
    CPU-cost comparison repeatable (bench/overhead.py). One vCPU: QEMU runs icount vCPUs
    round-robin on one thread, and a 2-vCPU x86 guest hangs at "Booting SMP configuration"
    (the boot CPU spins waiting for a sibling that never gets its turn). Host I/O (the
    virtio disk) is not modelled: its completions land at arbitrary guest times, and each wait
    for one jumps to the next timer, so steps that wait for the host many times (the install
    over 9p: 57 s of guest time on a quiet host, 1349 s at load 5) have generous guest-time
    deadlines (guest/scenario.py SETUP_TIMEOUT). sleep=on would bound those waits by the host's
    time, but then the host's scheduling delays enter every idle wait of a measurement: the
    straggler's ratio fell from 4.07x to 2.4x at load 6."""
    return ["-icount", f"shift={shift},sleep=off", "-smp", "1"]


def console_tail(console, n=CONSOLE_TAIL):
    try:
        lines = Path(console).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no console log)"
    return "\n".join(lines[-n:])


def stream_nic(socket, listen):
    """A virtio NIC joined to another VM's by qemu's stream backend over a unix socket: the
    frames go between the two qemu processes on this machine and nowhere else. The VM that
    listens must be up before the other connects (QEMU 7.2 has no reconnect)."""
    return ["-netdev", f"stream,id=link,server={'on' if listen else 'off'},addr.type=unix,addr.path={socket}",
            "-device", "virtio-net-pci,netdev=link"]


# A watching guest's metrics endpoint (guest/scenario.py serves watch's --metrics there, in the
# client namespace): qemu's user-mode network gives the guest this address by default.
GUEST_METRICS = ("10.0.2.15", 9465)


def metrics_nic(host_port):
    """A virtio NIC on qemu's user-mode network, restricted (restrict=on: the guest reaches neither
    the host nor anything beyond it) but for one forward: the host's 127.0.0.1:host_port to the
    guest's metrics endpoint, which a Prometheus on the host scrapes."""
    addr, port = GUEST_METRICS
    return ["-netdev", f"user,id=metrics,restrict=on,hostfwd=tcp:127.0.0.1:{host_port}-{addr}:{port}",
            "-device", "virtio-net-pci,netdev=metrics"]


def qemu_command(image, kernel, accel, console, shares, icount=None, net=()):
    vmlinuz, initrd = image.kernel(kernel)
    cmd = ["qemu-system-x86_64", "-accel", accel, "-m", str(MEMORY_MB),
           *(icount_args(icount) if icount is not None else ["-smp", str(CPUS)]),
           "-display", "none", "-monitor", "none", "-serial", f"file:{console}",
           "-no-reboot", "-nic", "none", "-kernel", str(vmlinuz), "-initrd", str(initrd),
           "-append", "console=ttyS0 panic=-1 loglevel=4", *net]
    # TCG's default CPU (qemu64) lacks SSE4.2/AVX, which numpy and pyarrow wheels need
    # (they die with SIGILL); "max" gives everything TCG can emulate.
    cmd += ["-cpu", "host" if accel == "kvm" else "max"]
    # -snapshot: writes go to a temporary overlay, so the cached image stays pristine
    # and VMs can run concurrently.
    cmd += ["-drive", f"file={image.rootfs},format=raw,if=virtio,cache=unsafe", "-snapshot"]
    for s in shares:
        cmd += ["-virtfs", f"local,path={s.path},mount_tag={s.tag},security_model=none,id={s.tag}"
                + (",readonly=on" if s.readonly else "")]
    return cmd


def kvm_works(image, kernel):
    """KVM is used only if this kernel really boots under it: on some hosts /dev/kvm
    exists but the guest dies with "emulation failure". The probe boots the kernel
    without a root disk (it panics, which is success) and is cached per host boot."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    vmlinuz, _ = image.kernel(kernel)
    key = hashlib.sha256(f"{boot_id} {vmlinuz}".encode()).hexdigest()[:16]
    verdict = CACHE_ROOT / f".kvm-{key}"
    if verdict.exists():
        return verdict.read_text() == "yes"
    console = CACHE_ROOT / f".kvm-{key}.log"
    cmd = ["qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-m", "256", "-display", "none",
           "-monitor", "none", "-serial", f"file:{console}", "-no-reboot", "-nic", "none",
           "-kernel", str(vmlinuz), "-append", "console=ttyS0 panic=-1"]
    try:
        subprocess.run(cmd, check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        pass  # a KVM "emulation failure" leaves qemu paused forever
    ok = "Kernel panic" in console.read_text(errors="replace") if console.exists() else False
    verdict.write_text("yes" if ok else "no")
    return ok


def choose_accel(image, kernel):
    forced = os.environ.get("SLOTSCOPE_VM_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    return "kvm" if kvm_works(image, kernel) else "tcg"


def run_vm(image: Image, kernel, job_dir, console, timeout, shares=(), log=print, icount=None, watch=None,
           net=(), idle=False):
    """Boot, run job_dir/job, power off. Returns Result (rc is the job's exit status);
    raises VMTimeout (with the console tail) if the VM is still up after timeout s, or when
    watch(), called every second, returns a reason to stop it (a job step that hangs).
    icount=SHIFT: the guest clock counts instructions (icount_args), under TCG only; with
    KVM the guest runs on real hardware and keeps the real clock. net: qemu arguments of a
    NIC (stream_nic, metrics_nic), none by default. idle: qemu runs under SCHED_IDLE, on CPU time
    nothing else wants (an instruction-clock boot beside other work: tests/vm/conftest.py)."""
    job_dir = Path(job_dir)
    (job_dir / "rc").unlink(missing_ok=True)
    accel = choose_accel(image, kernel)
    if accel != "tcg":
        icount = None
    clock = "wall" if icount is None else f"icount shift={icount}"
    cmd = qemu_command(image, kernel, accel, console, [Share("job", job_dir), *shares], icount, net)
    if idle:
        cmd = ["chrt", "--idle", "0", *cmd]    # absolute, whatever the niceness of the thread starting it
    for attempt in range(1, BOOT_ATTEMPTS + 1):
        log(f"booting kernel {kernel} ({accel}, clock {clock}), timeout {timeout} s, console {console}")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        why = _wait(proc, t0 + timeout, watch) or f"VM still running after the {timeout} s timeout"
        if why is not True:
            proc.kill()
            proc.communicate()
            raise VMTimeout(f"{why}; killed it. Console {console}, last lines:\n{console_tail(console)}")
        out = proc.stdout.read()
        seconds = round(time.monotonic() - t0, 1)
        rc_file = job_dir / "rc"
        if proc.returncode == 0 and rc_file.exists():
            return Result(rc=int(rc_file.read_text().strip() or 255), seconds=seconds, accel=accel, clock=clock)
        if attempt < BOOT_ATTEMPTS and crashed_before_job(console):
            kept = Path(f"{console}.crashed")
            Path(console).replace(kept)
            log(f"the guest kernel crashed while booting, before the job started (console kept in {kept}); "
                f"booting again")
            continue
        raise VMError(f"VM ended without a job status (qemu exit {proc.returncode}) after {seconds} s."
                      f"\nqemu: {out.strip()}\nConsole {console}, last lines:\n{console_tail(console)}")


def _wait(proc, deadline, watch):
    """True once qemu exits; else the reason to kill it: watch()'s, or None at the deadline."""
    while time.monotonic() < deadline:
        if STOP.is_set():
            return "the test session is ending"
        try:
            proc.wait(timeout=1)
            return True
        except subprocess.TimeoutExpired:
            pass
        why = watch() if watch else None
        if why:
            return why
    return None


def crashed_before_job(console) -> bool:
    """The guest kernel died before PID 1 started the job. Under TCG a 6.12 kernel
    occasionally oopses on an int3 while it patches its own code at boot: nothing of the
    job ran, so booting again is safe."""
    try:
        text = Path(console).read_text(errors="replace")
    except FileNotFoundError:
        return False
    return "Kernel panic" in text and "vminit: running /job/job" not in text
