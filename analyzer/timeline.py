"""A job as of a point in time: the time cursor of the TUI (live and replay alike).

Times here are nanoseconds since each capture's start (meta.json "start" monotonic_ns), so
captures from several nodes line up on one axis. `JobSource` reads each table once and keeps
it until `refresh()` (the TUI refreshes when it polls a capture that is still being written;
only segments that are new since the last read are read); `at(until_ns)` is a Job whose
tables hold only the rows up to the cursor, so every analyzer function (rank_table,
analyze...) answers "as of then" without a second copy of its logic.

What the TUI shows beyond analyze() is computed here too, headless, from the analyzer's own
functions: per-rank extras (p99 syscall latency, what a rank is blocked in right now), one
rank's drill-down (its files, and its RPCs split per procedure with rpcs.by_proc over the
attributed rows), and the slot occupancy and link series of transport_table() binned on the
capture's time axis.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.meta import start_ns
from slotscope.capture.reader import Capture, SegmentCache
from slotscope.capture.syscalls import WRITE_SYSCALLS

from .analysis import analyze
from .attribution import attributed_rpcs
from .job import Job
from .ranks import RANK_KEYS, rank_key, with_identity
from .rpcs import by_proc
from .transports import transport_table

# The column that places a row in time; "ts" when not listed. Syscall and RPC rows are written
# when they end, so as of a cursor only the ones that had ended are known.
TIME_COLUMN = {"syscall": "ts_exit", "rpc": "ts_end"}
# The columns that say how far a capture reaches (its newest row), per table.
END_COLUMNS = {"syscall": "ts_exit", "rpc": "ts_end", "blocked": "ts", "agent": "ts", "slots": "ts",
               "netdev": "ts", "loss": "ts"}
RECENT_NS = 5_000_000_000          # "slowest recent": syscalls that ended in the last 5 s
SNAPSHOT_FRESH_NS = 2_000_000_000  # a blocked snapshot older than this says nothing about "now"
BLOCKED_SHOWN_NS = 100_000_000     # a call in progress for less than this is not "blocked"


@dataclass
class CaptureAt:
    """A capture seen up to `until_ns` after its start (None: everything); reads are cached."""
    capture: Capture
    until_ns: int | None = None
    cache: dict = field(default_factory=dict)
    segments: SegmentCache | None = None

    @property
    def path(self) -> str:
        return self.capture.path

    @property
    def whole(self) -> bool:
        return self.until_ns is None

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
            if self.segments is not None:
                self.cache[table] = self.segments.read(self.capture, table)
            else:
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
        """The latest time in the capture, since its start: its stop, else its newest row of any
        table (the agent's once-a-second rows keep a live capture's end moving even when every
        traced call is stuck)."""
        stop = (self.meta.get("stop") or {}).get("monotonic_ns")
        ends = [int(stop)] if stop else []
        if not stop:
            for table, col in END_COLUMNS.items():
                t = self.full(table)
                if t is not None and t.num_rows and col in t.column_names:
                    newest = pc.max(t[col]).as_py()
                    if newest is not None:
                        ends.append(int(newest))
        return max(ends, default=start_ns(self.meta)) - start_ns(self.meta)


class JobSource:
    """The captures of a job, re-read on refresh(): new segments, and meta.json's stop record.
    `generation` counts the refreshes that found something new."""

    def __init__(self, job: Job):
        self.views = []
        for c in job.captures:
            segments = SegmentCache()
            self.views.append(CaptureAt(c, segments=segments))
        self.generation = 0
        self._series: dict = {}

    def refresh(self) -> bool:
        """Re-read the live captures; True when something changed."""
        fresh, changed = [], False
        for v in self.views:
            if not v.live:
                fresh.append(v)
                continue
            cap = Capture.open(v.path)
            cap.problems = v.capture.problems
            view = CaptureAt(cap, segments=v.segments)
            before = {name: v.segments.seen(name) for name in v.segments.tables}
            changed |= cap.meta != v.capture.meta
            for name in before:
                view.full(name)
                changed |= v.segments.seen(name) != before[name]
            for name in cap.tables():
                if name not in before and cap.segments(name):
                    changed = True
            fresh.append(view)
        self.views = fresh
        if changed:
            self.generation += 1
            self._series.clear()
        return changed

    @property
    def live(self) -> bool:
        return any(v.live for v in self.views)

    def span_ns(self) -> int:
        return max((v.last_ns() for v in self.views), default=0)

    def updated_at(self) -> float | None:
        """Wall-clock time of the newest segment read (how fresh a live capture is)."""
        newest = max((v.segments.newest_mtime for v in self.views if v.segments), default=0.0)
        return newest or None

    def at(self, until_ns: int | None) -> Job:
        return Job([CaptureAt(v.capture, until_ns, v.cache, v.segments) for v in self.views])

    def series(self, bins: int) -> list[dict]:
        """transport_series() of everything read so far, cached until the capture grows."""
        key = bins
        if key not in self._series:
            self._series[key] = transport_series(self.at(None), self.span_ns(), bins)
        return self._series[key]



def _syscalls(job: Job, columns: list[str]) -> pa.Table | None:
    """The syscall rows of every capture: `columns`, `host`, `syscall` as a string, and
    ts_exit in ns since the capture's start."""
    parts = []
    for cap in job.captures:
        t = cap.read("syscall")
        if t is not None:
            t = t.select(columns)
            i = t.schema.get_field_index("ts_exit")
            t = t.set_column(i, "ts_exit", pc.subtract(pc.cast(t["ts_exit"], pa.int64()), start_ns(cap.meta)))
            parts.append(t.append_column("host", pa.array([cap.meta.get("host", "?")] * t.num_rows, pa.string())))
    if not parts:
        return None
    sc = pa.concat_tables(parts, promote_options="permissive")
    return sc.set_column(sc.schema.get_field_index("syscall"), "syscall", pc.cast(sc["syscall"], pa.string()))


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


