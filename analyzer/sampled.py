"""The causes findings.py names, decided from what an ordinary user can read: mountstats'
counters per interval (ms_ops, ms_xprt) and where each thread of the job was when looked at
(thread_samples). The source is a sampled capture (record --no-bpf) or copies of
/proc/self/mountstats (analyze --mountstats). Same Finding objects, evidence fields and
thresholds; each finding also says how sure it is and what a BPF recording would add.

What the counters allow: mountstats' queue time (a task's start to its transmission: the
slot wait, and the wait for the socket) against execute time; the backlog each send found
(bklog_u / sends is the mean number of RPCs waiting for a slot); the slot high-water mark
since the mount (max_slots, not per interval); sends and replies per interval, timeouts and
retransmissions (ntrans - ops); COMMITs; bytes per WRITE. What it does not: each RPC's
times, the stability of a WRITE, which rank an RPC was for (samples only say where a rank
was, every interval).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import median

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import FLUSH_SYSCALLS, WRITE_SYSCALLS

from . import sampled_activity
from .findings import Finding, flush_fix, saturation_fix, small_sync_fix, unresponsive_fix
from .job import Job, iso_utc
from .ranks import with_identity
from .thresholds import Thresholds
from .transports import slot_limit
from .units import ms, pct, plural, size
from .waits import NFS_WAITS, WAIT_MEANS, wait_kind

S = 1_000_000_000

BPF_ADDS = {
    "slot_saturation": "each RPC's slot wait, slot occupancy over time against the limit, and whose RPCs waited",
    "server_unresponsive": "each RPC's send and reply times, the RPCs outstanding at the stop, the kernel log",
    "flush_commit_stall": "each close/fsync's duration per rank and file, and each COMMIT's",
    "small_sync_writes": "each WRITE's size and stability (FILE_SYNC/UNSTABLE) per rank and file",
    # findings.py's, on the rank table of a sampled capture (sampled_activity.py)
    "straggler_rank": "each call the late rank made, and how long it waited in each",
    "straggler_node": "each call the late node's ranks made, and their RPCs' slot wait and round trip",
}


@dataclass
class Counters:
    """What the findings here read: ms_ops/ms_xprt rows (ts in UTC ns, with host), the thread
    samples with the rank of their process (or None), the interval and each server's limits."""
    ops: pa.Table | None
    xprt: pa.Table | None
    samples: pa.Table | None
    interval_ns: int
    limits: dict            # (host, server) -> (transport slots, session slots, the mount from meta)
    link_util: float | None = None      # the busiest link's mean use (NIC counters), None: unknown

    def confidence(self) -> str:
        every = f"{self.interval_ns / S:g} s"
        if self.samples is None:
            return f"low: from mountstats counters every {every} alone (no samples of the ranks)"
        return f"medium: from {S / self.interval_ns:g} Hz samples and counters"

    def transports(self, table: str = "ops") -> list[tuple[str | None, str]]:
        """(host, server) of the rows: each node's counters of a server are its own (host None
        for mountstats copies)."""
        t = self.ops if table == "ops" else self.xprt
        hosts = t["host"].to_pylist() if "host" in t.column_names else [None] * t.num_rows
        return sorted(set(zip(hosts, t["server"].to_pylist())), key=lambda k: (k[0] or "", k[1]))

    def of(self, key: tuple[str | None, str], op: str | None = None, table: str = "ops") -> pa.Table:
        t = self.ops if table == "ops" else self.xprt
        host, server = key
        m = pc.equal(t["server"], server)
        if host is not None:
            m = pc.and_(m, pc.equal(t["host"], host))
        if op:
            m = pc.and_(m, pc.equal(t["op"], op))
        return t.filter(m).sort_by("ts")

    def mounts(self) -> list[str]:
        return sorted(set(self.ops["mount"].to_pylist())) if self.ops is not None else []


