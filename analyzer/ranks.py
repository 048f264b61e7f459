"""Per-rank attribution of the traced syscalls: who wrote what, when, and where it waited."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .attribution import attributed_writes
from .calls import file_calls
from slotscope.capture.syscalls import FLUSH_SYSCALLS, OP_NUMBER, WRITE_SYSCALLS

from . import sampled_activity
from .job import Job, iso_utc, with_host

RANK_KEYS = ["host", "rank", "solo"]


def rank_key(r: dict) -> tuple:
    """The identity of a rank_table entry: (host, rank, pid of a process without a rank)."""
    return (r["host"], r["rank"], r["pids"][0] if r["rank"] is None else None)


def rank_name(r: dict) -> str:
    """How the reports name a rank_table entry (or one with its rank and pids): 'rank 3', or
    'pid 4242' for a process without a rank."""
    return f"rank {r['rank']}" if r["rank"] is not None else f"pid {r['pids'][0]}"


def with_identity(job: Job, sc: pa.Table, tgid: str = "tgid") -> pa.Table:
    """`sc` with the rank and comm of its process, and `solo`: the pid of a process without a
    rank (it stands alone), null for ranked ones. (host, rank, solo) names a rank entry."""
    idents = job.identities()
    if idents is None:
        sc = sc.append_column("rank", pa.nulls(sc.num_rows, pa.int32()))
        sc = sc.append_column("comm", pa.nulls(sc.num_rows, pa.string()))
    else:
        idents = idents.select(["host", "tgid", "rank", "comm"]).rename_columns(["host", tgid, "rank", "comm"])
        sc = sc.join(idents, keys=["host", tgid], join_type="left outer")
    solo = pc.if_else(pc.is_null(sc["rank"]), pc.cast(sc[tgid], pa.uint32()), pa.nulls(sc.num_rows, pa.uint32()))
    return sc.append_column("solo", solo)


def syscall_rows(job: Job) -> pa.Table | None:
    """The syscall rows of every capture with their host, syscall names decoded."""
    sc = job.table("syscall")
    if sc is None:
        return None
    sc = sc.select(["host", "tgid", "syscall", "latency_ns", "bytes", "ts_enter", "ts_exit"])
    return sc.set_column(2, "syscall", pc.cast(sc["syscall"], pa.string()))


def per_process(job: Job) -> pa.Table | None:
    """file_calls() per (host, tgid, syscall)."""
    calls = file_calls(job)
    if calls is None:
        return None
    g = calls.group_by(["host", "tgid", "syscall"]).aggregate([
        ("latency_ns_count", "sum"), ("latency_ns_sum", "sum"), ("latency_ns_max", "max"), ("bytes_sum", "sum"),
        ("ts_enter_min", "min"), ("ts_exit_max", "max")])
    return g.rename_columns({f"{col}_{fn}": col for col, fn in
                             (("latency_ns_count", "sum"), ("latency_ns_sum", "sum"), ("latency_ns_max", "max"),
                              ("bytes_sum", "sum"), ("ts_enter_min", "min"), ("ts_exit_max", "max"))})


def blocked_calls(job: Job) -> pa.Table | None:
    """The agent's snapshots of blocked syscalls, one row per call: its entry, the last snapshot
    that saw it (ts), and whether that was the final one (still blocked when recording stopped)."""
    parts = []
    for cap, t in job.per_capture("blocked"):
        g = t.group_by(["tid", "tgid", "ts_enter", "syscall"]).aggregate([("ts", "max"), ("path", "max")])
        stop = (cap.meta.get("stop") or {}).get("monotonic_ns")
        at_stop = pc.greater_equal(g["ts_max"], (stop or 1 << 62) - 2_000_000_000)
        g = pa.table({"tid": g["tid"], "tgid": g["tgid"], "ts_enter": g["ts_enter"], "syscall": g["syscall"],
                      "ts": g["ts_max"], "path": g["path_max"], "at_stop": at_stop})
        parts.append(with_host(g, cap.meta.get("host", "?")))
    return pa.concat_tables(parts) if parts else None


def rank_table(job: Job) -> list[dict]:
    """One entry per rank (per process for processes without a rank), as in the JSON contract,
    with when its save started and ended (UTC ns: first syscall entered, last one returned).
    A sampled capture's are made of its samples (_sampled_table)."""
    procs = per_process(job)
    stuck = blocked_calls(job)
    if procs is None and stuck is None:
        return _sampled_table(job)
    ranks: dict[tuple, dict] = {}
    comms: dict[tuple, set] = {}

    def entry(row: dict, start: int, end: int) -> dict:
        offset = job.utc_offset_ns(row["host"])
        return _entry(ranks, comms, row, start + offset, end + offset)

    # A call still blocked at the stop has no row of its own; its snapshots keep the rank's save open.
    for row in with_identity(job, stuck).to_pylist() if stuck is not None else ():
        r = entry(row, row["ts_enter"], row["ts"])
        if row["at_stop"]:
            r["blocked_at_stop"] = {"syscall": row["syscall"], "path": row["path"], "pid": row["tgid"],
                                    "seconds": (row["ts"] - row["ts_enter"]) / 1e9}
    for row in with_identity(job, procs).to_pylist() if procs is not None else ():
        r = entry(row, row["ts_enter_min"], row["ts_exit_max"])
        add_calls(r, row["syscall"], row["latency_ns_count"], row["latency_ns_sum"], row["latency_ns_max"],
                  row["bytes_sum"])
    _charge_rpcs(job, ranks)
    return _finished(ranks, comms)


