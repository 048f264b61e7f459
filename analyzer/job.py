"""One or many captures (one per node) as one job: tables stacked with their host."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.meta import utc_offset_ns
from slotscope.capture.reader import Capture, open_captures

def iso_utc(ns: int | None) -> str | None:
    from datetime import datetime, timezone
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat(timespec="milliseconds")


def utc_ns(iso: str | None) -> int | None:
    """An ISO 8601 time (without a zone it is UTC) -> UTC ns, exact to the microsecond; the
    inverse of iso_utc(). ValueError when it is not one."""
    from datetime import datetime, timezone
    if iso is None:
        return None
    when = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def with_host(t: pa.Table, host: str) -> pa.Table:
    return t.append_column("host", pa.array([host], pa.string()).take(pa.array(np.zeros(t.num_rows, np.int32))))


def partition(t: pa.Table, keys: list[str]) -> dict[tuple, pa.Table]:
    """The rows of each value of the `keys` columns (none null), in their order: taken apart
    in one pass, where a filter per value reads every row once per value (per host of a job of
    1,000 nodes: quadratic)."""
    key = t[keys[0]] if len(keys) == 1 else pc.binary_join_element_wise(*(t[k] for k in keys), "\0")
    codes = pc.dictionary_encode(key).combine_chunks()
    indices = codes.indices.to_numpy()
    order = np.argsort(indices, kind="stable")
    rows = t.take(order)
    bounds = np.searchsorted(indices[order], np.arange(len(codes.dictionary) + 1))
    names = codes.dictionary.to_pylist()
    return {(tuple(k.split("\0")) if len(keys) > 1 else (k,)): rows.slice(a, b - a)
            for k, a, b in zip(names, bounds[:-1].tolist(), bounds[1:].tolist())}


@dataclass
class Job:
    captures: list[Capture]
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def open(cls, paths: list[str]) -> "Job":
        return cls(open_captures(paths))

    def memo(self, key, compute):
        """compute() once per job: a job's captures do not change under it (a live capture is
        re-read into a new Job)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def table(self, name: str) -> pa.Table | None:
        """The table from every capture, with a `host` column, or None when no capture has rows.
        (Per-capture work on big tables is cheaper: see per_capture.)"""
        return self.memo(("table", name), lambda: self._stack(name))

    def of_host(self, name: str, host: str) -> pa.Table | None:
        """table(name)'s rows of one host, in their order."""
        stacked = self.table(name)
        if stacked is None:
            return None
        return self.memo(("of_host", name), lambda: partition(stacked, ["host"])).get((host,))

    def _stack(self, name: str) -> pa.Table | None:
        parts = [with_host(t, cap.meta.get("host", "?")) for cap, t in self.per_capture(name)]
        return pa.concat_tables(parts, promote_options="permissive") if parts else None

    def per_capture(self, name: str) -> list[tuple[Capture, pa.Table]]:
        """(capture, its rows of the table) for the captures that have some."""
        return self.memo(("per_capture", name), lambda: [(cap, t) for cap in self.captures
                                                          if (t := cap.read(name)) is not None])

    def identities(self) -> pa.Table | None:
        """The best identity of each (host, tgid): complete before incomplete, then the last
        (exec can change a process's command line)."""
        procs = self.table("procs")
        if procs is None:
            return None
        # A complete identity beats an incomplete one (a /proc read that timed out), then later wins.
        procs = procs.sort_by([("host", "ascending"), ("tgid", "ascending"), ("complete", "ascending"),
                               ("ts", "ascending")])
        host, tgid = procs["host"], procs["tgid"]
        n = procs.num_rows
        if n == 0:
            return procs
        # the last row of each (host, tgid) run
        same_next = pc.and_(pc.equal(host.slice(0, n - 1), host.slice(1)),
                            pc.equal(tgid.slice(0, n - 1), tgid.slice(1)))
        last = pa.concat_arrays([pc.invert(same_next).combine_chunks(), pa.array([True])])
        return procs.filter(last)

    def utc_offset_ns(self, host: str) -> int:
        """What to add to a monotonic timestamp of `host` to get UTC ns (its first capture's
        start clock pair); captures from many nodes line up on this clock."""
        # per host once: asked for every rank, a search of the captures was quadratic in nodes
        offsets = self.memo("utc_offsets", lambda: {h: o for h, o in reversed(
            [(cap.meta.get("host", "?"), utc_offset_ns(cap.meta)) for cap in self.captures])})
        return offsets.get(host, 0)

    def to_utc(self, host: pa.Array, mono: pa.Array) -> pa.Array:
        """Monotonic ns of rows from several hosts, as UTC ns (int64)."""
        hosts = {c.meta.get("host", "?") for c in self.captures}
        offsets = {h: self.utc_offset_ns(h) for h in (hosts if len(hosts) == 1 else pc.unique(host).to_pylist())}
        if len(offsets) == 1:
            return pc.add(pc.cast(mono, pa.int64()), next(iter(offsets.values())))
        off = pc.index_in(host, pa.array(list(offsets)))
        off = pc.take(pa.array(list(offsets.values()), pa.int64()), off)
        return pc.add(pc.cast(mono, pa.int64()), off)

    def separate_recordings(self) -> list[dict]:
        """The hosts whose captures do not all overlap in time, each with its recordings (captures
        that overlap chain into one), in time order, and the gaps between them in seconds. Many
        captures are one job when they are of many nodes at once; two of one host that do not
        overlap are two recordings (two saves, say), which merged read as one long save."""
        spans: dict[str, list[tuple[int, float, str]]] = {}
        for c in self.captures:
            start = (c.meta.get("start") or {}).get("realtime_ns")
            if start is None:
                continue            # when it ran is unknown: nothing to tell
            stop = (c.meta.get("stop") or {}).get("realtime_ns")
            lo = max(int(start), getattr(c, "since_utc", None) or int(start))
            hi = min(math.inf if stop is None else int(stop), getattr(c, "until_utc", None) or math.inf)
            if lo <= hi:            # a capture the window leaves out is not part of the job
                spans.setdefault(c.meta.get("host", "?"), []).append((lo, hi, c.path))
        out = []
        for host, caps in spans.items():
            recordings, gaps, end = [], [], -math.inf
            for lo, hi, path in sorted(caps):
                if lo > end:
                    if recordings:
                        gaps.append(round((lo - end) / 1e9, 3))
                    recordings.append([])
                recordings[-1].append(path)
                end = max(end, hi)
            if len(recordings) > 1:
                out.append({"host": host, "recordings": recordings, "gaps_s": gaps})
        return out

    def problems(self) -> list[str]:
        return [f"{c.path}: {p}" for c in self.captures for p in c.problems]

    def lost_events(self, cap: Capture) -> int:
        t = cap.read("loss")
        return int(pc.sum(t["lost"]).as_py() or 0) if t is not None else 0


