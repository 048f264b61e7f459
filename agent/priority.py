"""The drain's niceness, which follows the load it carries.

At a save's pace the agent keeps the niceness it was started with: it drains in the gaps the
traced processes leave. Raised there, every drain preempted the processes it traces: on the
VM bench's one CPU (bench/README: overhead.py), watch cost a save 3.7% at 1 ns an instruction
raised and 0.5% not. In a storm a ring fills in ~140 ms (1.65 M events/s); on this busy
2-core host a drain at nice 0 waited that long and more for a CPU (20 ms sleeps overshot by
up to 90 ms, a batch's copy took 200 ms), and the kernel's events were lost, not late. So
while a ring fills fast enough to be full within FILL_HORIZON_S, every thread of the agent
runs at DRAIN_NICE, as auditd raises its own (priority_boost); its work is bounded by the
events, so under contention the traced processes give way to their own trace.

A storm's first wakeup finds no history to follow: watch's rings, a quarter of record's, are full
~30 ms after the kernel asks for a drain, and a thread at nice 0 waited longer than that for a
CPU here. So the draining thread sleeps at DRAIN_NICE (it runs at once when woken) and drains at
the agent's own niceness at a save's pace: two setpriority calls a drain. Draining at nice 19
instead cut watch's cost to a save on the VM bench (0.46% to 0.30% at 1 ns an instruction), but
behind CPU-bound ranks (torch's saves under emulation) the drain then waited so long that one
batch held a file's writes and its fd's reuse seconds later, and the writes lost their file
(tests/vm/test_clients.py failed): not done.
"""
from __future__ import annotations

import os
import select
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

DRAIN_NICE = -10
FILL_HORIZON_S = 2.0    # raised while a ring, at the rate it filled since the last drain, would be full within this
CALM_S = 5.0            # and back to the agent's own niceness after this long without
OWN = os.getpriority(os.PRIO_PROCESS, 0)    # the agent's own niceness, as it was started


def filling(fill: float, elapsed: float) -> bool:
    """Whether a ring `fill` full (0..1) `elapsed` s after the last drain emptied it would be
    full within FILL_HORIZON_S at that rate."""
    return fill * FILL_HORIZON_S > elapsed


class DrainPriority:
    def __init__(self):
        """In the draining thread."""
        self.base = OWN
        self.raised = False
        self._busy_at = 0.0
        self._tid = threading.get_native_id()
        self._stop = threading.Event()
        self._guard: threading.Thread | None = None
        self._wake_guard: int | None = None     # written by close(): the guard's poll returns at once
        # Without CAP_SYS_NICE (as in a container) the niceness stays as it is.
        self.allowed = _renice_thread(DRAIN_NICE) and _renice_thread(self.base)

    def guard(self, fds: list[int], storm: Callable[[], bool]) -> None:
        """Rouse the drain when one of `fds` (the rings, edge-triggered) signals during a drain at
        the agent's own niceness and `storm()` says a ring fills fast: a storm may start during a
        calm drain, which on a saturated host waits for a CPU (at nice 19, tried, 1 of 4 storms
        lost 721,485 of 835,135 events, with 3 CPU-bound loops and two VMs on 2 cores). A thread
        of its own at DRAIN_NICE, idle but for the kernel's forced wakeups. Most of those at a
        save's pace are a new program's (bpf/common.h: urgent), with the rings nearly empty: a
        drain raised for them held the VM bench's one CPU from the ranks."""
        if not self.allowed:
            return
        poll = select.epoll()
        for fd in fds:
            poll.register(fd, select.EPOLLIN | select.EPOLLET)
        stop_r, self._wake_guard = os.pipe2(os.O_CLOEXEC)
        poll.register(stop_r, select.EPOLLIN)

        def run():
            _renice_thread(DRAIN_NICE)
            while True:
                woken = poll.poll()
                if self._stop.is_set():
                    break
                if woken and storm():
                    try:
                        os.setpriority(os.PRIO_PROCESS, self._tid, DRAIN_NICE)
                    except OSError:
                        pass
            poll.close()
            os.close(stop_r)
        self._guard = threading.Thread(target=run, name="drain-guard", daemon=True)
        self._guard.start()

    def close(self) -> None:
        """The guard stopped and the draining thread (every thread, if raised) back at the agent's
        own niceness: an agent used in-process (the live tests, bench/) leaves its caller's
        thread as it found it."""
        self._stop.set()
        if self._guard is not None:
            os.write(self._wake_guard, b"x")
            self._guard.join()
            os.close(self._wake_guard)
            self._guard = None
        if not self.allowed:
            return
        if self.raised:
            _renice(self.base)
            self.raised = False
        else:
            try:
                os.setpriority(os.PRIO_PROCESS, self._tid, self.base)
            except OSError:     # the draining thread has ended
                pass

    def sleeping(self) -> None:
        """Before the draining thread waits: it wakes at DRAIN_NICE."""
        if self.allowed and not self.raised:
            _renice_thread(DRAIN_NICE)

    def follow(self, fill: float, elapsed: float, now: float) -> None:
        """Before a drain, in the draining thread: the fullest ring's `fill`, `elapsed` s after
        the last drain."""
        if filling(fill, elapsed):
            self._busy_at = now
            if not self.raised and self.allowed:
                self.raised = _renice(DRAIN_NICE)
        elif self.raised and now - self._busy_at >= CALM_S:
            _renice(self.base)
            self.raised = False
        elif not self.raised and self.allowed:
            _renice_thread(self.base)


@contextmanager
def unpreempted() -> Iterator[None]:
    """The calling thread at SCHED_FIFO for the block: the agent's long map syscalls (a batch read
    of a whole array, the per-CPU counters). A map syscall raises bpf_prog_active on its CPU with
    only migration disabled, and a kernel that preempts in kernel code (PREEMPT_LAZY or FULL:
    Debian's 7.x, not its 5.10 to 6.12) can switch the agent out there: until it runs again every
    probe on that CPU is skipped, and nothing counts it. On the VM's one CPU with 7.3 that lost an
    RPC's end, the next WRITE whole and a write's fsync (the per-second batch read of the in-flight
    calls takes milliseconds under emulation). Kept to the syscalls themselves: a block of Python
    at SCHED_FIFO would hold the CPU from the traced processes. Without CAP_SYS_NICE the thread
    stays as it is; after, it is back at the policy it had (started under chrt --batch, say)."""
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)    # its niceness is kept


def as_own() -> None:
    """The calling thread to the agent's own niceness: a thread starts at its creator's, and the
    draining thread's may be DRAIN_NICE (an incident's writing and analysis are not the drain's:
    they start from it)."""
    _renice_thread(OWN)


def _renice(nice: int) -> bool:
    """Every thread of this process to `nice` (Linux's niceness is per thread). -> whether allowed."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except ProcessLookupError:      # a thread that has ended
            continue
        except PermissionError:
            return False
    return True


def _renice_thread(nice: int) -> bool:
    """The calling thread alone to `nice`. -> whether allowed."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        return False
    return True
