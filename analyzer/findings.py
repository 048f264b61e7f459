"""The findings: each cause the analyzer can name, defined from measured quantities.

A detector looks at one cause and returns its findings (none when the cause is absent).
Each finding carries the numbers it was decided on (evidence), the window, the ranks,
syscalls and servers involved, and the fix. Thresholds are in thresholds.py. A finding
that another explains (EXPLAINS: a straggler whose small synchronous writes are found, a
flush stall behind a full slot table, a full slot table toward a silent server) names its
cause, which takes the symptom's severity and comes first. The verdict is the most severe
warning or critical finding that nothing explains; between equally severe ones, the cause
earlier in CAUSES (the one the others follow from) wins.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import FLUSH_SYSCALLS, METADATA_SYSCALLS, WRITE_SYSCALLS

from .attribution import attributed_writes
from .calls import file_calls
from .job import Job, iso_utc, partition, with_host
from .ranks import RANK_KEYS, blocked_calls, rank_key, rank_name, with_identity
from .rpcs import METADATA_PROCS, silences
from .thresholds import Thresholds
from .transports import link_util, server_addr
from .report_text import rank_ranges
from .units import byte_rate, ms, pct, plural, rate, size

CAUSES = ("server_unresponsive", "slot_saturation", "hung_tasks", "straggler_node", "straggler_rank",
          "flush_commit_stall",
          "small_sync_writes", "metadata_storm")
SEVERITIES = ("critical", "warning", "info")
STABLE_NAMES = {0: "UNSTABLE", 1: "DATA_SYNC", 2: "FILE_SYNC"}
S = 1_000_000_000


@dataclass
class Finding:
    kind: str
    severity: str
    summary: str
    start: int | None          # UTC ns
    end: int | None
    evidence: dict
    fix: str
    ranks: list = field(default_factory=list)
    syscalls: list = field(default_factory=list)
    servers: list = field(default_factory=list)
    explained_by: str | None = None     # the kind of the finding that causes this one
    # found without BPF (sampled.py): how sure it is, and what a BPF recording would add
    confidence: str | None = None
    bpf_would_add: str | None = None
    fixes: list = field(default_factory=list)     # the fix's changes with their predicted effect (whatif.py)

    def as_json(self) -> dict:
        return {"kind": self.kind, "severity": self.severity, "summary": self.summary,
                "start": iso_utc(self.start), "end": iso_utc(self.end), "evidence": self.evidence,
                "ranks": self.ranks, "syscalls": self.syscalls, "servers": self.servers, "fix": self.fix,
                "fixes": self.fixes, "explained_by": self.explained_by} | (
                    {"confidence": self.confidence, "bpf_would_add": self.bpf_would_add} if self.confidence else {})


@dataclass
class Context:
    """What every detector may look at; computed once by analysis.analyze()."""
    job: Job
    th: Thresholds
    ranks: list[dict]            # rank_table()
    transports: list[dict]       # transport_table()
    rpc: pa.Table | None         # attributed_rpcs(), with UTC times added
    window: tuple[int, int] | None
    log: pa.Table | None         # kernel_log fingerprints (kmsg table and --kernel-log)
    _transports: dict | None = field(default=None, repr=False)

    def savers(self) -> list[dict]:
        """The rank entries that wrote: the save's participants (ranked ones if any)."""
        wrote = [r for r in self.ranks if r["bytes_written"] or r["write_rpcs"]]
        ranked = [r for r in wrote if r["rank"] is not None]
        return ranked or wrote

    def rpcs_to(self, host: str, server: str, proc: str | None = None) -> pa.Table | None:
        if self.rpc is None:
            return None
        parts = self.per_transport()
        rpc = self.rpc if parts is None else parts.get((host, server), self.rpc.slice(0, 0))
        m = pc.equal(rpc["server"], server)
        if len(self.job.captures) > 1:
            m = pc.and_(m, pc.equal(rpc["host"], host))
        if proc:
            m = pc.and_(m, pc.equal(rpc["procname"], proc))
        return rpc if pc.all(m).as_py() else rpc.filter(m)   # filter copies every column

    def per_transport(self) -> dict[tuple, pa.Table] | None:
        """The RPC rows of each (host, server), taken apart once (filtered out of every host's
        rows per transport, 1,000 nodes took 12 minutes). None where a host or server is null
        (rpcs_to's filter of all rows says what those belong to)."""
        if self._transports is None and not (self.rpc["host"].null_count or self.rpc["server"].null_count):
            self._transports = partition(self.rpc, ["host", "server"])
        return self._transports

    def top_syscalls(self, entries: list[dict], n: int = 3) -> list[str]:
        total: dict[str, int] = {}
        for r in entries:
            for name, s in r["syscalls"].items():
                total[name] = total.get(name, 0) + s["total_ns"]
        return [k for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:n] if v > 0]


def rank_ids(entries: list[dict]) -> list[int]:
    return sorted({r["rank"] for r in entries if r["rank"] is not None})


def _s(ns: float | None) -> float | None:
    return None if ns is None else round(ns / S, 3)


# --- slot_saturation (with the bandwidth paradox) ---------------------------------------

