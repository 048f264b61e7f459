"""One rank's drill-down in the TUI, as of the time cursor."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import WRITE_SYSCALLS

from .attribution import attributed_rpcs
from .job import Job
from .rpcs import by_proc
from .timeline import syscalls_since_start


def rank_detail(job: Job, host: str, pids: list[int], calls: pa.Table | None = None) -> dict:
    """One rank's drill-down, as of the job's cursor: the files it wrote or touched (bytes
    written, calls, time in them), its RPCs split per procedure (rpcs.by_proc over the
    attributed rows: direct, or by the file written back), and the calls it is blocked in."""
    detail = {"files": [], "rpc": {"by_proc": {}, "attribution": {}}, "blocked": []}
    sc = syscalls_since_start(job, ["tgid", "syscall", "latency_ns", "bytes", "ts_exit", "path"])
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
