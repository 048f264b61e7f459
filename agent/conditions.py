"""The triggers' conditions, each over the rows of one drain (vectorised over the batch, not
per event), from the same tables `record` writes: blocked_s reads `blocked` and `syscall`
rows; slot_full_s and not_responding read `slots` and `kmsg` rows, which only a kernel with
sunrpc/NFS produces (the VM rig), through the same code paths.
"""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .triggers import MIN_EARLIER_SAVES


def blocked_for(blocked: pa.Table | None, syscalls: pa.Table | None) -> tuple[int, dict | None]:
    """The longest a traced call has been blocked in these rows (ns), and that call: the
    `blocked` snapshot's calls in progress and the `syscall` rows of calls that returned."""
    best, call = 0, None
    if blocked is not None and blocked.num_rows:
        ages = pc.subtract(blocked["ts"], blocked["ts_enter"])
        i = int(pc.index(ages, pc.max(ages)).as_py())
        best, call = int(ages[i].as_py()), _call(blocked, i, in_progress=True)
    if syscalls is not None and syscalls.num_rows:
        i = int(pc.index(syscalls["latency_ns"], pc.max(syscalls["latency_ns"])).as_py())
        if syscalls["latency_ns"][i].as_py() > best:
            best, call = int(syscalls["latency_ns"][i].as_py()), _call(syscalls, i, in_progress=False)
    return best, call


def _call(rows: pa.Table, i: int, in_progress: bool) -> dict:
    row = rows.slice(i, 1).select(["tgid", "syscall", "path", "ts_enter"]).to_pylist()[0]
    return {**row, "syscall": str(row["syscall"]), "in_progress": in_progress}


class SlotFull:
    """How long each transport's slot table has been full: tasks asleep on xprt_backlog
    (`slots` rows, backlog > 0) since the first such sample, until one shows none waiting."""

    def __init__(self):
        self.since: dict[str, int] = {}     # server -> ts of the first full sample of this run

    def feed(self, slots: pa.Table | None) -> None:
        if slots is None or not slots.num_rows:
            return
        order = np.argsort(slots["ts"].to_numpy(), kind="stable")
        servers = slots["server"].to_pylist()
        ts, backlog = slots["ts"].to_numpy(), slots["backlog"].to_numpy()
        for i in order.tolist():
            if backlog[i] > 0:
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