def from_job(job: Job) -> Counters | None:
    """The counters and samples of a job's sampled captures; None when none is sampled."""
    caps = [c for c in job.captures if "sampled" in c.meta]
    if not caps:
        return None
    tables = {}
    for name in ("ms_ops", "ms_xprt", "thread_samples"):
        t = job.table(name)
        if t is not None:
            t = t.set_column(t.schema.get_field_index("ts"), "ts", job.to_utc(t["host"], t["ts"]))
        tables[name] = t
    samples = tables["thread_samples"]
    if samples is not None:
        samples = with_identity(job, samples)
    limits = {}
    for c in caps:
        for m in c.meta.get("nfs_mounts") or []:
            limits[(c.meta.get("host", "?"), m.get("server"))] = slot_limit(c.meta, m.get("server"))
    return Counters(tables["ms_ops"], tables["ms_xprt"], samples, sampled_activity.interval_ns(job), limits)


def _sum(t: pa.Table, col: str) -> int:
    return int(pc.sum(t[col]).as_py() or 0) if t.num_rows else 0


def _per_interval(t: pa.Table, cols: list[str]) -> dict[str, np.ndarray]:
    """Columns summed per ts (mounts and transports of one server), in time order."""
    if t.num_rows == 0:
        return {c: np.zeros(0, np.int64) for c in ["ts", *cols]}
    g = t.group_by("ts").aggregate([(c, "sum") for c in cols]).sort_by("ts")
    return {"ts": g["ts"].to_numpy(), **{c: g[f"{c}_sum"].to_numpy() for c in cols}}


def _common(c: Counters) -> dict:
    return {"shortest_stall_visible_s": round(c.interval_ns / S, 3)}


def _grouped(samples: pa.Table, keys: list[str], times: bool = False) -> list[dict]:
    """The samples counted (`n`) per distinct `keys` (with the first and last ts with `times`),
    in the order of their first sample: the rows are many (threads x intervals), the distinct
    places a rank was in few."""
    t = samples.select(keys + ["ts"]).append_column("order", pa.array(np.arange(samples.num_rows)))
    g = t.group_by(keys, use_threads=False).aggregate(
        [("order", "min"), ("order", "count")] + ([("ts", "min"), ("ts", "max")] if times else []))
    g = g.sort_by("order_min").rename_columns({"order_count": "n"})
    return g.to_pylist()


def _ranks(c: Counters, t0: int, t1: int, keep, host: str | None = None) -> tuple[list[int], list[dict]]:
    """Ranks (of `host`, or all) with samples in [t0, t1] for which keep(kind, syscall) holds:
    their ids and, per rank, the share of its samples there and its most seen file."""
    if c.samples is None or t0 is None:
        return [], []
    m = pc.and_(pc.greater_equal(c.samples["ts"], t0), pc.less_equal(c.samples["ts"], t1))
    if host is not None:
        m = pc.and_(m, pc.equal(c.samples["host"], host))
    s = c.samples.filter(m)
    per: dict = {}
    for r in _grouped(s, ["rank", "tgid", "state", "wchan", "syscall", "path"]):
        # (rank, None), or (None, pid) for a process without a rank
        e = per.setdefault((r["rank"], None if r["rank"] is not None else r["tgid"]), [0, 0, Counter()])
        e[1] += r["n"]
        if keep(wait_kind(r["state"], r["wchan"]), r["syscall"]):
            e[0] += r["n"]
            if r["path"]:
                e[2][r["path"]] += r["n"]
    hit = {k: v for k, v in per.items() if v[0]}
    rows = [{"rank": rank, "pid": pid, "sampled_share": round(v[0] / v[1], 3),
             "path": v[2].most_common(1)[0][0] if v[2] else None}
            for (rank, pid), v in sorted(hit.items(), key=lambda kv: -kv[1][0] / kv[1][1])]
    return sorted(rank for rank, _ in hit if rank is not None), rows[:20]


