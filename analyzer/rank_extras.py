"""Per-rank figures the TUI's rank table shows beside analyze()'s: p99 syscall latency, write
calls and their mean size, and the slowest recent syscall, as of the time cursor."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import WRITE_SYSCALLS

from .job import Job
from .ranks import RANK_KEYS, with_identity
from .timeline import syscalls_since_start

RECENT_NS = 5_000_000_000          # "slowest recent": syscalls that ended in the last 5 s


@dataclass(frozen=True)
class SlowCall:
    """The slowest syscall a rank returned from in the seconds before the cursor."""
    syscall: str
    latency_ns: int
    exit_ns: int                     # when it returned, since the capture's start (not "how long
                                     # ago": a row that says the same at every cursor move is not sent again)
    path: str | None


@dataclass(frozen=True)
class RankExtras:
    p99_ns: int | None = None        # of its syscalls' latency
    write_calls: int = 0
    mean_write: float | None = None  # bytes per write call
    slowest_recent: SlowCall | None = None


def _p99_per_group(sc: pa.Table, keys: list[str]) -> dict[tuple, int]:
    """The 99th percentile (the higher value) of latency_ns per group, vectorised: one sort."""
    ordered = sc.select(keys + ["latency_ns"]).sort_by([(k, "ascending") for k in keys]
                                                        + [("latency_ns", "ascending")])
    n = ordered.num_rows
    if n == 0:
        return {}
    cols = [ordered[k] for k in keys]
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for c in cols:
        a = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
        neq = pc.not_equal(a.slice(1), a.slice(0, n - 1))
        # null == null is one group; null vs value is a change
        nulls = pc.xor(pc.is_null(a.slice(1)), pc.is_null(a.slice(0, n - 1)))
        change[1:] |= pc.or_(pc.fill_null(neq, False), nulls).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(change)
    ends = np.append(starts[1:], n)
    sizes = ends - starts
    # numpy's percentile "higher": index ceil(0.99 * (size - 1)) within the sorted group
    pick = starts + np.ceil(0.99 * (sizes - 1)).astype(np.int64)
    lat = ordered["latency_ns"].to_numpy()
    group_keys = zip(*(c.take(pa.array(starts)).to_pylist() for c in cols))
    return {k: int(lat[i]) for k, i in zip(group_keys, pick)}


def rank_extras(job: Job, now_ns: int | None = None, recent_ns: int = RECENT_NS) -> dict[tuple, RankExtras]:
    """Per rank (keyed as rank_key): p99 syscall latency, write calls and mean write size, and
    the slowest syscall that ended in the `recent_ns` before `now_ns` (since capture start;
    None: the end of the data)."""
    sc = syscalls_since_start(job, ["tgid", "syscall", "latency_ns", "bytes", "ts_exit", "path"])
    if sc is None:
        return {}
    sc = with_identity(job, sc)
    keys = RANK_KEYS
    end = now_ns if now_ns is not None else int(pc.max(sc["ts_exit"]).as_py())
    writes = {}
    calls = sc.filter(pc.is_in(sc["syscall"], pa.array(WRITE_SYSCALLS)))
    for g in calls.group_by(keys).aggregate([("bytes", "sum"), ("latency_ns", "count")]).to_pylist():
        n = g["latency_ns_count"]
        writes[(g["host"], g["rank"], g["solo"])] = (n, (g["bytes_sum"] or 0) / n if n else None)
    slowest = {}
    recent = sc.filter(pc.and_(pc.greater(sc["ts_exit"], end - recent_ns), pc.less_equal(sc["ts_exit"], end)))
    recent = recent.sort_by([("latency_ns", "descending")])
    for row in recent.select(keys + ["syscall", "latency_ns", "ts_exit", "path"]).to_pylist():
        key = (row["host"], row["rank"], row["solo"])
        if key not in slowest:
            slowest[key] = SlowCall(row["syscall"], row["latency_ns"], row["ts_exit"], row["path"])
    out = {}
    for key, p99 in _p99_per_group(sc, keys).items():
        n, mean = writes.get(key, (0, None))
        out[key] = RankExtras(p99, n, mean, slowest.get(key))
    return out
