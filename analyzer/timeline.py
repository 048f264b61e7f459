"""A job as of a point in time: the time cursor of the TUI (live and replay alike).

Times here are nanoseconds since each capture's start (meta.json "start" monotonic_ns), so
captures from several nodes line up on one axis. `JobSource` reads each table once and keeps
it until `refresh()` (the TUI refreshes when it polls a capture that is still being written);
`at(until_ns)` is a Job whose tables hold only the rows up to the cursor, so every analyzer
function (rank_table, analyze...) answers "as of then" without a second copy of its logic.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .analysis import analyze
from .capture import Capture
from .job import WRITE_SYSCALLS, Job
from .ranks import RANK_KEYS, with_identity

# The column that places a row in time; "ts" when not listed.
TIME_COLUMN = {"syscall": "ts_exit"}
RECENT_NS = 5_000_000_000          # "slowest recent": syscalls that ended in the last 5 s


def start_ns(meta: dict) -> int:
    return int((meta.get("start") or {}).get("monotonic_ns") or 0)


@dataclass
class CaptureAt:
    """A capture seen up to `until_ns` after its start (None: everything); reads are cached."""
    capture: Capture
    until_ns: int | None = None
    cache: dict = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.capture.path

    @property
    def meta(self) -> dict:
        return self.capture.meta

    @property
    def problems(self) -> list[str]:
        return self.capture.problems

    @property
    def live(self) -> bool:
        return self.capture.live

    def full(self, table: str) -> pa.Table | None:
        if table not in self.cache:
            self.cache[table] = self.capture.read(table)
        return self.cache[table]

    def read(self, table: str, include_partial: bool = False) -> pa.Table | None:
        t = self.full(table)
        if t is None or self.until_ns is None:
            return t
        col = TIME_COLUMN.get(table, "ts")
        if col not in t.column_names:
            return t
        cut = start_ns(self.meta) + self.until_ns
        t = t.filter(pc.less_equal(t[col], pa.scalar(cut, t.schema.field(col).type)))
        return t if t.num_rows else None

    def last_ns(self) -> int:
        """The latest time in the capture, since its start: its stop, else its newest syscall."""
        stop = (self.meta.get("stop") or {}).get("monotonic_ns")
        ends = [int(stop)] if stop else []
        sc = self.full("syscall")
        if sc is not None and sc.num_rows:
            ends.append(int(pc.max(sc["ts_exit"]).as_py()))
        return max(ends, default=start_ns(self.meta)) - start_ns(self.meta)


class JobSource:
    """The captures of a job, re-read on refresh(): new segments, and meta.json's stop record."""

    def __init__(self, job: Job):
        self.views = [CaptureAt(c) for c in job.captures]

    def refresh(self) -> None:
        fresh = []
        for v in self.views:
            cap = Capture.open(v.path) if v.live else v.capture
            cap.problems = v.capture.problems
            fresh.append(CaptureAt(cap, cache={} if v.live else v.cache))
        self.views = fresh

    @property
    def live(self) -> bool:
        return any(v.live for v in self.views)

    def span_ns(self) -> int:
        return max((v.last_ns() for v in self.views), default=0)

    def at(self, until_ns: int | None) -> Job:
        return Job([CaptureAt(v.capture, until_ns, v.cache) for v in self.views])


def rank_key(r: dict) -> tuple:
    """The identity of a rank_table entry: (host, rank, pid of a process without a rank)."""
    return (r["host"], r["rank"], r["pids"][0] if r["rank"] is None else None)


