"""`slotscope doctor`: what this machine can trace, and for what it cannot, why and how to fix it."""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from . import kernel
from .attach_plan import Attached, compare
from .probes import GROUPS, Filters, ebpf_text, load_falling_back, runnable_groups


GROUP = "probe group "
UNPLANNED = "attach points"      # the row of points attached that no group expected


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


def load_check(results: list[tuple[str, str | None, str]]
               ) -> tuple[list[tuple[str, str | None, str]], dict[str, Attached], list[str]]:
    """The groups that can run, compiled and loaded as `record` would (falling back as it does),
    then unloaded: whether BCC compiles against this kernel only a compile tells (a kernel newer
    than BCC broke the kprobe groups while they compiled its headers), and what attaches only an
    attach. -> (results with each group that failed to load given its reason, the loaded
    groups' plans against what attached, the points attached that no group expected)."""
    groups, skipped = runnable_groups()
    plans, unplanned = {}, []
    if groups:
        loaded, groups = load_falling_back(groups, Filters(), skipped, lambda _: None)
        try:
            plans, unplanned = compare(groups, loaded.attached())
        finally:
            loaded.close()
    results = [(name, skipped.get(name.removeprefix(GROUP), reason) if name.startswith(GROUP) else reason, what)
               for name, reason, what in results]
    return results, plans, unplanned


def report(results: list[tuple[str, str | None, str]], plans: dict[str, Attached] | None = None,
           unplanned: Sequence[str] = ()) -> list[str]:
    """A line per check; a loaded group's line ends with what attached of what it expected, and
    the points that did not attach follow it, one a line."""
    plans = plans or {}
    rows = [(name, reason, what, plans.get(name.removeprefix(GROUP)) if name.startswith(GROUP) else None)
            for name, reason, what in results]
    if unplanned:
        rows.append((UNPLANNED, None, f"attached, but expected by no group: {', '.join(unplanned)}", None))
    width = max(len(name) for name, *_ in rows)
    lines = []
    for name, reason, what, plan in rows:
        state = "NO " if reason else "!! " if (plan and plan.missing()) or name == UNPLANNED else "ok "
        said = reason or (f"{what}; {plan.summary()}" if plan else what)
        lines.append(f"{state} {name:<{width}}  {said}")
        lines += [f"{'':{width + 6}}{detail}" for detail in (plan.details() if plan and not reason else [])]
    return lines


def run_doctor(ebpf: bool = False, load: bool = False) -> int:
    if ebpf:
        groups, skipped = runnable_groups()
        if not groups:
            print("slotscope doctor: no probe group can run here: "
                  + "; ".join(f"{name}: {why}" for name, why in skipped.items()), file=sys.stderr)
            return 1
        print(ebpf_text(groups, Filters(), skipped), end="")
        return 0
    results, plans, unplanned = checks(), {}, []
    if load and not any(reason for name, reason, _ in results if name in ("root", "bcc")):
        results, plans, unplanned = load_check(results)
    print("\n".join(report(results, plans, unplanned)))
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