def _sampled_table(job: Job) -> list[dict]:
    """A sampled capture's ranks (sampled_activity.py): no call is traced, so no syscalls and no
    RPCs per rank (write_rpcs and slot_wait_ns stay None); bytes written, the save's times and
    the time blocked are estimates good to an interval."""
    procs = sampled_activity.per_process(job)
    if procs is None:
        return []
    stuck: dict[tuple, dict] = {}      # (host, tgid) -> the longest wait its threads were in at the stop
    for w in (sampled_activity.waiting_at_last_sample(job) or pa.table({"age_ns": []})).to_pylist():
        if (w["host"], w["tgid"]) not in stuck or w["age_ns"] / 1e9 > stuck[(w["host"], w["tgid"])]["seconds"]:
            stuck[(w["host"], w["tgid"])] = {"syscall": w["syscall"], "path": w["path"], "pid": w["tgid"],
                                             "seconds": w["age_ns"] / 1e9}
    ranks: dict[tuple, dict] = {}
    comms: dict[tuple, set] = {}
    for row in with_identity(job, procs).to_pylist():
        r = _entry(ranks, comms, row, row["start_ns"], row["end_ns"])
        r["from_samples"] = True
        r["bytes_written"] += row["bytes"]
        r["blocked_ns"] += row["blocked_ns"]
        r["flush_ns"] += row["flush_ns"]
        at_stop = stuck.get((row["host"], row["tgid"]))
        if at_stop and (r["blocked_at_stop"] is None or at_stop["seconds"] > r["blocked_at_stop"]["seconds"]):
            r["blocked_at_stop"] = at_stop
    return _finished(ranks, comms)


def _entry(ranks: dict[tuple, dict], comms: dict[tuple, set], row: dict, start: int, end: int) -> dict:
    """The entry of a process's rank (row: with_identity()'s columns), made or widened to its
    times (UTC ns)."""
    key = (row["host"], row["rank"], row["solo"])
    r = ranks.get(key)
    if r is None:
        r = ranks[key] = new_entry(row["rank"], row["host"], start, end)
    if row["tgid"] not in r["pids"]:
        r["pids"].append(row["tgid"])
    if row["comm"]:
        comms.setdefault(key, set()).add(row["comm"])
    r["save_start_ns"], r["save_end_ns"] = min(r["save_start_ns"], start), max(r["save_end_ns"], end)
    return r