def rank_extras(job: Job, now_ns: int | None = None, recent_ns: int = RECENT_NS) -> dict[tuple, dict]:
    """Per rank (keyed as rank_key): p99 syscall latency, write calls and mean write size, and
    the slowest syscall that ended in the `recent_ns` before `now_ns` (since capture start;
    None: the end of the data)."""
    sc = _syscalls(job, ["tgid", "syscall", "latency_ns", "bytes", "ts_exit", "path"])
    if sc is None:
        return {}
    sc = with_identity(job, sc)
    keys = RANK_KEYS
    end = now_ns if now_ns is not None else int(pc.max(sc["ts_exit"]).as_py())
    out: dict[tuple, dict] = {}
    for key, p99 in _p99_per_group(sc, keys).items():
        out[key] = {"p99_ns": p99, "write_calls": 0, "mean_write": None, "slowest_recent": None}
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
    return out


def in_progress(job: Job, everything: Job | None, now_ns: int, fresh_ns: int = SNAPSHOT_FRESH_NS,
                min_ns: int = BLOCKED_SHOWN_NS) -> pa.Table | None:
    """The traced syscalls in progress at `now_ns` (since capture start) for at least `min_ns`,
    one row per call, with the rank identity (with_identity) and `age_ns`, the longest first.

    Two sources: the agent's `blocked` snapshots (calls in progress for over a second, about
    every second: the latest snapshot at or before the cursor, if within `fresh_ns` of it; age
    as of the snapshot); and, when `everything` (the whole job, past the cursor) is given, the
    syscall rows that began before the cursor and returned after it (rows are written when a
    call returns, so in replay they show what a rank was stuck in then; age as of the cursor)."""
    parts = []
    hosts = []
    for i, cap in enumerate(job.captures):
        host = cap.meta.get("host", "?")
        cut = start_ns(cap.meta) + now_ns
        snaps = cap.read("blocked")
        if snaps is not None:
            snaps = snaps.filter(pc.less_equal(snaps["ts"], cut))
        if snaps is not None and snaps.num_rows:
            latest = pc.max(snaps["ts"]).as_py()
            if latest >= cut - fresh_ns:
                s = snaps.filter(pc.equal(snaps["ts"], latest))
                parts.append(pa.table({
                    "tgid": pc.cast(s["tgid"], pa.uint32()), "tid": pc.cast(s["tid"], pa.uint32()),
                    "syscall": pc.cast(s["syscall"], pa.string()), "path": s["path"],
                    "ts_enter": pc.cast(s["ts_enter"], pa.int64()),
                    "age_ns": pc.subtract(pa.scalar(latest, pa.int64()), pc.cast(s["ts_enter"], pa.int64())),
                    "source": pa.array(["snapshot"] * s.num_rows, pa.string())}))
                hosts.append((host, s.num_rows))
        if everything is not None:
            sc = everything.captures[i].read("syscall")
            if sc is not None:
                enter, leave = pc.cast(sc["ts_enter"], pa.int64()), pc.cast(sc["ts_exit"], pa.int64())
                span = sc.filter(pc.and_(pc.less_equal(enter, cut - min_ns), pc.greater(leave, cut)))
                if span.num_rows:
                    enter = pc.cast(span["ts_enter"], pa.int64())
                    parts.append(pa.table({
                        "tgid": pc.cast(span["tgid"], pa.uint32()), "tid": pc.cast(span["tid"], pa.uint32()),
                        "syscall": pc.cast(span["syscall"], pa.string()), "path": span["path"],
                        "ts_enter": enter, "age_ns": pc.subtract(pa.scalar(cut, pa.int64()), enter),
                        "source": pa.array(["trace"] * span.num_rows, pa.string())}))
                    hosts.append((host, span.num_rows))
    if not parts:
        return None
    t = pa.concat_tables(parts)
    t = t.append_column("host", pa.array([h for h, n in hosts for _ in range(n)], pa.string()))
    t = t.filter(pc.greater_equal(t["age_ns"], min_ns))
    if not t.num_rows:
        return None
    # one row per call (a call can be in a snapshot and in the trace): the longest age wins
    t = t.sort_by([("age_ns", "descending")])
    seen, keep = set(), []
    for k in zip(t["host"].to_pylist(), t["tid"].to_pylist(), t["ts_enter"].to_pylist()):
        keep.append(k not in seen)
        seen.add(k)
    t = t.filter(pa.array(keep))
    return with_identity(job, t).sort_by([("age_ns", "descending"), ("tid", "ascending")])


