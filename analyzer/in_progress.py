"""What each rank is blocked in at the time cursor: the traced syscalls in progress then."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.meta import start_ns

from . import sampled_activity
from .job import Job
from .ranks import RANK_KEYS, with_identity

SNAPSHOT_FRESH_NS = 2_000_000_000  # a blocked snapshot older than this says nothing about "now"
BLOCKED_SHOWN_NS = 100_000_000     # a call in progress for less than this is not "blocked"


@dataclass(frozen=True)
class BlockedCall:
    """A traced syscall in progress at the cursor."""
    tid: int
    syscall: str
    path: str | None
    age_ns: int                      # in it for this long, as of the cursor (or of the snapshot)
    source: str                      # "snapshot" (the agent's blocked table), "trace" (its row, in replay)
                                     # or "sample" (a sampled capture's thread samples)


@dataclass(frozen=True)
class BlockedNow:
    """What a rank is blocked in: the longest of its `calls` in progress."""
    longest: BlockedCall
    calls: int


def call_list(calls: pa.Table) -> list[BlockedCall]:
    """The rows of in_progress() (or some of them) as BlockedCalls, in their order."""
    return [BlockedCall(**row) for row in calls.select([f.name for f in fields(BlockedCall)]).to_pylist()]


def in_progress(job: Job, everything: Job | None, now_ns: int, fresh_ns: int = SNAPSHOT_FRESH_NS,
                min_ns: int = BLOCKED_SHOWN_NS) -> pa.Table | None:
    """The traced syscalls in progress at `now_ns` (since capture start) for at least `min_ns`,
    one row per call, with the rank identity (with_identity) and `age_ns`, the longest first.

    Two sources: the agent's `blocked` snapshots (calls in progress for over a second, about
    every second: the latest snapshot at or before the cursor, if within `fresh_ns` of it; age
    as of the snapshot); and, when `everything` (the whole job, past the cursor) is given, the
    syscall rows that began before the cursor and returned after it (rows are written when a
    call returns, so in replay they show what a rank was stuck in then; age as of the cursor).
    A sampled capture's are the NFS waits of its latest sample at or before the cursor, if
    within `fresh_ns` of it (age: how long the samples saw it)."""
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
    sampled = _sampled(job, now_ns, fresh_ns)
    if sampled is not None:
        parts.append(sampled.drop_columns(["host"]))
        hosts += [(h, 1) for h in sampled["host"].to_pylist()]
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


def _sampled(job: Job, now_ns: int, fresh_ns: int) -> pa.Table | None:
    """in_progress()'s rows from a sampled capture's last sample (job: as of the cursor)."""
    t = sampled_activity.waiting_at_last_sample(job)
    if t is None:
        return None
    cut = {c.meta.get("host", "?"): start_ns(c.meta) + now_ns for c in job.captures}
    hosts = t["host"].to_pylist()
    mono = pc.subtract(t["ts"], pa.array([job.utc_offset_ns(h) for h in hosts], pa.int64()))
    fresh = pc.greater_equal(mono, pa.array([cut[h] - fresh_ns for h in hosts], pa.int64()))
    t, mono = t.filter(fresh), mono.filter(fresh)
    return pa.table({"tgid": pc.cast(t["tgid"], pa.uint32()), "tid": pc.cast(t["tid"], pa.uint32()),
                     "syscall": t["syscall"], "path": t["path"], "ts_enter": pc.subtract(mono, t["age_ns"]),
                     "age_ns": t["age_ns"], "source": pa.array(["sample"] * t.num_rows, pa.string()),
                     "host": t["host"]})


def blocked_now(calls: pa.Table | None) -> dict[tuple, BlockedNow]:
    """Per rank (rank_key): the longest call it is blocked in, and how many of its calls are in
    progress."""
    if calls is None:
        return {}
    longest: dict[tuple, BlockedCall] = {}
    count: Counter = Counter()
    ranks = zip(*(calls[k].to_pylist() for k in RANK_KEYS))
    for key, call in zip(ranks, call_list(calls)):          # the longest first
        longest.setdefault(key, call)
        count[key] += 1
    return {key: BlockedNow(call, count[key]) for key, call in longest.items()}