def _finished(ranks: dict[tuple, dict], comms: dict[tuple, set]) -> list[dict]:
    for key, r in ranks.items():
        finish_entry(r, comms.get(key))
    return sorted(ranks.values(), key=lambda r: (r["rank"] is None, r["rank"] or 0, r["host"], r["pids"]))


def _charge_rpcs(job: Job, ranks: dict[tuple, dict]) -> None:
    """WRITE RPCs, their bytes and slot wait, charged to the rank of the process they worked
    for (directly, or by the file they wrote back: see attribution.py)."""
    writes = attributed_writes(job)
    if writes is None:
        return
    for r in ranks.values():
        charge(r, 0, None, None)
    # per process first (the rows are many), then per rank
    per = writes.group_by(["host", "attributed_tgid"]).aggregate([("io_count", "count"), ("io_count", "sum"),
                                                                  ("slot_wait_ns", "sum")])
    per = with_identity(job, per, tgid="attributed_tgid").group_by(RANK_KEYS).aggregate(
        [("io_count_count", "sum"), ("io_count_sum", "sum"), ("slot_wait_ns_sum", "sum")])
    for g in per.to_pylist():
        r = ranks.get((g["host"], g["rank"], g["solo"]))
        if r is not None:
            charge(r, g["io_count_count_sum"], g["io_count_sum_sum"], g["slot_wait_ns_sum_sum"])


# A rank_table entry, built in steps: here, and as of a moving time cursor (rank_rows.RankIndex).

def new_entry(rank: int | None, host: str, start_ns: int, end_ns: int) -> dict:
    """A rank's entry before its calls are added (start and end: UTC ns)."""
    return {"rank": rank, "host": host, "pids": [], "comm": None,
            "bytes_written": 0, "write_rpcs": None, "write_rpc_bytes": None, "mean_rpc_bytes": None,
            "syscalls": {}, "blocked_ns": 0, "flush_ns": 0, "slot_wait_ns": None,
            "save_start_ns": start_ns, "save_end_ns": end_ns, "blocked_at_stop": None, "from_samples": False}


def add_calls(r: dict, syscall: str, count: int, total_ns: int, max_ns: int, nbytes: int | None) -> None:
    """A process's calls of one syscall, added to its rank's entry."""
    s = r["syscalls"].setdefault(syscall, {"count": 0, "total_ns": 0, "max_ns": 0})
    s["count"] += count
    s["total_ns"] += total_ns
    s["max_ns"] = max(s["max_ns"], max_ns)
    r["blocked_ns"] += total_ns
    if syscall in FLUSH_SYSCALLS:
        r["flush_ns"] += total_ns
    if syscall in WRITE_SYSCALLS:
        r["bytes_written"] += nbytes or 0


def finish_entry(r: dict, comms: set | None) -> None:
    """An entry whose calls are all in: pids and syscalls in order, its comm, its save's times."""
    r["pids"].sort()
    # in the vocabulary's order: the groups come from a threaded group_by in no fixed order,
    # which made analyze --json differ between runs on one capture
    r["syscalls"] = dict(sorted(r["syscalls"].items(), key=lambda kv: OP_NUMBER.get(kv[0], len(OP_NUMBER))))
    r["comm"] = min(comms) if comms else None
    r.update(save_start=iso_utc(r["save_start_ns"]), save_end=iso_utc(r["save_end_ns"]),
             save_s=(r["save_end_ns"] - r["save_start_ns"]) / 1e9)


def charge(r: dict, rpcs: int, nbytes: int | None, slot_wait_ns: int | None) -> None:
    """The WRITE RPCs charged to a rank (when the capture has RPC rows; 0 when none is its)."""
    r["write_rpcs"], r["write_rpc_bytes"], r["slot_wait_ns"] = rpcs, nbytes or 0, slot_wait_ns or 0
    r["mean_rpc_bytes"] = r["write_rpc_bytes"] / rpcs if rpcs else None