def _span(ts: np.ndarray, mask: np.ndarray, interval: int) -> tuple[int | None, int | None]:
    if not mask.any():
        return None, None
    return int(ts[mask].min() - interval), int(ts[mask].max())


def slot_saturation(c: Counters, th: Thresholds) -> list[Finding]:
    out = []
    for key in c.transports():
        server = key[1]
        w = _per_interval(c.of(key, "WRITE"), ["ops", "bytes_sent", "queue_ns", "rtt_ns", "execute_ns"])
        busy = w["ops"] > 0
        execute = int(w["execute_ns"].sum())
        if not busy.any() or not execute or c.xprt is None:
            continue
        x = _per_interval(c.of(key, table="xprt"), ["sends", "bklog_u"])
        backlog = dict(zip(x["ts"].tolist(), x["bklog_u"].tolist()))
        waited = np.array([backlog.get(t, 0) > 0 for t in w["ts"].tolist()])
        share = np.divide(w["queue_ns"], w["execute_ns"], out=np.zeros(len(busy)), where=w["execute_ns"] > 0)
        full = busy & waited & (share >= th.slot_wait_share)
        frac = full.sum() / busy.sum()
        wait_share = int(w["queue_ns"].sum()) / execute
        if frac < th.saturated_share or wait_share < th.slot_wait_share:
            continue
        sends = int(x["sends"].sum())
        mean_queue = int(x["bklog_u"].sum()) / sends if sends else None
        high = int(pc.max(c.of(key, table="xprt")["max_slots"]).as_py() or 0)
        slots, session, mount = c.limits.get(key, (None, None, None))
        limit = min([v for v in (slots if slots and slots < 65536 else high, session) if v] or [0])
        n = int(w["ops"].sum())
        write_bytes, rtt = int(w["bytes_sent"].sum()) / n, int(w["rtt_ns"].sum()) / n
        sending_s = busy.sum() * c.interval_ns / S
        achieved = int(w["bytes_sent"].sum()) / sending_s
        ceiling = limit * write_bytes / (rtt / S) if rtt else None
        ev = {**_common(c),
              "queued_intervals": round(float(frac), 3), "intervals_writing": int(busy.sum()),
              "peak_in_use": high, "max_slots": slots, "session_slots": session,
              "mean_backlog_per_send": round(mean_queue, 2) if mean_queue is not None else None,
              "write_rpcs": n, "mean_write_bytes": round(write_bytes), "queue_share": round(wait_share, 3),
              "mean_queue_ms": round(int(w["queue_ns"].sum()) / n / 1e6, 3), "mean_rtt_ms": round(rtt / 1e6, 3),
              "sending_s": round(sending_s, 3), "throughput_Bps": round(achieved),
              "littles_law_ceiling_rtt_Bps": round(ceiling) if ceiling else None,
              "throughput_vs_ceiling": round(achieved / ceiling, 3) if ceiling else None}
        summary = (f"WRITEs toward {server} queued {pct(wait_share)} of their time (mountstats queue/execute) "
                   f"in {pct(frac)} of the intervals they were sent, each send finding "
                   f"{ev['mean_backlog_per_send']} RPCs waiting for a slot on average; slot high-water mark since the "
                   f"mount {high}"
                   + (f" of {slots}" if slots and slots < 65536 else
                      "; the table's size is not in mountstats (sysctl sunrpc.tcp_max_slot_table_entries)"
                      if slots is None else ""))
        if ceiling:
            summary += (f". Bandwidth paradox: {size(achieved)}/s is {pct(ev['throughput_vs_ceiling'])} of the "
                        f"{limit} slots x {size(write_bytes)} / {ms(rtt, thousands=False)} ms ceiling")
        start, end = _span(w["ts"], busy, c.interval_ns)
        # an O_SYNC or O_DIRECT write waits on its pages' writeback (whose WRITEs wait for slots)
        ranks, per_rank = _ranks(c, start, end, lambda k, call: k in NFS_WAITS and call in WRITE_SYSCALLS, key[0])
        ev["per_rank"] = per_rank
        tr = {"mount": mount, "max_slots": slots, "session_slots": session, "xprts": []}
        out.append(Finding("slot_saturation", "critical" if frac >= th.saturated_share_critical else "warning",
                           summary, start, end, ev, saturation_fix(tr, write_bytes, bool(session) and limit == session),
                           ranks, ["write"] if ranks else [], [server]))
    return out


