"""The triggers' conditions. blocked_s reads the `blocked` snapshots (the traced calls in
progress, kept from one snapshot to the next), the kernel's longest call on a traced fd of the
interval (aggregates.py) and the rows of the calls that name a path; slot_full_s reads when
each server's slot table became full (the kernel's, aggregates.py); not_responding reads the
`kmsg` rows, slow_save the saves' clock. Only a kernel with sunrpc/NFS (the VM rig) feeds
slot_full_s and not_responding, through the same code paths.
"""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .triggers import MIN_EARLIER_SAVES


def returned_blocked(syscalls: pa.Table | None) -> tuple[int, dict | None]:
    """The longest a traced call that returned in these `syscall` rows was blocked (ns), and
    that call (the calls still in progress: Blocked)."""
    if syscalls is None or not syscalls.num_rows:
        return 0, None
    i = int(pc.index(syscalls["latency_ns"], pc.max(syscalls["latency_ns"])).as_py())
    return int(syscalls["latency_ns"][i].as_py()), _call(syscalls, i, in_progress=False)


def _call(rows: pa.Table, i: int, in_progress: bool) -> dict:
    row = rows.slice(i, 1).select(["tgid", "syscall", "path", "ts_enter"]).to_pylist()[0]
    return {**row, "syscall": str(row["syscall"]), "in_progress": in_progress}


class Blocked:
    """The calls in progress that the `blocked` snapshots (one a second, of every call blocked
    for a second or more) show: a call stays blocked until a snapshot leaves it out (None: a
    snapshot with nothing blocked). Read from one drain's rows alone, the condition went false
    in a drain without a snapshot, and a trigger re-armed by a second of that fired again on
    the call it had already reported."""

    def __init__(self):
        self.calls: dict[tuple[int, int], dict] = {}    # (tid, ts_enter) -> call

    def feed_snapshot(self, blocked: pa.Table | None) -> None:
        self.calls = {}
        if blocked is None:
            return
        for i, (tid, ts_enter) in enumerate(zip(blocked["tid"].to_pylist(), blocked["ts_enter"].to_pylist())):
            self.calls[tid, ts_enter] = _call(blocked, i, in_progress=True)

    def longest(self, now_ns: int) -> tuple[int, dict | None]:
        """How long the longest-blocked call still in progress has been, and that call."""
        if not self.calls:
            return 0, None
        call = min(self.calls.values(), key=lambda c: c["ts_enter"])
        return now_ns - call["ts_enter"], call


def longest_full(full_since: dict[str, int], now_ns: int) -> tuple[int, str | None]:
    """How long the server whose slot table has been full the longest has been, and which."""
    if not full_since:
        return 0, None
    server = min(full_since, key=full_since.get)
    return now_ns - full_since[server], server


NOT_RESPONDING = re.compile(r"server (\S+) not responding")


def not_responding(kmsg: pa.Table | None) -> str | None:
    """The first 'server X not responding' line of these kernel log rows (the NFS client's
    hard-mount message; 'still trying' or 'timed out' follows it), or None."""
    if kmsg is None or not kmsg.num_rows:
        return None
    hits = kmsg.filter(pc.match_substring_regex(kmsg["message"], NOT_RESPONDING.pattern))
    return hits["message"][0].as_py() if hits.num_rows else None


def slow_save(durations_s: list[float], factor: float) -> bool:
    """Whether the last save took at least `factor` times the median of those before it
    (with at least MIN_EARLIER_SAVES of them)."""
    if len(durations_s) <= MIN_EARLIER_SAVES:
        return False
    return durations_s[-1] >= factor * float(np.median(durations_s[:-1]))