def slot_saturation(ctx: Context) -> list[Finding]:
    out = []
    for tr in ctx.transports:
        frac = tr["saturated_fraction"]
        writes = ctx.rpcs_to(tr["host"], tr["server"], "WRITE")
        if frac is None or writes is None or writes.num_rows == 0:
            continue
        done = writes.select(["complete", "execute_ns", "slot_wait_ns", "session_sleep_ns", "io_count", "rtt_ns",
                              "ts_end", "ts_reserved"])
        done = done.filter(pc.equal(done["complete"], 1))
        execute = pc.sum(done["execute_ns"]).as_py() or 0
        # Waiting for a transport slot, and on NFSv4.1+ for a session slot before that.
        session_wait = pc.sum(done["session_sleep_ns"]).as_py() or 0
        wait = (pc.sum(done["slot_wait_ns"]).as_py() or 0) + session_wait
        table = "NFSv4.1 session slot table" if session_wait > wait / 2 else "slot table"
        wait_share = wait / execute if execute else 0.0
        if frac < ctx.th.saturated_share or wait_share < ctx.th.slot_wait_share:
            continue
        n = done.num_rows
        write_bytes = (pc.sum(done["io_count"]).as_py() or 0) / n if n else 0
        rtt = (pc.sum(done["rtt_ns"]).as_py() or 0) / n if n else 0
        held = pc.subtract(done["ts_end"], done["ts_reserved"])
        held = pc.filter(held, pc.greater(done["ts_reserved"], 0))
        hold = pc.mean(held).as_py() if len(held) else None
        limit = tr["max_slots"] if tr["max_slots"] and tr["max_slots"] < 65536 else tr["peak_in_use"]
        if tr["session_slots"]:
            limit = min(limit or tr["session_slots"], tr["session_slots"])
        window_ns = ctx.window[1] - ctx.window[0] if ctx.window else None
        # throughput while WRITEs were being sent: a save's planning (DCP's collectives) and its
        # last small files are not time the slots could have carried more
        sending_ns = (pc.max(done["ts_end"]).as_py() or 0) - (pc.min(done["ts_reserved"]).as_py() or 0)
        achieved = (pc.sum(done["io_count"]).as_py() or 0) / (sending_ns / S) if sending_ns > 0 else None
        ceiling = limit * write_bytes / (hold / S) if limit and hold else None
        link = tr["link"] or {}
        ev = {
            "saturated_fraction": round(frac, 3), "saturated_s": round(tr["saturated_s"], 3),
            "window_s": _s(window_ns), "peak_in_use": tr["peak_in_use"], "max_slots": tr["max_slots"],
            "session_slots": tr["session_slots"], "backlog_peak": tr["backlog_peak"],
            "mean_waiting": round(tr["mean_waiting"], 2), "write_rpcs": n, "mean_write_bytes": round(write_bytes),
            "slot_wait_share": round(wait_share, 3), "mean_slot_wait_ms": round(wait / n / 1e6, 3) if n else None,
            "mean_rtt_ms": round(rtt / 1e6, 3), "mean_slot_hold_ms": round(hold / 1e6, 3) if hold else None,
            "sending_s": _s(sending_ns), "throughput_Bps": round(achieved) if achieved else None,
            "littles_law_ceiling_Bps": round(ceiling) if ceiling else None,
            "throughput_vs_ceiling": round(achieved / ceiling, 3) if achieved and ceiling else None,
            "link_iface": link.get("iface"), "link_speed_bps": link.get("speed_bps"),
            "link_mean_util": link.get("mean_util"), "link_peak_util": link.get("peak_util"),
            "link_mean_tx_bps": link.get("mean_tx_bps"),
        }
        summary = (f"{table} toward {tr['server']} full {pct(frac)} of the save "
                   f"({tr['peak_in_use']} in use, up to {plural(tr['backlog_peak'] or 0, 'RPC')} waiting for a slot); "
                   f"slot wait is {pct(wait_share)} of WRITE time")
        if ceiling:
            summary += (f". Bandwidth paradox: {size(achieved or 0)}/s is {pct(ev['throughput_vs_ceiling'])} "
                        f"of the {limit} slots x {size(write_bytes)} / {ms(hold, thousands=False)} ms ceiling")
            if link.get("mean_util") is not None:
                summary += f", while the link carried {pct(link['mean_util'])} of {rate(link['speed_bps'])}"
            elif link.get("mean_tx_bps") is not None:
                summary += f", while the link carried {rate(link['mean_tx_bps'])} (speed unknown)"
        affected = [r for r in ctx.savers() if (r["slot_wait_ns"] or 0) > 0]
        out.append(Finding(
            "slot_saturation", "critical" if frac >= ctx.th.saturated_share_critical else "warning",
            summary, *(ctx.window or (None, None)), ev, saturation_fix(tr, write_bytes, table != "slot table"),
            rank_ids(affected), ctx.top_syscalls(affected), [tr["server"]]))
    return out


