"""Per-rank attribution of the traced syscalls: who wrote what, and where it waited."""
from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from .attribution import attributed_rpcs
from .job import WRITE_SYSCALLS, Job



def with_identity(job: Job, sc: pa.Table) -> pa.Table:
    idents = job.identities()
    if idents is None:
        sc = sc.append_column("rank", pa.nulls(sc.num_rows, pa.int32()))
        return sc.append_column("comm", pa.nulls(sc.num_rows, pa.string()))
    idents = idents.select(["host", "tgid", "rank", "comm"])
    return sc.join(idents, keys=["host", "tgid"], join_type="left outer")


def rank_table(job: Job) -> list[dict]:
    """One entry per rank (per process for processes without a rank), as in the JSON contract."""
    sc = job.table("syscall")
    if sc is None:
        return []
    sc = sc.select(["host", "tgid", "syscall", "latency_ns", "bytes"])
    sc = sc.set_column(sc.schema.get_field_index("syscall"), "syscall", pc.cast(sc["syscall"], pa.string()))
    sc = with_identity(job, sc)
    # Processes without a rank stand alone, keyed by their pid.
    sc = sc.append_column("solo", pc.if_else(pc.is_null(sc["rank"]), sc["tgid"],
                                             pa.nulls(sc.num_rows, pa.uint32())))
    keys = ["host", "rank", "solo"]
    per_call = sc.group_by(keys + ["syscall"]).aggregate([
        ("latency_ns", "count"), ("latency_ns", "sum"), ("latency_ns", "max"), ("bytes", "sum"),
    ]).to_pylist()
    who = sc.group_by(keys).aggregate([("tgid", "distinct"), ("comm", "list")]).to_pylist()

    ranks: dict[tuple, dict] = {}
    for w in who:
        key = (w["host"], w["rank"], w["solo"])
        comms = Counter(c for c in w["comm_list"] if c)
        ranks[key] = {
            "rank": w["rank"], "host": w["host"], "pids": sorted(w["tgid_distinct"]),
            "comm": comms.most_common(1)[0][0] if comms else None,
            "bytes_written": 0, "write_rpcs": None, "syscalls": {}, "blocked_ns": 0, "slot_wait_ns": None,
        }
    for row in per_call:
        r = ranks[(row["host"], row["rank"], row["solo"])]
        r["syscalls"][row["syscall"]] = {"count": row["latency_ns_count"], "total_ns": row["latency_ns_sum"],
                                         "max_ns": row["latency_ns_max"]}
        r["blocked_ns"] += row["latency_ns_sum"]
        if row["syscall"] in WRITE_SYSCALLS:
            r["bytes_written"] += row["bytes_sum"] or 0
    _charge_rpcs(job, ranks)
    return sorted(ranks.values(), key=lambda r: (r["rank"] is None, r["rank"] or 0, r["host"], r["pids"]))


def _charge_rpcs(job: Job, ranks: dict[tuple, dict]) -> None:
    """WRITE RPCs and their slot wait, charged to the rank of the process they worked for
    (directly, or by the file they wrote back: see attribution.py)."""
    rpcs = attributed_rpcs(job)
    if rpcs is None:
        return
    idents = job.identities()
    rank_of = {}
    if idents is not None:
        rank_of = {(h, t): r for h, t, r in zip(idents["host"].to_pylist(), idents["tgid"].to_pylist(),
                                                idents["rank"].to_pylist())}
    for r in ranks.values():
        r["write_rpcs"], r["slot_wait_ns"] = 0, 0
    writes = rpcs.filter(pc.and_(pc.equal(rpcs["procname"], "WRITE"), pc.is_valid(rpcs["attributed_tgid"])))
    for host, tgid, wait in zip(writes["host"].to_pylist(), writes["attributed_tgid"].to_pylist(),
                                writes["slot_wait_ns"].to_pylist()):
        rank = rank_of.get((host, tgid))
        r = ranks.get((host, rank, None if rank is not None else tgid))
        if r is not None:
            r["write_rpcs"] += 1
            r["slot_wait_ns"] += wait or 0