def server_unresponsive(c: Counters, th: Thresholds) -> list[Finding]:
    """Silences: intervals with no reply while RPCs sent are unanswered. What is outstanding is
    counted from sends - replies - retransmissions (the ntrans - ops of the RPCs that ended)."""
    out = []
    if c.xprt is None:
        return out
    for key in c.transports("xprt"):
        server = key[1]
        x = _per_interval(c.of(key, table="xprt"), ["sends", "recvs"])
        ops = c.of(key)
        o = _per_interval(ops, ["ops", "ntrans", "timeouts"])
        retrans = dict(zip(o["ts"].tolist(), (o["ntrans"] - o["ops"]).tolist()))
        pending, quiet, run = 0, [], None
        for t, sent, got in zip(x["ts"].tolist(), x["sends"].tolist(), x["recvs"].tolist()):
            pending = max(0, pending + sent - got - retrans.get(t, 0))
            if got == 0 and pending > 0:
                run = run or [t - c.interval_ns, t, pending]
                run[1] = t
            elif run:
                quiet.append(run)
                run = None
        if run:
            quiet.append(run)
        quiet = [q for q in quiet if q[1] - q[0] >= th.silent_server_s * S]
        if not quiet:
            continue
        longest = max(e - s for s, e, _ in quiet)
        timeouts, n_retrans = _sum(ops, "timeouts"), _sum(ops, "ntrans") - _sum(ops, "ops")
        start, end = quiet[0][0], quiet[-1][1]
        ranks, per_rank = _ranks(c, start, end, lambda k, call: k in NFS_WAITS, key[0])
        ev = {**_common(c), "longest_silence_s": round(longest / S, 3),
              "silences": [{"start": iso_utc(s), "end": iso_utc(e), "seconds": round((e - s) / S, 3), "rpcs_waiting": n}
                           for s, e, n in quiet],
              "timeouts": timeouts, "retransmits": n_retrans, "per_rank": per_rank}
        summary = f"{server} sent no reply for {longest / S:.1f} s while RPCs to it were unanswered"
        if timeouts or n_retrans:
            summary += f" ({plural(timeouts, 'timeout')}, {plural(n_retrans, 'retransmission')})"
        severe = longest >= th.silent_server_critical_s * S or timeouts
        mount = c.limits.get(key, (None, None, None))[2]
        out.append(Finding("server_unresponsive", "critical" if severe else "warning", summary, start, end, ev,
                           unresponsive_fix([mount] if mount else [], server), ranks, [], [server]))
    return out