def blocked_now(calls: pa.Table | None) -> dict[tuple, dict]:
    """Per rank (rank_key): the longest call it is blocked in (syscall, path, age_ns, source)
    and how many of its calls are in progress."""
    out: dict[tuple, dict] = {}
    if calls is None:
        return out
    for row in calls.select(RANK_KEYS + ["syscall", "path", "age_ns", "source"]).to_pylist():
        key = (row["host"], row["rank"], row["solo"])
        if key in out:
            out[key]["calls"] += 1
            continue
        out[key] = {"syscall": row["syscall"], "path": row["path"], "age_ns": row["age_ns"],
                    "source": row["source"], "calls": 1}
    return out


def rank_detail(job: Job, host: str, pids: list[int], calls: pa.Table | None = None) -> dict:
    """One rank's drill-down, as of the job's cursor: the files it wrote or touched (bytes
    written, calls, time in them), its RPCs split per procedure (rpcs.by_proc over the
    attributed rows: direct, or by the file written back), and the calls it is blocked in."""
    detail = {"files": [], "rpc": {"by_proc": {}, "attribution": {}}, "blocked": []}
    sc = _syscalls(job, ["tgid", "syscall", "latency_ns", "bytes", "ts_exit", "path"])
    mine = pa.array(pids, pa.uint32())
    if sc is not None:
        sc = sc.filter(pc.and_(pc.equal(sc["host"], host), pc.is_in(pc.cast(sc["tgid"], pa.uint32()), mine)))
        sc = sc.append_column("wbytes", pc.if_else(pc.is_in(sc["syscall"], pa.array(WRITE_SYSCALLS)),
                                                   pc.coalesce(sc["bytes"], 0), 0))
        files = sc.filter(pc.is_valid(sc["path"])).group_by(["path"]).aggregate(
            [("wbytes", "sum"), ("latency_ns", "count"), ("latency_ns", "sum"), ("latency_ns", "max")])
        for g in files.sort_by([("wbytes_sum", "descending"), ("path", "ascending")]).to_pylist():
            detail["files"].append({"path": g["path"], "bytes": g["wbytes_sum"], "calls": g["latency_ns_count"],
                                    "total_ns": g["latency_ns_sum"], "max_ns": g["latency_ns_max"]})
    rpc = attributed_rpcs(job)
    if rpc is not None:
        rpc = rpc.filter(pc.and_(pc.equal(rpc["host"], host),
                                 pc.fill_null(pc.is_in(rpc["attributed_tgid"], mine), False)))
        if rpc.num_rows:
            detail["rpc"]["by_proc"] = by_proc(rpc)
            counts = pc.value_counts(rpc["attribution"])
            detail["rpc"]["attribution"] = dict(zip(counts.field("values").to_pylist(),
                                                    counts.field("counts").to_pylist()))
    if calls is not None:
        c = calls.filter(pc.and_(pc.equal(calls["host"], host), pc.is_in(calls["tgid"], mine)))
        detail["blocked"] = c.select(["tid", "syscall", "path", "age_ns", "source"]).to_pylist()
    return detail


# ---- the transports' time series, binned on the capture's axis ----

