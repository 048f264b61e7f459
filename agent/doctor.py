"""`slotscope doctor`: what this machine can trace, and for what it cannot, why and how to fix it."""
from __future__ import annotations

import os
import sys

from . import kernel
from .probes import GROUPS, Filters, ebpf_text, load_falling_back, runnable_groups


GROUP = "probe group "


def checks() -> list[tuple[str, str | None, str]]:
    """(name, reason it cannot run or None, what it gives, and in place of what it read first
    what this kernel gives)."""
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
                f"fine for tracepoint programs, and for the kprobe groups where the kernel has BTF for their "
                f"modules (without it they would read struct members at wrong offsets)")
    out.append(("headers", hdr_reason, hdr_what))
    for make in GROUPS:
        group = make()
        reason = group.can_run()
        notes = [] if reason else group.fallbacks()
        fell_back = f"; fell back: {'; '.join(notes)}" if notes else ""
        out.append((f"{GROUP}{group.name}", reason, group.description + fell_back))
    return out


def load_check(results: list[tuple[str, str | None, str]]) -> list[tuple[str, str | None, str]]:
    """The groups that can run, compiled and loaded as `record` would (falling back as it does),
    then unloaded: whether BCC compiles against this kernel only a compile tells (a kernel newer
    than BCC broke the kprobe groups while they compiled its headers). -> results with each
    group that failed to load given its reason."""
    groups, skipped = runnable_groups()
    if groups:
        load_falling_back(groups, Filters(), skipped, lambda _: None)[0].close()
    return [(name, skipped.get(name.removeprefix(GROUP), reason) if name.startswith(GROUP) else reason, what)
            for name, reason, what in results]


def run_doctor(ebpf: bool = False, load: bool = False) -> int:
    if ebpf:
        groups, skipped = runnable_groups()
        if not groups:
            print("slotscope doctor: no probe group can run here: "
                  + "; ".join(f"{name}: {why}" for name, why in skipped.items()), file=sys.stderr)
            return 1
        print(ebpf_text(groups, Filters(), skipped), end="")
        return 0
    results = checks()
    if load and not any(reason for name, reason, _ in results if name in ("root", "bcc")):
        results = load_check(results)
    width = max(len(name) for name, _, _ in results)
    for name, reason, what in results:
        state = "ok " if reason is None else "NO "
        print(f"{state} {name:<{width}}  {what if reason is None else reason}")
    reasons = {name: reason for name, reason, _ in results}
    syscalls_ok = reasons["probe group syscalls"] is None
    print()
    print("recording possible: " + ("yes" if syscalls_ok else
                                    "sampled only: `slotscope record` samples /proc and mountstats instead "
                                    "(record --no-bpf; README: Without root)"), file=sys.stdout)
    if reasons["probe group sunrpc"] or reasons["probe group nfs"]:
        print("no NFS to trace here: `slotscope demo --sample` shows what slotscope finds in a checkpoint save "
              "stalled on NFS, from the capture shipped with it (no root needed)")
    return 0 if syscalls_ok else 1