def flush_commit_stall(c: Counters, th: Thresholds) -> list[Finding]:
    """From the samples: the median rank's share of its samples on the mount that were in a flush
    call (close, fsync...), and that time; without samples, COMMITs slow at the server."""
    commits = _done(c, "COMMIT")
    n = _sum(commits, "ops")
    commit_rtt_ms = _sum(commits, "rtt_ns") / n / 1e6 if n else 0.0
    ev = {**_common(c), "commit_rpcs": n,
          "commit_execute_s": round(_sum(commits, "execute_ns") / S, 3),
          "commit_mean_ms": round(_sum(commits, "execute_ns") / n / 1e6, 3) if n else None,
          "commit_mean_rtt_ms": round(commit_rtt_ms, 3) if n else None}
    servers = sorted(set(commits["server"].to_pylist())) if n else []
    fix = flush_fix(None, commit_rtt_ms)
    if c.samples is None:
        if not n or commit_rtt_ms < th.commit_slow_ms or ev["commit_execute_s"] < th.flush_min_s:
            return []
        ts = commits["ts"].to_numpy()
        summary = (f"{plural(n, 'COMMIT')} took {ev['commit_mean_rtt_ms']:.0f} ms each at the server (round trip): "
                   "close() and fsync() wait for them")
        return [Finding("flush_commit_stall", "warning", summary, int(ts.min() - c.interval_ns), int(ts.max()),
                        ev, fix, [], [], servers)]
    on_mount = _on_mounts(c.samples["path"], c.mounts())
    s = c.samples.filter(on_mount)
    per: dict = {}          # (rank, pid of a process without one) -> [in flushes, samples, calls, first, last]
    for r in _grouped(s, ["rank", "tgid", "syscall", "state"], times=True):
        e = per.setdefault((r["rank"], None if r["rank"] is not None else r["tgid"]),
                           [0, 0, Counter(), r["ts_min"], r["ts_max"]])
        e[1] += r["n"]
        e[3], e[4] = min(e[3], r["ts_min"]), max(e[4], r["ts_max"])
        if r["syscall"] in FLUSH_SYSCALLS and r["state"] != "R":
            e[0] += r["n"]
            e[2][r["syscall"]] += r["n"]
    if not per:
        return []
    flush_s = median(v[0] * c.interval_ns / S for v in per.values())
    share = median(v[0] / v[1] for v in per.values())
    util = c.link_util
    if flush_s < th.flush_min_s or share < th.flush_share or (util is not None and util >= th.flush_link_util):
        return []
    stalled = {k: v for k, v in per.items() if v[0] * c.interval_ns / S >= th.flush_min_s and v[0] / v[1] >= th.flush_share}
    calls = sum((v[2] for v in per.values()), Counter())
    ev.update({"median_flush_s": round(flush_s, 3), "median_flush_share": round(share, 3),
               "ranks_stalled": len(stalled), "ranks": len(per),
               "flush_samples": dict(calls.most_common())})
    commit_bound = commit_rtt_ms * n / 1e3 >= 0.3 * sum(v[0] for v in per.values()) * c.interval_ns / S
    summary = (f"ranks were sampled in {'/'.join(calls)} in {pct(share)} of their samples on the mount "
               f"({flush_s:.1f} s, median): waiting for dirty pages to reach the server")
    if util is not None:
        summary += f", with the link at {pct(util)}"
    if commit_bound:
        summary += f"; {plural(n, 'COMMIT')} took {commit_rtt_ms:.0f} ms each at the server"
    elif util is None:
        summary += "; the link's capacity is unknown, so a flush that keeps it busy cannot be told from a stall"
    start = min(v[3] for v in (stalled or per).values()) - c.interval_ns
    end = max(v[4] for v in (stalled or per).values())
    ev["link_mean_util"] = util
    return [Finding("flush_commit_stall", "warning" if util is not None or commit_bound else "info", summary,
                    start, end, ev, fix,
                    sorted(rank for rank, _ in stalled if rank is not None), list(calls), servers)]


def _done(c: Counters, op: str) -> pa.Table:
    """The rows of intervals in which `op` RPCs ended (mountstats lists every op, every copy)."""
    return c.ops.filter(pc.and_(pc.equal(c.ops["op"], op), pc.greater(c.ops["ops"], 0)))


def _on_mounts(paths: pa.ChunkedArray, mounts: list[str]) -> pa.Array:
    m = pa.array([False] * len(paths))
    for point in mounts:
        m = pc.or_(m, pc.fill_null(pc.starts_with(paths, point.rstrip("/") + "/"), False))
    return m


