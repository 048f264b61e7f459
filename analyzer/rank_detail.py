"""One rank's drill-down in the TUI, as of the time cursor."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import WRITE_SYSCALLS

from .attribution import attributed_rpcs
from .in_progress import BlockedCall, call_list
from .job import Job
from .rpcs import by_proc
from .sampled_activity import WRITING_CALLS
from .timeline import syscalls_since_start
from .waits import wait_kind


@dataclass(frozen=True)
class FileStats:
    """A file a rank wrote or touched, with its calls on it."""
    path: str
    bytes: int                       # written
    calls: int
    total_ns: int                    # time in those calls
    max_ns: int


@dataclass(frozen=True)
class RankDetail:
    """One rank's drill-down, as of the cursor."""
    files: list[FileStats]           # most written first
    by_proc: dict[str, dict]         # rpcs.by_proc() of its attributed RPCs
    attribution: dict[str, int]      # how many of them each way of attributing gave it
    blocked: list[BlockedCall]       # the longest first
    waits: list[tuple[str, int]] | None = None     # a sampled capture: its threads' samples per wait
                                                   # (waits.py), the most first; None: not sampled
    sampled_files: list[tuple[str, int]] = ()      # and per file, the samples that found it in a call on it


def rank_detail(job: Job, host: str, pids: list[int], calls: pa.Table | None = None) -> RankDetail:
    """One rank's drill-down, as of the job's cursor: the files it wrote or touched (bytes
    written, calls, time in them), its RPCs split per procedure (rpcs.by_proc over the
    attributed rows: direct, or by the file written back), and the calls it is blocked in. Of a
    sampled capture (no syscall traced): where its threads' samples found them, and on which file."""
    files, procs, attribution, blocked = [], {}, {}, []
    sc = syscalls_since_start(job, ["tgid", "syscall", "latency_ns", "bytes", "ts_exit", "path"])
    mine = pa.array(pids, pa.uint32())
    if sc is not None:
        sc = sc.filter(pc.and_(pc.equal(sc["host"], host), pc.is_in(pc.cast(sc["tgid"], pa.uint32()), mine)))
        sc = sc.append_column("wbytes", pc.if_else(pc.is_in(sc["syscall"], pa.array(WRITE_SYSCALLS)),
                                                   pc.coalesce(sc["bytes"], 0), 0))
        per_file = sc.filter(pc.is_valid(sc["path"])).group_by(["path"]).aggregate(
            [("wbytes", "sum"), ("latency_ns", "count"), ("latency_ns", "sum"), ("latency_ns", "max")])
        files = [FileStats(g["path"], g["wbytes_sum"], g["latency_ns_count"], g["latency_ns_sum"], g["latency_ns_max"])
                 for g in per_file.sort_by([("wbytes_sum", "descending"), ("path", "ascending")]).to_pylist()]
    rpc = attributed_rpcs(job)
    if rpc is not None:
        rpc = rpc.filter(pc.and_(pc.equal(rpc["host"], host),
                                 pc.fill_null(pc.is_in(rpc["attributed_tgid"], mine), False)))
        if rpc.num_rows:
            procs = by_proc(rpc)
            counts = pc.value_counts(rpc["attribution"])
            attribution = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))
    if calls is not None:
        blocked = call_list(calls.filter(pc.and_(pc.equal(calls["host"], host), pc.is_in(calls["tgid"], mine))))
    samples = job.table("thread_samples") if sc is None else None
    if samples is None:
        return RankDetail(files, procs, attribution, blocked)
    samples = samples.filter(pc.and_(pc.equal(samples["host"], host), pc.is_in(samples["tgid"], mine)))
    rows = samples.select(["state", "wchan", "syscall", "path"]).to_pylist()
    waits = Counter(wait_kind(r["state"], r["wchan"]) for r in rows)
    named = Counter(r["path"] for r in rows if r["path"] and r["syscall"] in WRITING_CALLS)
    return RankDetail(files, procs, attribution, blocked, waits.most_common(), named.most_common())
