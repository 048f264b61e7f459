"""Probe groups. Each says whether it can run on this kernel (and why not), and loads.

Like retis's collectors: can_run() returns None or the precise reason, so
`doctor` and `record` say the same thing; an optional group that cannot run is
skipped quietly and recorded in meta.json, a requested one fails loudly.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from . import kernel
from .layouts import LOSS_COUNTERS, OPS, PATH_EVENT, PROC_EVENT, SYS_EVENT, c_header
from .ringbuf import RingReader

PAGE = os.sysconf("SC_PAGE_SIZE")
BPF_NOEXIST = 1
BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"


def _read_sysctl(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _write_sysctl(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False
# Ring sizes in pages (powers of two). The syscall ring absorbs ~50 ms of a
# 5 M events/s storm between two drains.
RING_PAGES = {"sys_ring": 4096, "path_ring": 1024, "proc_ring": 256}


def common_reason() -> str | None:
    """What every BPF probe group needs."""
    if os.geteuid() != 0:
        return "needs root (CAP_BPF and CAP_PERFMON): run with sudo"
    if kernel.ensure_tracefs() is None:
        return "tracefs is not mounted and could not be mounted at /sys/kernel/tracing"
    err = kernel.bcc_import_error()
    if err:
        return f"cannot import bcc ({err}): install python3-bpfcc (Debian/Ubuntu) or python3-bcc (Fedora)"
    if kernel.headers_dir() is None:
        return (f"no kernel headers at /lib/modules/{os.uname().release}/build: "
                f"install linux-headers-{os.uname().release} (./dev.sh setup links a fallback)")
    return None


@dataclass
class Filters:
    """What the kernel side filters on (the rest is decided in user space)."""
    tgids: list[int] = field(default_factory=list)   # trace these and their descendants only
    cgroup: str | None = None                        # cgroup v2 directory


class SyscallProbes:
    name = "syscalls"
    description = "file syscalls of every process (syscalls:sys_enter_*/sys_exit_* tracepoints)"

    def available_syscalls(self) -> list[str]:
        return [op for op in OPS
                if kernel.tracepoint_exists("syscalls", f"sys_enter_{op}")
                and kernel.tracepoint_exists("syscalls", f"sys_exit_{op}")]

    def can_run(self) -> str | None:
        reason = common_reason()
        if reason:
            return reason
        if not kernel.tracepoint_exists("syscalls", "sys_enter_write"):
            return "no syscalls:sys_enter_write tracepoint (kernel built without CONFIG_FTRACE_SYSCALLS)"
        for cat, ev in (("task", "task_newtask"), ("sched", "sched_process_exec"), ("sched", "sched_process_exit")):
            if not kernel.tracepoint_exists(cat, ev):
                return f"no {cat}:{ev} tracepoint"
        return None

    def program_text(self) -> str:
        return c_header() + resources.files("slotscope.bpf").joinpath("syscalls.c").read_text()

    def cflags(self, filters: Filters) -> list[str]:
        flags = [f"-DAGENT_TGID={os.getpid()}"]
        flags += [f"-D{name.upper()}_PAGES={pages}" for name, pages in RING_PAGES.items()]
        flags += [f"-DHAVE_{op}" for op in self.available_syscalls()]
        if filters.tgids:
            flags.append("-DFILTER_TGIDS")
        if filters.cgroup:
            flags.append("-DFILTER_CGROUP")
        return flags

    def load(self, filters: Filters) -> "LoadedSyscalls":
        from bcc import BPF  # only here: importing bcc is the agent's business alone

        bpf = BPF(text=self.program_text().encode(), cflags=self.cflags(filters))
        if filters.tgids:
            table = bpf[b"traced_tgids"]
            for tgid in filters.tgids:
                table[ctypes.c_uint32(tgid)] = ctypes.c_uint8(1)
        if filters.cgroup:
            fd = os.open(filters.cgroup, os.O_RDONLY | os.O_DIRECTORY)
            try:
                bpf[b"cgroup_filter"][0] = fd
            finally:
                os.close(fd)
        return LoadedSyscalls(bpf, self.available_syscalls())


class LoadedSyscalls:
    """The running program: its three rings, loss counters and fd-ignore marks."""

    def __init__(self, bpf, syscalls: list[str]):
        self.bpf = bpf
        self.syscalls = syscalls
        self.sys = self._ring("sys_ring", SYS_EVENT)
        self.paths = self._ring("path_ring", PATH_EVENT)
        self.procs = self._ring("proc_ring", PROC_EVENT)
        self._loss = bpf[b"loss"]
        self._fd_gen = bpf[b"fd_gen"]
        self._fd_ignore = bpf[b"fd_ignore"]
        self._traced = bpf[b"traced_tgids"]
        from bcc.libbcc import lib
        self._lib = lib
        # Per-program run time costs two clock reads per hit; worth it to report our overhead.
        self._stats_was = _read_sysctl(BPF_STATS)
        if self._stats_was is not None and not _write_sysctl(BPF_STATS, "1"):
            self._stats_was = None

    def _ring(self, name: str, layout) -> RingReader:
        return RingReader(self.bpf[name.encode()].map_fd, RING_PAGES[name] * PAGE, layout)

    def read_batch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(syscalls, paths, procs). The syscall ring's position is taken first:
        paths and process events that precede a syscall are then always in the
        same batch or an earlier one."""
        upto = self.sys.producer_position()
        procs = self.procs.read()
        paths = self.paths.read()
        return self.sys.read(upto), paths, procs

    def fill(self) -> float:
        return max(self.sys.fill(), self.paths.fill())

    def loss_totals(self) -> dict[str, int]:
        return {name: int(sum(self._loss[ctypes.c_int(i)])) for i, name in enumerate(LOSS_COUNTERS)}

    def ignore_fd(self, tgid: int, fd: int, gen: int | None) -> None:
        """Stop events for (tgid, fd) while it holds generation `gen`. gen=None is an fd
        opened before tracing began: it is marked only if no open/close happened since."""
        key = ctypes.c_uint64((tgid << 32) | (fd & 0xFFFFFFFF))
        if gen is None:
            gen = ctypes.c_uint64(1)
            # BPF_NOEXIST: if the kernel gave the fd a generation since, that one wins.
            if self._lib.bpf_update_elem(self._fd_gen.map_fd, ctypes.byref(key), ctypes.byref(gen), BPF_NOEXIST):
                return
        else:
            gen = ctypes.c_uint64(gen)
        self._fd_ignore[key] = gen

    def trace_tgid(self, tgid: int) -> None:
        self._traced[ctypes.c_uint32(tgid)] = ctypes.c_uint8(1)

    def bpf_runtime(self) -> dict[str, int | None]:
        """Kernel time spent in our programs (needs kernel.bpf_stats_enabled, set while loaded)."""
        ns = cnt = 0
        for fn in self.bpf.funcs.values():
            try:
                with open(f"/proc/self/fdinfo/{fn.fd}") as f:
                    info = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            ns += int(info.get("run_time_ns", 0))
            cnt += int(info.get("run_cnt", 0))
        on = self._stats_was is not None
        return {"bpf_run_ns": ns if on else None, "bpf_run_cnt": cnt if on else None}

    def close(self) -> None:
        if self._stats_was is not None:
            _write_sysctl(BPF_STATS, self._stats_was)
        for ring in (self.sys, self.paths, self.procs):
            ring.close()
        self.bpf.cleanup()