def small_sync_writes(c: Counters, th: Thresholds) -> list[Finding]:
    writes = _done(c, "WRITE")
    w = _per_interval(writes, ["ops", "bytes_sent"])
    n = int(w["ops"].sum())
    if not n:
        return []
    mean = np.divide(w["bytes_sent"], w["ops"], out=np.zeros(len(w["ops"])), where=w["ops"] > 0)
    small = (w["ops"] > 0) & (mean < th.small_write_bytes)
    n_small = int(w["ops"][small].sum())
    if n_small < th.small_sync_min_rpcs or n_small / n < th.small_sync_share:
        return []
    commits = _sum(_done(c, "COMMIT"), "ops")
    start, end = _span(w["ts"], small, c.interval_ns)
    ranks, per_rank = _ranks(c, start, end, lambda k, call: call in WRITE_SYSCALLS and k in NFS_WAITS)
    mean_bytes = int(w["bytes_sent"][small].sum()) / n_small
    ev = {**_common(c), "small_sync_rpcs": n_small, "write_rpcs": n,
          "share": round(n_small / n, 3), "mean_write_bytes": round(mean_bytes), "commit_rpcs": commits,
          "per_rank": per_rank}
    summary = (f"{n_small:,} of {plural(n, 'WRITE RPC')} went out in intervals whose mean WRITE was under "
               f"{size(th.small_write_bytes)} ({size(mean_bytes)} with headers); with {plural(commits, 'COMMIT')}, "
               "they were most likely synchronous (O_SYNC/O_DIRECT or fsync per write: mountstats does not "
               "show a WRITE's stability)")
    servers = sorted(set(writes["server"].to_pylist()))
    return [Finding("small_sync_writes", "warning", summary, start, end, ev, small_sync_fix(), ranks,
                    ["write"] if ranks else [], servers)]


DETECTORS = (server_unresponsive, slot_saturation, flush_commit_stall, small_sync_writes)


def detect(c: Counters, th: Thresholds) -> list[Finding]:
    if c.ops is None or c.ops.num_rows == 0:
        return []
    found = [f for d in DETECTORS for f in d(c, th)]
    for f in found:
        f.confidence, f.bpf_would_add = c.confidence(), BPF_ADDS[f.kind]
    return found


def qualify(found: list[Finding], c: Counters) -> None:
    """findings.py's findings made from a sampled capture's rank table: how sure they are, and
    what a BPF recording would add."""
    for f in found:
        if f.confidence is None and f.kind in BPF_ADDS:
            f.confidence, f.bpf_would_add = c.confidence(), BPF_ADDS[f.kind]


def waits(c: Counters) -> list[dict]:
    """Per rank (or process without one): its samples, the share in each wait, and the file
    and syscall it was most often sampled in while waiting on NFS."""
    if c.samples is None:
        return []
    per: dict = {}
    for r in _grouped(c.samples, ["rank", "tgid", "state", "wchan", "syscall", "path"]):
        key = (r["rank"], None if r["rank"] is not None else r["tgid"])
        e = per.setdefault(key, {"kinds": Counter(), "files": Counter(), "calls": Counter(), "pids": set()})
        kind = wait_kind(r["state"], r["wchan"])
        e["kinds"][kind] += r["n"]
        e["pids"].add(r["tgid"])
        if kind in NFS_WAITS:
            if r["path"]:
                e["files"][r["path"]] += r["n"]
            if r["syscall"]:
                e["calls"][r["syscall"]] += r["n"]
    out = []
    for (rank, pid), e in sorted(per.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1] or 0)):
        total = sum(e["kinds"].values())
        out.append({"rank": rank, "pids": sorted(e["pids"]), "samples": total,
                    "nfs_wait_s": round(sum(e["kinds"][k] for k in NFS_WAITS) * c.interval_ns / S, 3),
                    "waits": {k: round(v / total, 3) for k, v in e["kinds"].most_common()},
                    "syscall": e["calls"].most_common(1)[0][0] if e["calls"] else None,
                    "path": e["files"].most_common(1)[0][0] if e["files"] else None})
    return out


def meanings(per_rank: list[dict]) -> dict[str, str]:
    """What each wait kind seen in waits() stands for."""
    seen = dict.fromkeys(k for w in per_rank for k in w["waits"])
    return {k: WAIT_MEANS[k] for k in seen}