def step_mean(ts: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time-weighted mean per bin of a step function: values[i] holds from ts[i] (sorted) to
    ts[i + 1], the last one on; 0 before ts[0]."""
    if ts.size == 0:
        return np.zeros(edges.size - 1)
    v = values.astype(float)
    area = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(ts).astype(float))))
    k = np.searchsorted(ts, edges, side="right") - 1
    kk = np.clip(k, 0, None)
    integral = np.where(k < 0, 0.0, area[kk] + v[kk] * (edges - ts[kk]).astype(float))
    return np.diff(integral) / np.maximum(np.diff(edges).astype(float), 1.0)


def step_max(ts: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The largest value in force at some time inside each bin of a step function."""
    out = np.zeros(edges.size - 1)
    if ts.size == 0:
        return out
    first = np.searchsorted(ts, edges[:-1], side="right") - 1      # in force at the bin's start
    last = np.searchsorted(ts, edges[1:], side="left")             # steps starting before its end
    for i in range(out.size):
        lo, hi = max(first[i], 0), max(last[i], first[i] + 1)
        if hi > lo:
            out[i] = values[lo:hi].max()
    return out


def transport_series(job: Job, span_ns: int, bins: int) -> list[dict]:
    """Per transport of transport_table(): slot occupancy (mean and peak in use per bin, mean
    waiting for a slot) against its limit, and the link's mean rate out and in per bin against
    its capacity, on `bins` equal bins from the capture's start to `span_ns`."""
    if bins <= 0 or span_ns <= 0:
        return []
    edges = np.linspace(0, span_ns, bins + 1).astype(np.int64)
    out = []
    for t in transport_table(job, None):
        cap = next(c for c in job.captures if c.meta.get("host", "?") == t["host"])
        to_axis = job.utc_offset_ns(t["host"]) + start_ns(cap.meta)      # UTC ns -> since start
        limit = t["max_slots"] if not t["session_slots"] else min(t["max_slots"] or 1 << 30, t["session_slots"])
        entry = {"host": t["host"], "server": t["server"], "limit": limit, "bins": bins, "span_ns": span_ns,
                 "in_use": None, "in_use_peak": None, "waiting": None, "peak_in_use": None, "waiting_peak": None,
                 "link": None}
        occ = t.get("_occupancy")
        if occ is not None:
            ts = occ.ts - to_axis
            in_use = occ.cols["in_use"]
            waiting = occ.cols["backlog"] + occ.cols["session_wait"]
            entry.update(in_use=step_mean(ts, in_use, edges).tolist(),
                         in_use_peak=step_max(ts, in_use, edges).tolist(),
                         waiting=step_mean(ts, waiting, edges).tolist(),
                         peak_in_use=int(in_use.max()), waiting_peak=int(waiting.max()))
        link = t["link"]
        if link and link.get("_series") is not None and len(link["_series"][0]):
            ends, tx, rx = link["_series"]
            ends = np.asarray(ends, dtype=np.int64) - to_axis
            # each rate holds over the interval before its sample; the first as long as the next
            first = ends[0] - (ends[1] - ends[0] if ends.size > 1 else 1_000_000_000)
            starts = np.concatenate(([first], ends[:-1]))
            ts = np.concatenate((starts, [ends[-1]]))
            entry["link"] = {
                "iface": link["iface"], "speed_bps": link["speed_bps"], "peak_bps": link["peak_bps"],
                "tx": step_mean(ts, np.append(np.asarray(tx, float), 0.0), edges).tolist(),
                "rx": step_mean(ts, np.append(np.asarray(rx, float), 0.0), edges).tolist(),
            }
        out.append(entry)
    return out


def overview(source: JobSource, until_ns: int | None, version: str, bins: int = 0,
             detail: tuple[str, list[int]] | None = None) -> dict:
    """analyze() as of the cursor, its ranks extended with rank_extras() and blocked_now(),
    the time axis, the transports' series on `bins` bins (0: none), and, for `detail`
    (host, pids), that rank's drill-down."""
    job = source.at(until_ns)
    span = source.span_ns()
    cursor = span if until_ns is None else min(until_ns, span)
    result = analyze(job, version)
    extras = rank_extras(job, now_ns=cursor)
    calls = in_progress(job, source.at(None) if until_ns is not None else None, cursor)
    blocked = blocked_now(calls)
    empty = {"p99_ns": None, "write_calls": 0, "mean_write": None, "slowest_recent": None}
    for r in result["ranks"]:
        r.update(extras.get(rank_key(r), empty))
        r["blocked_now"] = blocked.get(rank_key(r))
    result["timeline"] = {"cursor_ns": cursor, "span_ns": span, "live": source.live,
                          "read_at": time.time(), "updated_at": source.updated_at(),
                          "generation": source.generation}
    result["series"] = source.series(bins) if bins else []
    result["detail"] = rank_detail(job, detail[0], detail[1], calls) if detail else None
    result["has_rpc"] = any(v.full("rpc") is not None for v in source.views)
    return result
