"""`slotscope doctor`: what this machine can trace, and for what it cannot, why and how to fix it."""
from __future__ import annotations

import os
import sys

from . import kernel
from .probes import SyscallProbes


def _module_reason(module: str, category: str) -> str | None:
    """Why the `category` tracepoints of a kernel module are not there, or None if they are."""
    if kernel.tracepoint_exists(category, "") and os.listdir(os.path.join(kernel.tracefs(), "events", category)):
        return None
    if kernel.kernel_module_loaded(module):
        return f"the {module} module is loaded but has no {category}:* tracepoints (tracing disabled in its build?)"
    if not os.path.exists("/proc/modules"):
        return (f"this kernel has no {module} (not built in) and cannot load modules (CONFIG_MODULES off): "
                f"NFS tracing needs a kernel with NFS, e.g. the VM rig in tests/vm")
    return (f"the {module} module is not loaded: nothing is mounted over NFS yet "
            f"(mount an NFS export, or `modprobe {module}`)")


def checks() -> list[tuple[str, str | None, str]]:
    """(name, reason it cannot run or None, what it gives)."""
    tracefs = kernel.ensure_tracefs()
    out = [
        ("root", None if os.geteuid() == 0 else "not root: BPF needs CAP_BPF and CAP_PERFMON (use sudo)",
         "privileges"),
        ("bcc", kernel.bcc_import_error(), "BCC's Python module (python3-bpfcc)"),
        ("tracefs", None if tracefs else "tracefs not mounted at /sys/kernel/tracing", "tracepoint discovery"),
    ]
    headers = kernel.headers_dir()
    if headers is None:
        hdr_reason = f"no /lib/modules/{os.uname().release}/build: install linux-headers-{os.uname().release}"
    else:
        hdr_reason = None
    hdr_what = ("kernel headers for BCC" if headers is None or kernel.headers_match_kernel() else
                f"kernel headers: {os.path.realpath(headers)} is not this kernel's own tree (a fallback): "
                f"fine for tracepoint programs, kprobes walking structs would read garbage")
    out.append(("headers", hdr_reason, hdr_what))
    syscalls = SyscallProbes()
    out.append(("probe group syscalls", syscalls.can_run(), syscalls.description))
    out.append(("probe group sunrpc", _module_reason("sunrpc", "sunrpc"),
                "per-RPC spans, slot waits, transports (sunrpc:* tracepoints)"))
    out.append(("probe group nfs", _module_reason("nfs", "nfs"),
                "WRITE/COMMIT sizes and stability, flush and fsync (nfs:* tracepoints)"))
    out.append(("kprobes", None if kernel.kprobes_available() else
                "this kernel has no kprobes (no kprobe_events in tracefs: CONFIG_KPROBES off)",
                "slot-table occupancy from struct rpc_xprt (kprobe on xprt_alloc_slot)"))
    return out


def run_doctor() -> int:
    results = checks()
    width = max(len(name) for name, _, _ in results)
    for name, reason, what in results:
        state = "ok " if reason is None else "NO "
        print(f"{state} {name:<{width}}  {what if reason is None else reason}")
    syscalls_ok = next(r for n, r, _ in results if n == "probe group syscalls") is None
    print()
    print("recording possible: " + ("yes" if syscalls_ok else "no (see above)"), file=sys.stdout)
    return 0 if syscalls_ok else 1