def rank_extras(job: Job, now_ns: int | None = None, recent_ns: int = RECENT_NS) -> dict[tuple, dict]:
    """Per rank (keyed as rank_key): p99 syscall latency, write calls and mean write size, the
    slowest syscall that ended in the `recent_ns` before `now_ns` (since capture start; None: the
    end of the data), and the files written or touched with their bytes."""
    parts = []
    for cap in job.captures:
        t = cap.read("syscall")
        if t is not None:
            t = t.select(["tgid", "syscall", "latency_ns", "bytes", "ts_exit", "path"])
            t = t.set_column(4, "ts_exit", pc.subtract(pc.cast(t["ts_exit"], pa.int64()), start_ns(cap.meta)))
            parts.append(t.append_column("host", pa.array([cap.meta.get("host", "?")] * t.num_rows, pa.string())))
    if not parts:
        return {}
    sc = pa.concat_tables(parts, promote_options="permissive")
    sc = sc.set_column(sc.schema.get_field_index("syscall"), "syscall", pc.cast(sc["syscall"], pa.string()))
    sc = with_identity(job, sc)
    keys = RANK_KEYS
    end = now_ns if now_ns is not None else int(pc.max(sc["ts_exit"]).as_py())
    out: dict[tuple, dict] = {}
    for g in sc.group_by(keys).aggregate([("latency_ns", "list")]).to_pylist():
        lat = np.asarray(g["latency_ns_list"], dtype=np.int64)
        out[(g["host"], g["rank"], g["solo"])] = {
            "p99_ns": int(np.percentile(lat, 99, method="higher")) if lat.size else None,
            "write_calls": 0, "mean_write": None, "slowest_recent": None, "files": [],
        }
    writes = sc.filter(pc.is_in(sc["syscall"], pa.array(WRITE_SYSCALLS)))
    for g in writes.group_by(keys).aggregate([("bytes", "sum"), ("latency_ns", "count")]).to_pylist():
        e = out[(g["host"], g["rank"], g["solo"])]
        e["write_calls"] = g["latency_ns_count"]
        e["mean_write"] = (g["bytes_sum"] or 0) / g["latency_ns_count"] if g["latency_ns_count"] else None
    recent = sc.filter(pc.and_(pc.greater(sc["ts_exit"], end - recent_ns), pc.less_equal(sc["ts_exit"], end)))
    recent = recent.sort_by([("latency_ns", "descending")])
    for row in recent.select(keys + ["syscall", "latency_ns", "ts_exit", "path"]).to_pylist():
        e = out[(row["host"], row["rank"], row["solo"])]
        if e["slowest_recent"] is None:
            e["slowest_recent"] = {"syscall": row["syscall"], "latency_ns": row["latency_ns"],
                                   "ago_ns": end - row["ts_exit"], "path": row["path"]}
    sc = sc.append_column("wbytes", pc.if_else(pc.is_in(sc["syscall"], pa.array(WRITE_SYSCALLS)),
                                               pc.coalesce(sc["bytes"], 0), 0))
    files = sc.filter(pc.is_valid(sc["path"])).group_by(keys + ["path"]).aggregate(
        [("wbytes", "sum"), ("latency_ns", "count"), ("latency_ns", "sum")])
    for g in files.sort_by([("wbytes_sum", "descending"), ("path", "ascending")]).to_pylist():
        out[(g["host"], g["rank"], g["solo"])]["files"].append(
            {"path": g["path"], "bytes": g["wbytes_sum"], "calls": g["latency_ns_count"],
             "total_ns": g["latency_ns_sum"]})
    return out


def overview(source: JobSource, until_ns: int | None, version: str) -> dict:
    """analyze() as of the cursor, its ranks extended with rank_extras, and the time axis."""
    job = source.at(until_ns)
    span = source.span_ns()
    cursor = span if until_ns is None else min(until_ns, span)
    result = analyze(job, version)
    extras = rank_extras(job, now_ns=cursor)
    empty = {"p99_ns": None, "write_calls": 0, "mean_write": None, "slowest_recent": None, "files": []}
    for r in result["ranks"]:
        r.update(extras.get(rank_key(r), empty))
    result["timeline"] = {"cursor_ns": cursor, "span_ns": span, "live": source.live,
                          "read_at": time.time()}
    result["has_rpc"] = any(v.full("rpc") is not None for v in source.views)
    return result