# Rows overlapping a window: (begin column, end column) of each table; "ts" when not listed.
SPAN_COLUMNS = {"syscall": ("ts_enter", "ts_exit"), "rpc": ("ts_begin", "ts_end")}
# State, not events: identities hold from their row on; occupancy samples and NIC counters
# before the window say what held at its start, and the cumulative I/O counters of a sampled
# capture its baseline (the analysis clips them to the window).
UNWINDOWED = {"procs": "never", "slots": "until", "netdev": "until", "proc_io": "until"}


@dataclass
class WindowView:
    """A capture seen only between two UTC times (analyze --since/--until): the rows that
    overlap the window; an RPC still outstanding at the stop overlaps everything after its start."""
    capture: Capture
    since_utc: int | None
    until_utc: int | None

    def __getattr__(self, name):          # path, meta, problems, live, tables...
        return getattr(self.capture, name)

    @property
    def whole(self) -> bool:
        return self.since_utc is None and self.until_utc is None

    def read(self, table: str, include_partial: bool = False) -> pa.Table | None:
        t = self.capture.read(table, include_partial)
        if t is None:
            return None
        begin, end = SPAN_COLUMNS.get(table, ("ts", "ts"))
        if begin not in t.column_names or UNWINDOWED.get(table) == "never":
            return t
        offset = utc_offset_ns(self.capture.meta)
        keep = pa.array([True] * t.num_rows)
        if self.until_utc is not None:
            keep = pc.and_(keep, pc.less_equal(pc.cast(t[begin], pa.int64()), self.until_utc - offset))
        if self.since_utc is not None and table not in UNWINDOWED:
            ends = pc.greater_equal(pc.cast(t[end], pa.int64()), self.since_utc - offset)
            if table == "rpc":
                ends = pc.or_(ends, pc.equal(t["complete"], 0))
            keep = pc.and_(keep, ends)
        t = t.filter(keep)
        return t if t.num_rows else None


def between(job: Job, since_utc: int | None, until_utc: int | None) -> Job:
    return Job([WindowView(c, since_utc, until_utc) for c in job.captures])


def parse_when(text: str, job: Job) -> int:
    """A time on the command line: seconds since the job's first capture started ('90', '1.5'),
    or an ISO 8601 time ('2026-12-02T19:30:00Z'; without a zone it is UTC). -> UTC ns."""
    try:
        seconds = float(text.rstrip("s"))
    except ValueError:
        pass
    else:
        starts = [int(c.meta["start"]["realtime_ns"]) for c in job.captures if (c.meta.get("start") or {})]
        if not starts:
            raise ValueError(f"{text!r} is relative to the capture's start, which these captures do not record")
        return min(starts) + int(seconds * 1e9)
    try:
        return utc_ns(text)
    except ValueError:
        raise ValueError(f"bad time {text!r}: want seconds since the capture started (e.g. 90) "
                         "or an ISO 8601 time (e.g. 2026-12-02T19:30:00Z)") from None