def saturation_fix(tr: dict, write_bytes: float, session_bound: bool) -> str:
    mount = tr["mount"] or {}
    nconnect = mount.get("nconnect") or 1
    steps = []
    if session_bound:
        steps.append(f"raise the NFSv4.1 session slots (client: /sys/module/nfs/parameters/max_session_slots, "
                     f"now {tr['session_slots'] or '?'}, then remount; the server grants at most its own limit, "
                     "so check the server's session slot setting too)")
    else:
        # the sysctl sizes each connection's table (the kernel's own max_reqs where the xprt probes ran)
        per_connection = (tr["xprts"][0]["max_reqs"] if tr.get("xprts") else
                          tr["max_slots"] // int(nconnect) if tr["max_slots"] else "?")
        more = "nconnect=16 (the most)" if int(nconnect) >= 8 else "nconnect=8"
        steps.append(f"raise the transport slot table (sysctl sunrpc.tcp_max_slot_table_entries, now "
                     f"{per_connection}{' per connection' if int(nconnect) > 1 else ''}, takes effect on new "
                     f"mounts) or mount with {more} (now {nconnect}) to spread RPCs over more connections")
    if write_bytes and write_bytes < 256 * 1024:
        steps.append(f"send fewer, larger WRITEs: the mean WRITE is {size(write_bytes)}; write through the "
                     "page cache in large chunks and fsync once per file instead of O_SYNC/O_DIRECT small writes")
    return "; ".join(steps)


# --- server_unresponsive ----------------------------------------------------------------

def server_unresponsive(ctx: Context) -> list[Finding]:
    th, out = ctx.th, []
    log_lines = _log_by_server(ctx.log)
    for host, server in [(tr["host"], tr["server"]) for tr in ctx.transports]:
        rpcs = ctx.rpcs_to(host, server)
        if rpcs is None or rpcs.num_rows == 0:
            continue
        stop = _stop_utc(ctx.job, host)
        sent = pc.if_else(pc.greater(rpcs["ts_first_tx"], 0), rpcs["ts_first_tx_utc"], rpcs["ts_begin_utc"])
        complete = pc.equal(rpcs["complete"], 1)
        ended = pc.if_else(complete, rpcs["ts_end_utc"], stop)
        transmitted = pc.greater(rpcs["ts_first_tx"], 0)
        # a reply ended it, not a timeout error (soft mounts give up with -EIO/-ETIMEDOUT)
        replied = pc.and_(complete, pc.or_(pc.greater_equal(rpcs["status"], 0), pc.equal(rpcs["timeouts"], 0)))
        keep = transmitted.to_numpy(zero_copy_only=False)
        quiet = silences(np.asarray(sent)[keep], np.asarray(ended)[keep],
                         replied.to_numpy(zero_copy_only=False)[keep], stop, int(th.silent_server_s * S))
        lines = log_lines.pop((host, server_addr(server)), None) or log_lines.pop((None, server_addr(server)), None)
        timeouts = int(pc.sum(rpcs["timeouts"]).as_py() or 0)
        retrans = int(pc.sum(rpcs["retransmits"]).as_py() or 0)
        if not quiet and not (lines and lines["not_responding"]):
            continue
        longest = max((e - s for s, e, _ in quiet), default=0)
        outstanding = rpcs.filter(pc.invert(complete))
        ev = {"longest_silence_s": _s(longest), "silences": [
                  {"start": iso_utc(s), "end": iso_utc(e), "seconds": _s(e - s), "rpcs_waiting": n}
                  for s, e, n in quiet],
              "timeouts": timeouts, "retransmits": retrans,
              "outstanding_at_stop": outstanding.num_rows,
              "oldest_outstanding_s": _s(pc.max(outstanding["age_ns"]).as_py()) if outstanding.num_rows else None,
              "kernel_not_responding": lines["not_responding"] if lines else 0,
              "kernel_ok": lines["responding"] if lines else 0,
              "first_not_responding": lines and iso_utc(lines["first"])}
        severe = longest >= th.silent_server_critical_s * S or timeouts or (lines and lines["not_responding"])
        start = min((s for s, _, _ in quiet), default=lines and lines["first"])
        end = max((e for _, e, _ in quiet), default=lines and lines["last"])
        summary = (f"{server} sent no reply for {longest / S:.1f} s while RPCs to it waited" if quiet
                   else f"the kernel logged {server_addr(server)} not responding")
        if timeouts or retrans:
            summary += f" ({plural(timeouts, 'timeout')}, {plural(retrans, 'retransmission')})"
        if lines and lines["not_responding"]:
            summary += f"; kernel: 'server {server_addr(server)} not responding' x{lines['not_responding']}"
        out.append(Finding("server_unresponsive", "critical" if severe else "warning", summary, start, end, ev,
                           _unresponsive_fix(ctx, host, server), _ranks_blocked_in(ctx, start, end), [],
                           [server]))
    for (host, addr), lines in log_lines.items():     # a server known only from the kernel log
        if lines["not_responding"]:
            out.append(Finding(
                "server_unresponsive", "critical",
                f"the kernel logged 'server {addr} not responding' x{lines['not_responding']}"
                f" ({lines['responding']} 'OK')", lines["first"], lines["last"],
                {"kernel_not_responding": lines["not_responding"], "kernel_ok": lines["responding"],
                 "kernel_uptime_s": lines["uptime_s"] and [min(lines["uptime_s"]), max(lines["uptime_s"])]},
                _unresponsive_fix(ctx, host, addr), [], [], [addr]))
    return out


def _unresponsive_fix(ctx: Context, host: str | None, server: str) -> str:
    cap = next((c for c in ctx.job.captures if c.meta.get("host", "?") == host), None)
    return unresponsive_fix((cap.meta.get("nfs_mounts") or []) if cap else [], server)


def unresponsive_fix(mounts: list[dict], server: str) -> str:
    """The fix for a silent server, with the timeo/retrans of its mount among `mounts` (meta.json's)."""
    fix = (f"check {server_addr(server)}: nfsd threads stuck or too few, its storage, a failover, or "
           "the network path (loss, a firewall, MTU); clients on a hard mount wait for it forever")
    for m in mounts:
        if m.get("server") == server_addr(server) and m.get("timeo"):
            fix += (f" (this mount: timeo={m['timeo']} ds, retrans={m.get('retrans')}; the kernel only logs "
                    "'not responding' after those retries)")
            break
    return fix


def _log_by_server(log: pa.Table | None) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    if log is None:
        return out
    for row in log.filter(pc.is_in(log["kind"], pa.array(["not_responding", "timed_out", "responding"]))).to_pylist():
        e = out.setdefault((row.get("host"), row["server"]), {"not_responding": 0, "responding": 0,
                                                               "first": None, "last": None, "uptime_s": []})
        key = "responding" if row["kind"] == "responding" else "not_responding"
        e[key] += 1
        t = row.get("ts_utc_ns")
        if t is not None:
            e["first"] = t if e["first"] is None else min(e["first"], t)
            e["last"] = t if e["last"] is None else max(e["last"], t)
        elif row.get("ts_mono_ns") is not None:    # a plain dmesg: only the kernel's own clock
            e["uptime_s"].append(round(row["ts_mono_ns"] / S, 3))
    return out


def _stop_utc(job: Job, host: str) -> int:
    for cap in job.captures:
        if cap.meta.get("host", "?") == host:
            stop = cap.meta.get("stop") or {}
            if "realtime_ns" in stop:
                return int(stop["realtime_ns"])
    return int(np.iinfo(np.int64).max // 2)


def _ranks_blocked_in(ctx: Context, start: int | None, end: int | None) -> list[int]:
    """Ranks whose save was under way somewhere in [start, end] (a rank still blocked at the
    stop has its save open until then: rank_table reads the agent's blocked-call snapshots)."""
    if start is None or end is None:
        return []
    return rank_ids([r for r in ctx.ranks if r["save_start_ns"] <= end and r["save_end_ns"] >= start])


# --- flush_commit_stall -----------------------------------------------------------------

def flush_commit_stall(ctx: Context) -> list[Finding]:
    th = ctx.th
    # a sampled rank's time in close/fsync is counted in samples: sampled.flush_commit_stall judges it
    savers = [r for r in ctx.savers() if r["save_s"] > 0 and not r["from_samples"]]
    if not savers:
        return []
    flush_s = median(r["flush_ns"] / S for r in savers)
    share = median(r["flush_ns"] / S / r["save_s"] for r in savers)
    util = link_util(ctx.transports)
    if flush_s < th.flush_min_s or share < th.flush_share or (util is not None and util >= th.flush_link_util):
        return []
    stalled = [r for r in savers if r["flush_ns"] / S >= th.flush_min_s and r["flush_ns"] / S / r["save_s"] >= th.flush_share]
    calls = {name: {"count": sum(r["syscalls"].get(name, {}).get("count", 0) for r in savers),
                    "total_s": _s(sum(r["syscalls"].get(name, {}).get("total_ns", 0) for r in savers))}
             for name in FLUSH_SYSCALLS}
    ev = {"median_flush_s": round(flush_s, 3), "median_flush_share": round(share, 3),
          "link_mean_util": util, "calls": {k: v for k, v in calls.items() if v["count"]},
          "ranks_stalled": len(stalled), "ranks": len(savers)}
    commits = None
    if ctx.rpc is not None:
        commits = ctx.rpc.select(["procname", "complete", "execute_ns", "rtt_ns"])
        commits = commits.filter(pc.equal(commits["procname"], "COMMIT"))
    if commits is not None and commits.num_rows:
        ev["commit_rpcs"] = commits.num_rows
        ev["commit_execute_s"] = _s(pc.sum(commits["execute_ns"]).as_py())
        ev["commit_mean_ms"] = round(pc.mean(commits["execute_ns"]).as_py() / 1e6, 3)
        # The server's part is the round trip: execute also holds the waits for a slot and to transmit.
        answered = commits.filter(pc.equal(commits["complete"], 1))
        if answered.num_rows:
            ev["commit_mean_rtt_ms"] = round(pc.mean(answered["rtt_ns"]).as_py() / 1e6, 3)
    flushed = median(r["bytes_written"] for r in savers)
    fsyncs = calls["fsync"]["count"] + calls["fdatasync"]["count"]
    ev["median_bytes_per_rank"] = flushed
    if fsyncs:
        ev["bytes_per_fsync"] = round(sum(r["bytes_written"] for r in savers) / fsyncs)
    summary = (f"ranks spend {pct(share)} of their save ({flush_s:.1f} s, median) in "
               f"{'/'.join(k for k in calls if calls[k]['count'])} waiting for dirty pages to reach the server")
    if util is not None:
        summary += f", with the link at {pct(util)}"
    fix = flush_fix(flushed, ev.get("commit_mean_rtt_ms") or 0)
    # Without the link's capacity a flush that keeps the link busy looks the same as a stall,
    # unless the server's COMMITs take a large part of it.
    commit_s = (ev.get("commit_mean_rtt_ms") or 0) * (ev.get("commit_rpcs") or 0) / 1e3
    commit_bound = commit_s >= 0.3 * sum(r["flush_ns"] for r in savers) / S
    severity = "warning" if util is not None or commit_bound else "info"
    if severity == "info":
        summary += "; the link's capacity is unknown, so a flush that keeps it busy cannot be told from a stall"
    start = min(r["save_start_ns"] for r in stalled or savers)
    end = max(r["save_end_ns"] for r in stalled or savers)
    return [Finding("flush_commit_stall", severity, summary, start, end, ev, fix, rank_ids(stalled),
                    [k for k in FLUSH_SYSCALLS if calls[k]["count"]], _servers(ctx))]


def flush_fix(flushed: float | None, commit_rtt_ms: float) -> str:
    """The fix for a flush stall: `flushed` bytes per rank when known; slow COMMITs named."""
    fix = ("close() and fsync() wait for every dirty page of the file to be written back"
           + (f" ({size(flushed)} per rank here)" if flushed is not None else "")
           + ". Start writeback while writing (sync_file_range(SYNC_FILE_RANGE_WRITE) every few MiB, or a lower "
           "vm.dirty_background_bytes), fsync once per file rather than per chunk, and overlap the flush with "
           "training (save from a background thread)")
    if commit_rtt_ms > 50:
        fix += (f"; COMMITs take {commit_rtt_ms:.0f} ms each at the server (round trip): its stable "
                "storage is slow")
    return fix


def _servers(ctx: Context) -> list[str]:
    return sorted({tr["server"] for tr in ctx.transports if tr["server"]})


# --- small_sync_writes ------------------------------------------------------------------

def small_sync_writes(ctx: Context) -> list[Finding]:
    th = ctx.th
    writes = attributed_writes(ctx.job)
    if writes is None or writes.num_rows == 0:
        return []
    small = pc.and_(pc.less(writes["io_count"], int(th.small_write_bytes)), pc.greater(writes["io_stable"], 0))
    writes = writes.append_column("small_sync", pc.cast(small, pa.int64()))
    # per process first (the rows are many), then per rank
    per = writes.group_by(["host", "attributed_tgid"]).aggregate([("small_sync", "sum"), ("small_sync", "count"),
                                                                  ("io_count", "sum")])
    per = with_identity(ctx.job, per, tgid="attributed_tgid").group_by(RANK_KEYS).aggregate(
        [("small_sync_sum", "sum"), ("small_sync_count", "sum"), ("io_count_sum", "sum")])
    per = [{"host": g["host"], "rank": g["rank"], "solo": g["solo"], "small_sync_sum": g["small_sync_sum_sum"],
            "small_sync_count": g["small_sync_count_sum"],
            "io_count_mean": g["io_count_sum_sum"] / g["small_sync_count_sum"]} for g in per.to_pylist()]
    hit = [g for g in per if g["small_sync_sum"] >= th.small_sync_min_rpcs
           and g["small_sync_sum"] / g["small_sync_count"] >= th.small_sync_share]
    if not hit:
        return []
    savers = ctx.savers()
    keys = {(g["host"], g["rank"], g["solo"]) for g in hit}
    entries = [r for r in savers if rank_key(r) in keys]
    # The WRITEs' owners (nfs_io) may be known without their syscalls (none traced, or none
    # readable): then the ranks are those that sent WRITEs, and the finding spans the save window.
    ranks = len(savers) or len(per)
    stable = {STABLE_NAMES.get(k, str(k)): v for k, v in
              zip(*np.unique(writes["io_stable"].to_numpy(zero_copy_only=False), return_counts=True))}
    sizes = writes["io_count"].to_numpy(zero_copy_only=False)
    hist = {}
    if sizes.size:
        b = np.maximum(sizes, 1).astype(np.int64)
        buckets, counts = np.unique(1 << (np.log2(b).astype(np.int64)), return_counts=True)
        hist = {size(int(k)): int(v) for k, v in zip(buckets, counts)}
    n_small = sum(g["small_sync_sum"] for g in hit)
    mean_size = float(np.mean(sizes))
    ev = {"small_sync_rpcs": n_small, "write_rpcs": writes.num_rows,
          "share": round(n_small / writes.num_rows, 3), "mean_write_bytes": round(mean_size),
          "stable": {k: int(v) for k, v in stable.items()}, "size_histogram": hist,
          "ranks_affected": len(hit), "ranks": ranks,
          "per_rank": [{"rank": g["rank"], "pid": g["solo"], "host": g["host"], "small_sync": g["small_sync_sum"],
                        "writes": g["small_sync_count"], "mean_bytes": round(g["io_count_mean"])}
                       for g in sorted(hit, key=lambda g: (-g["small_sync_sum"], g["rank"] is None, g["rank"] or 0))[:20]]}
    severity = "warning" if len(hit) >= th.small_sync_rank_share * ranks else "info"
    summary = (f"{n_small:,} of {plural(writes.num_rows, 'WRITE RPC')} are small and synchronous (under "
               f"{size(th.small_write_bytes)}, stable; mean {size(mean_size)}) from {len(hit)} of "
               f"{plural(ranks, 'rank')}: each waits a round trip and a server-side sync")
    span = entries or savers
    start, end = ((min(r["save_start_ns"] for r in span), max(r["save_end_ns"] for r in span)) if span
                  else ctx.window or (None, None))
    return [Finding("small_sync_writes", severity, summary, start, end, ev, small_sync_fix(), rank_ids(entries or hit),
                    [k for k in ctx.top_syscalls(entries) if k in WRITE_SYSCALLS], _servers(ctx))]


def small_sync_fix() -> str:
    return ("write through the page cache in large chunks (at least the mount's wsize), drop O_SYNC/O_DSYNC and "
            "per-write fsync, and fsync once when the file is complete; the client then sends large UNSTABLE "
            "WRITEs and one COMMIT")


# --- metadata_storm ---------------------------------------------------------------------

def metadata_storm(ctx: Context) -> list[Finding]:
    """Metadata's share of the time the ranks spent in syscalls (what they waited for), or of
    RPC time when no syscalls were traced. RPC execute times are not added up when syscalls
    exist: RPCs queued together overlap, so their sum overweights a bulk flush."""
    th = ctx.th
    savers = ctx.savers()
    count = spent = total = 0
    by_syscall: dict[str, int] = {}
    for r in savers:
        for name, s in r["syscalls"].items():
            total += s["total_ns"]
            if name in METADATA_SYSCALLS:
                count += s["count"]
                spent += s["total_ns"]
                by_syscall[name] = by_syscall.get(name, 0) + s["count"]
    by_rpc: dict[str, int] = {}
    if ctx.rpc is not None and ctx.rpc.num_rows:
        t = ctx.rpc.select(["procname", "execute_ns"])
        m = t.filter(pc.is_in(t["procname"], pa.array(sorted(METADATA_PROCS))))
        by_rpc = {r["procname"]: r["procname_count"] for r in m.group_by("procname").aggregate(
            [("procname", "count")]).to_pylist()}
        if not savers:
            count, spent, total = m.num_rows, pc.sum(m["execute_ns"]).as_py() or 0, pc.sum(t["execute_ns"]).as_py() or 0
    source = "syscalls" if savers else "RPCs"
    share = spent / total if total else 0
    if count < th.metadata_min_ops or share < th.metadata_share:
        return []
    top = sorted((by_syscall if savers else by_rpc).items(), key=lambda kv: -kv[1])
    heavy = sorted(savers, key=lambda r: -sum(s["total_ns"] for n, s in r["syscalls"].items()
                                              if n in METADATA_SYSCALLS))[:8]
    ev = {"source": source, "metadata_ops": count, "share_of_time": round(share, 3), "by_op": dict(top),
          "metadata_rpcs": dict(sorted(by_rpc.items(), key=lambda kv: -kv[1])), "metadata_s": _s(spent),
          "total_s": _s(total)}
    summary = (f"metadata {source} take {pct(share)} of the time: "
               + ", ".join(f"{n} {k}" for k, n in top[:4]))
    if savers and by_rpc:
        summary += " (RPCs: " + ", ".join(f"{n} {k}" for k, n in sorted(by_rpc.items(), key=lambda kv: -kv[1])[:4]) + ")"
    fix = ("cut metadata round trips: create the checkpoint directories once (not per rank and step), "
           "avoid exists()/stat() polling and per-tensor files (write one file per rank), and do not "
           "rename/unlink many small files; attribute caching (actimeo) helps repeated GETATTRs")
    return [Finding("metadata_storm", "warning", summary, *(ctx.window or (None, None)), ev, fix,
                    rank_ids(heavy), _metadata_syscalls(savers), _servers(ctx))]


def _metadata_syscalls(savers: list[dict]) -> list[str]:
    """The metadata syscalls the ranks spent most time in (by_op names RPCs when they were seen)."""
    spent: dict[str, int] = {}
    for r in savers:
        for name, s in r["syscalls"].items():
            if name in METADATA_SYSCALLS:
                spent[name] = spent.get(name, 0) + s["total_ns"]
    return [k for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v > 0][:4]


# --- straggler_rank ---------------------------------------------------------------------

def straggler_rank(ctx: Context) -> list[Finding]:
    th = ctx.th
    savers = [r for r in ctx.savers() if r["rank"] is not None] or ctx.savers()
    if len(savers) < 3:
        return []
    t0 = min(r["save_start_ns"] for r in savers)
    med_end = median(r["save_end_ns"] - t0 for r in savers)
    med_bytes = median(r["bytes_written"] for r in savers)
    late = [r for r in savers if r["save_end_ns"] - t0 >= th.straggler_ratio * med_end
            and r["save_end_ns"] - t0 - med_end >= th.straggler_min_s * S]
    if not late:
        return []
    late.sort(key=lambda r: -r["save_end_ns"])
    last = late[0]
    calls = sorted(last["syscalls"].items(), key=lambda kv: -kv[1]["total_ns"])
    ev = {"median_end_s": _s(med_end), "save_s": _s(max(r["save_end_ns"] for r in savers) - t0),
          "median_bytes": med_bytes,
          "stragglers": [{"rank": r["rank"], "host": r["host"], "pids": r["pids"],
                          "end_s": _s(r["save_end_ns"] - t0), "bytes_written": r["bytes_written"],
                          "blocked_s": _s(r["blocked_ns"]), "slot_wait_s": _s(r["slot_wait_ns"])}
                         for r in late[:10]],
          "critical_path": {"rank": last["rank"], "host": last["host"],
                            "blocked_in": {k: {"count": v["count"], "total_s": _s(v["total_ns"])}
                                           for k, v in calls[:5]}}}
    who = ", ".join(rank_name(r) for r in late[:5])
    summary = (f"{who} finished {(last['save_end_ns'] - t0) / S:.1f} s into the save, "
               f"{(last['save_end_ns'] - t0) / max(med_end, 1):.1f}x the median rank's {med_end / S:.1f} s; "
               f"the save waits for it")
    if med_bytes and last["bytes_written"] >= 1.5 * med_bytes:
        why = f"it wrote {size(last['bytes_written'])}, {last['bytes_written'] / med_bytes:.1f}x the median"
        fix = "balance the checkpoint shards across ranks (" + why + "), or save the large state in parallel"
    else:
        top = calls[0][0] if calls else "?"
        why = f"it spent most of its time in {top}"
        fix = (f"look at what rank {last['rank']} does differently ({why}): its files, write sizes and "
               "flags, its node's link and mount")
    ev["why"] = why
    return [Finding("straggler_rank", "warning", summary + f": {why}", t0, last["save_end_ns"], ev, fix,
                    rank_ids(late), [k for k, _ in calls[:3]], _servers(ctx))]


# --- straggler_node ---------------------------------------------------------------------

def straggler_node(ctx: Context) -> list[Finding]:
    """A node whose ranks end late together: its median rank ends straggler_ratio times later than
    the other nodes' ranks (their median). straggler_rank cannot see it when the node holds half
    the job's ranks or more: the median rank is then one of its own. One late rank does not make
    its node late (the node's median rank is on time)."""
    th = ctx.th
    by_host: dict[str, list[dict]] = {}
    for r in [r for r in ctx.savers() if r["rank"] is not None] or ctx.savers():
        by_host.setdefault(r["host"], []).append(r)
    if len(by_host) < 2:
        return []
    t0 = min(r["save_start_ns"] for rs in by_host.values() for r in rs)
    ends = {h: [_s(r["save_end_ns"] - t0) for r in rs] for h, rs in by_host.items()}
    nodes = {h: {"host": h, "node_ranks": rank_ids(rs), "median_end_s": median(ends[h]), "end_s": max(ends[h]),
                 "bytes_written": sum(r["bytes_written"] for r in rs),
                 "node_throughput_Bps": round(sum(r["bytes_written"] for r in rs)
                                         / max(1e-9, _s(max(r["save_end_ns"] for r in rs)
                                                        - min(r["save_start_ns"] for r in rs)))),
                 "slot_wait_s": _s(sum(r["slot_wait_ns"] or 0 for r in rs))}
             for h, rs in by_host.items()}
    late = []
    for h, node in nodes.items():
        others = median(e for o in nodes if o != h for e in ends[o])
        mine = node["median_end_s"]
        if mine >= th.straggler_ratio * others and mine - others >= th.straggler_min_s:
            late.append((node, others))
    if not late:
        return []
    late.sort(key=lambda nl: -nl[0]["end_s"])
    node, others = late[0]
    rest = [n for h, n in nodes.items() if h not in {m["host"] for m, _ in late}]
    if not rest:        # every node late against the others: none sets the pace
        return []
    rest_rate = sum(n["bytes_written"] for n in rest) / max(1e-9, max(n["end_s"] for n in rest))
    ev = {"nodes": [m for m, _ in late], "other_nodes_median_end_s": others,
          "other_nodes_throughput_Bps": round(rest_rate)}
    ranks = sorted(r for m, _ in late for r in m["node_ranks"])
    summary = (f"host {node['host']} (ranks {rank_ranges(node['node_ranks'])}) finished {node['end_s']:.1f} s into the save, "
               f"its median rank {node['median_end_s'] / max(others, 1e-9):.1f}x later than the other nodes' ranks "
               f"(their median {others:.1f} s); its ranks wrote "
               f"{byte_rate(node['node_throughput_Bps'])}, the others {byte_rate(rest_rate)}: the save waits for the node")
    fix = (f"look at host {node['host']}'s link and mount (its rows under per transport): a slower, shared or "
           "rate-limited link, another server or mount options; all its ranks wait on it, not on their own work")
    end = t0 + int(node["end_s"] * S)
    hosts = {m["host"] for m, _ in late}
    servers = sorted({tr["server"] for tr in ctx.transports if tr["server"] and tr["host"] in hosts})
    return [Finding("straggler_node", "warning", summary, t0, end, ev, fix, ranks, [], servers)]


# --- hung_tasks -------------------------------------------------------------------------

def hung_tasks(ctx: Context) -> list[Finding]:
    th = ctx.th
    limit = int(th.hung_s * S)
    ev: dict = {}
    start = end = None
    ranks: list[int] = []
    servers: set[str] = set()
    if ctx.rpc is not None:
        stuck = ctx.rpc.filter(pc.and_(pc.equal(ctx.rpc["complete"], 0), pc.greater_equal(ctx.rpc["age_ns"], limit)))
        if stuck.num_rows:
            ev["rpcs_never_completed"] = stuck.num_rows
            ev["oldest_rpc_s"] = _s(pc.max(stuck["age_ns"]).as_py())
            ev["rpc_procs"] = dict(sorted({r["procname"]: r["procname_count"] for r in stuck.group_by(
                "procname").aggregate([("procname", "count")]).to_pylist()}.items()))
            servers |= set(stuck["server"].to_pylist())
            start = pc.min(stuck["ts_begin_utc"]).as_py()
    blocked = long_blocked(ctx, limit)
    if blocked:
        ev["blocked_syscalls"] = blocked[:20]
        ranks = sorted({b["rank"] for b in blocked if b["rank"] is not None})
    log = ctx.log
    if log is not None:
        hung = log.filter(pc.equal(log["kind"], "hung_task"))
        if hung.num_rows:
            nfs = hung.filter(pc.equal(hung["nfs_related"], True)) if "nfs_related" in hung.column_names else hung
            ev["kernel_hung_task_reports"] = hung.num_rows
            ev["kernel_hung_in_nfs"] = nfs.num_rows
            ev["kernel_hung_tasks"] = [{"task": r["task"], "pid": r["pid"], "blocked_s": r["blocked_s"],
                                        "functions": (r.get("functions") or [])[:8]} for r in nfs.to_pylist()[:10]]
            if nfs.num_rows == 0:
                del ev["kernel_hung_tasks"]
    if not (ev.get("rpcs_never_completed") or blocked or ev.get("kernel_hung_in_nfs")):
        return []
    parts = []
    if ev.get("rpcs_never_completed"):
        parts.append(f"{plural(ev['rpcs_never_completed'], 'RPC')} never completed (oldest {ev['oldest_rpc_s']:.0f} s)")
    if blocked:
        still = sum(b["still_blocked"] for b in blocked)
        parts.append(f"{plural(len(blocked), 'syscall')} blocked over {th.hung_s:.0f} s "
                     f"({', '.join(sorted({b['syscall'] for b in blocked}))}; longest "
                     f"{max(b['seconds'] for b in blocked):.0f} s"
                     + (f", {still} still blocked when recording stopped)" if still else ")"))
    if ev.get("kernel_hung_in_nfs"):
        parts.append(f"the kernel reported {plural(ev['kernel_hung_in_nfs'], 'hung task')} in NFS/RPC code")
    fix = ("processes are stuck in uninterruptible NFS waits: find the RPCs they wait for (server_unresponsive "
           "above, or the server's logs), do not kill -9 them (D state ignores it), and consider the mount's "
           "timeo/retrans; a soft mount trades hangs for I/O errors, which a checkpoint must then handle")
    if blocked:
        end = max(b["_end"] for b in blocked)
        start = min(start or end, min(b["_start"] for b in blocked))
        for b in blocked:
            del b["_start"], b["_end"]
    return [Finding("hung_tasks", "critical", "; ".join(parts), start, end, ev, fix, ranks,
                    sorted({b["syscall"] for b in blocked}), sorted(s for s in servers if s))]


def long_blocked(ctx: Context, limit: int) -> list[dict]:
    """Syscalls that took `limit` ns or more: finished ones (syscall rows), and ones still in
    progress in the agent's snapshots of blocked calls (a hung call never finishes)."""
    out, finished = [], set()
    summary = file_calls(ctx.job)    # its per-file maxima say whether any row is worth looking for
    slow = [with_host(t.filter(pc.greater_equal(t["latency_ns"], limit)), cap.meta.get("host", "?"))
            for cap, t in ctx.job.per_capture("syscall")
            if summary is not None and (pc.max(summary["latency_ns_max"]).as_py() or 0) >= limit]
    sc = pa.concat_tables(slow, promote_options="permissive") if slow else None
    if sc is not None and sc.num_rows:
        sc = sc.set_column(sc.schema.get_field_index("syscall"), "syscall", pc.cast(sc["syscall"], pa.string()))
        sc = with_identity(ctx.job, sc.select(["host", "tid", "tgid", "syscall", "ts_enter", "ts_exit", "path"]))
        for r in sc.to_pylist():
            finished.add((r["host"], r["tid"], r["ts_enter"]))
            off = ctx.job.utc_offset_ns(r["host"])
            out.append({"rank": r["rank"], "host": r["host"], "pid": r["tgid"], "syscall": r["syscall"],
                        "path": r["path"], "seconds": _s(r["ts_exit"] - r["ts_enter"]), "still_blocked": False,
                        "_start": r["ts_enter"] + off, "_end": r["ts_exit"] + off})
    calls = blocked_calls(ctx.job)
    if calls is not None:
        calls = calls.filter(pc.greater_equal(pc.subtract(calls["ts"], calls["ts_enter"]), limit))
        for r in with_identity(ctx.job, calls).to_pylist():
            if (r["host"], r["tid"], r["ts_enter"]) in finished:
                continue        # snapshots of a call that returned later: its syscall row says it all
            off = ctx.job.utc_offset_ns(r["host"])
            out.append({"rank": r["rank"], "host": r["host"], "pid": r["tgid"], "syscall": r["syscall"],
                        "path": r["path"], "seconds": _s(r["ts"] - r["ts_enter"]), "still_blocked": r["at_stop"],
                        "_start": r["ts_enter"] + off, "_end": r["ts"] + off})
    return sorted(out, key=lambda b: -b["seconds"])


DETECTORS = (server_unresponsive, slot_saturation, hung_tasks, flush_commit_stall, straggler_node, straggler_rank,
             small_sync_writes, metadata_storm)


def _overlap(a: Finding, b: Finding) -> bool:
    return a.start is not None and b.start is not None and a.start <= (b.end or b.start) \
        and b.start <= (a.end or a.start)


def _same_servers(a: Finding, b: Finding) -> bool:
    return not a.servers or not b.servers or bool(set(a.servers) & set(b.servers))


# symptom -> [(cause, when the cause explains it, the words that say how)], the first that holds
EXPLAINS = {
    "straggler_rank": [
        # when the late ranks are a late node's
        ("straggler_node", lambda s, c: bool(s.ranks) and set(s.ranks) <= set(c.ranks),
         "they are the late node's ranks"),
        # when the small synchronous writes set the stragglers apart (not every rank makes them; a
        # sampled capture's counters do not say whose writes were small)
        ("small_sync_writes", lambda s, c: bool(s.ranks) and set(s.ranks) <= set(c.ranks)
         and "ranks_affected" in c.evidence and c.evidence["ranks_affected"] < c.evidence["ranks"],
         "its small synchronous writes, each a round trip")],
    "flush_commit_stall": [("slot_saturation", lambda s, c: _overlap(s, c) and _same_servers(s, c),
                            "the flush waits behind the full slot table")],
    "slot_saturation": [("server_unresponsive", lambda s, c: _overlap(s, c) and _same_servers(s, c),
                         "the slots stay taken while the server does not answer")],
    "hung_tasks": [("server_unresponsive", lambda s, c: _overlap(s, c) and _same_servers(s, c),
                    "the calls wait for a server that does not answer")],
}


def explain(found: list[Finding]) -> None:
    """Each symptom names the finding that causes it, which takes its severity if higher."""
    for symptom in found:
        cause, kind, how = next(((c, kind, how) for kind, holds, how in EXPLAINS.get(symptom.kind, ())
                                 for c in found if c.kind == kind and c.explained_by is None and holds(symptom, c)),
                                (None, None, None))
        if cause is None:
            continue
        symptom.explained_by = kind
        symptom.summary += f" (explained by {kind}: {how})"
        if SEVERITIES.index(symptom.severity) < SEVERITIES.index(cause.severity):
            cause.severity = symptom.severity


def find(ctx: Context, more: list[Finding] = ()) -> list[Finding]:
    """Every detector's findings and `more` (found elsewhere: sampled.py), settled."""
    return settle([f for detect in DETECTORS for f in detect(ctx)] + list(more))


def settle(found: list[Finding]) -> list[Finding]:
    """The findings explained, and in the order of the reports: causes, then by severity."""
    explain(found)
    return sorted(found, key=lambda f: (f.explained_by is not None, SEVERITIES.index(f.severity),
                                        CAUSES.index(f.kind)))


def verdict(findings: list[Finding]) -> str:
    serious = [f for f in findings if f.severity in ("critical", "warning") and f.explained_by is None]
    return serious[0].kind if serious else "healthy"
