"""The triggers' conditions, over the rows of each drain (vectorised over the batch, not per
event), from the same tables `record` writes: blocked_s reads `blocked` and `syscall` rows
(the calls in progress kept from drain to drain); slot_full_s and not_responding read `slots`
and `kmsg` rows, which only a kernel with sunrpc/NFS produces (the VM rig), through the same
code paths.
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
    for a second or more) show, kept from one drain to the next: a call stays blocked until the
    latest snapshot leaves it out, its `syscall` row says it returned, or no snapshot has shown
    it for STALE_NS (they stop when nothing is blocked). Read from one drain's rows alone, the
    condition went false in a drain without a snapshot, and a trigger re-armed by a second of
    that fired again on the call it had already reported."""

    STALE_NS = 3_000_000_000

    def __init__(self):
        self.calls: dict[tuple[int, int], tuple[dict, int]] = {}    # (tid, ts_enter) -> (call, last seen)

    def feed_snapshot(self, blocked: pa.Table | None) -> None:
        if blocked is None or not blocked.num_rows:
            return
        ts = blocked["ts"].to_numpy()
        for i, (tid, ts_enter) in enumerate(zip(blocked["tid"].to_pylist(), blocked["ts_enter"].to_pylist())):
            self.calls[tid, ts_enter] = (_call(blocked, i, in_progress=True), int(ts[i]))
        latest = int(ts.max())
        self.calls = {k: v for k, v in self.calls.items() if v[1] >= latest}

    def feed_returned(self, syscalls: pa.Table | None) -> None:
        if syscalls is None or not syscalls.num_rows or not self.calls:
            return
        for key in zip(syscalls["tid"].to_pylist(), syscalls["ts_enter"].to_pylist()):
            self.calls.pop(key, None)

    def longest(self, now_ns: int) -> tuple[int, dict | None]:
        """How long the longest-blocked call still in progress has been, and that call."""
        self.calls = {k: v for k, v in self.calls.items() if now_ns - v[1] <= self.STALE_NS}
        if not self.calls:
            return 0, None
        call = min((c for c, _ in self.calls.values()), key=lambda c: c["ts_enter"])
        return now_ns - call["ts_enter"], call


class SlotFull:
    """How long each transport's slot table has been full: tasks asleep on xprt_backlog
    (`slots` rows, backlog > 0) since the first such sample, until none waits. A transport's
    waiters are those of all its RPC clients (a mount's nfs and nfsacl clients share it): an
    nfsacl sample with none waiting does not end the nfs client's wait."""

    def __init__(self):
        self.since: dict[str, int] = {}     # server -> ts of the first full sample of this run
        self.waiting: dict[tuple[str, int], int] = {}   # (server, RPC client) -> its last sample's backlog

    def feed(self, slots: pa.Table | None) -> None:
        if slots is None or not slots.num_rows:
            return
        order = np.argsort(slots["ts"].to_numpy(), kind="stable")
        servers, clients = slots["server"].to_pylist(), slots["client_id"].to_pylist()
        ts, backlog = slots["ts"].to_numpy(), slots["backlog"].to_numpy()
        for i in order.tolist():
            self.waiting[servers[i], clients[i]] = int(backlog[i])
            if any(n > 0 for (server, _), n in self.waiting.items() if server == servers[i]):
                self.since.setdefault(servers[i], int(ts[i]))
            else:
                self.since.pop(servers[i], None)

    def longest(self, now_ns: int) -> tuple[int, str | None]:
        if not self.since:
            return 0, None
        server = min(self.since, key=self.since.get)
        return now_ns - self.since[server], server


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
