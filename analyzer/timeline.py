"""A job as of a point in time: the time cursor of the TUI (live and replay alike).

Times here are nanoseconds since each capture's start (meta.json "start" monotonic_ns), so
captures from several nodes line up on one axis. `JobSource` reads each table once and keeps
it until `refresh()` (the TUI refreshes when it polls a capture that is still being written;
only segments that are new since the last read are read); `at(until_ns)` is a Job whose
tables hold only the rows up to the cursor, so every analyzer function (rank_table,
analyze...) answers "as of then" without a second copy of its logic. What the TUI shows of
it is computed headless in view.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.meta import start_ns, utc_offset_ns
from slotscope.capture.reader import Capture, SegmentCache

from .job import Job
from .saves import Save, find_saves
from .series import TransportSeries, transport_series

# The column that places a row in time; "ts" when not listed. Syscall and RPC rows are written
# when they end, so as of a cursor only the ones that had ended are known.
TIME_COLUMN = {"syscall": "ts_exit", "rpc": "ts_end"}
# The columns that say how far a capture reaches (its newest row), per table.
END_COLUMNS = {"syscall": "ts_exit", "rpc": "ts_end", "blocked": "ts", "agent": "ts", "slots": "ts",
               "netdev": "ts", "loss": "ts"}


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
        self._whole: dict = {}          # results over everything read so far, until it grows

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
            self._whole.clear()
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

    def zero_utc_ns(self) -> int:
        """The time axis's zero in UTC ns, as Job.to_utc converts: the earliest capture's start.
        An analyzer time (UTC) minus this is on the axis; with several captures it is at or
        after the same time on each capture's own axis, so a cursor put there holds the event."""
        return min((utc_offset_ns(v.meta) + start_ns(v.meta) for v in self.views), default=0)

    def at(self, until_ns: int | None) -> Job:
        return Job([CaptureAt(v.capture, until_ns, v.cache, v.segments) for v in self.views])

    def of_whole(self, key, compute):
        """compute() of everything read so far, once until it grows."""
        if key not in self._whole:
            self._whole[key] = compute()
        return self._whole[key]

    def series(self, bins: int) -> list[TransportSeries]:
        """transport_series() of everything read so far, cached until the capture grows."""
        return self.of_whole(("series", bins), lambda: transport_series(self.at(None), self.span_ns(), bins))

    def saves(self, gap_s: float) -> list[Save]:
        """find_saves() of everything read so far, wherever the cursor is (the TUI jumps to the
        ones after it), cached until the capture grows."""
        return self.of_whole(("saves", gap_s), lambda: find_saves(self.at(None), gap_s))


def syscalls_since_start(job: Job, columns: list[str]) -> pa.Table | None:
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
