"""How a finding's evidence reads in every output (terminal report, TUI, HTML): each field
of findings.py's evidence, declared once here with its label and its formatter from units.py.

Values are scalars, records (a dict of fields, such as a straggler), lists of records (one
per rank, silence...) or tallies (a dict of names to counts or to records: WRITEs by
stability, flush calls by syscall). The JSON keeps the raw keys and numbers; these are for
people."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .job import utc_ns
from .units import byte_rate, clock, duration, number, pct, pids, rate, round_rate, size


def _count(v) -> str:
    return number(v)


def _s(v) -> str:
    return duration(v * 1e9)


def _ms(v) -> str:
    return number(v, "ms")


def _time(v) -> str:
    return f"{clock(utc_ns(v))} UTC"


def _yes(v) -> str:
    return "yes" if v else "no"


def _names(v) -> str:
    return ", ".join(map(str, v))


def _uptimes(v) -> str:
    """The kernel's uptime at a plain dmesg's first and last line (no clock of the day)."""
    lo, hi = v
    return _s(lo) if lo == hi else f"{number(lo, like=hi)} .. {_s(hi)}"


@dataclass(frozen=True)
class Field:
    label: str
    fmt: Callable[[object], str] = str


FIELDS: dict[str, Field] = {
    # who
    "rank": Field("rank"), "host": Field("host"), "pid": Field("pid"), "pids": Field("pids", pids),
    "task": Field("task"), "syscall": Field("syscall"), "path": Field("file"),
    # slot_saturation
    "saturated_fraction": Field("slot table full", pct), "saturated_s": Field("time full", _s),
    "window_s": Field("save window", _s), "peak_in_use": Field("peak slots in use", _count),
    "max_slots": Field("slot table size", _count), "session_slots": Field("NFSv4.1 session slots", _count),
    "backlog_peak": Field("peak RPCs waiting for a slot", _count), "mean_waiting": Field("mean RPCs waiting", number),
    "write_rpcs": Field("WRITE RPCs", _count), "mean_write_bytes": Field("mean WRITE", size),
    "slot_wait_share": Field("slot wait's share of WRITE time", pct), "mean_slot_wait_ms": Field("mean slot wait", _ms),
    "mean_rtt_ms": Field("mean round trip", _ms), "mean_slot_hold_ms": Field("mean slot hold", _ms),
    "sending_s": Field("time sending WRITEs", _s), "throughput_Bps": Field("throughput while sending", byte_rate),
    "littles_law_ceiling_Bps": Field("Little's-law ceiling (slots x WRITE / hold)", byte_rate),
    "throughput_vs_ceiling": Field("throughput of the ceiling", pct), "link_iface": Field("link"),
    "link_speed_bps": Field("link speed", round_rate), "link_mean_util": Field("link mean utilisation", pct),
    "link_peak_util": Field("link peak utilisation", pct), "link_mean_tx_bps": Field("link mean sent", rate),
    # sampled captures and mountstats (sampled.py)
    "shortest_stall_visible_s": Field("time resolution (a shorter stall blurs into its interval)", _s),
    "queued_intervals": Field("intervals with WRITEs queued for a slot", pct),
    "intervals_writing": Field("intervals with WRITEs", _count),
    "mean_backlog_per_send": Field("mean RPCs waiting for a slot per send (bklog_u/sends)", number),
    "queue_share": Field("queue's share of WRITE time", pct), "mean_queue_ms": Field("mean WRITE queue", _ms),
    "littles_law_ceiling_rtt_Bps": Field("Little's-law ceiling (slots x WRITE / RTT)", byte_rate),
    "sampled_share": Field("share of its samples", pct), "flush_samples": Field("samples in flush calls"), "nfs_wait_s": Field("sampled waiting on NFS", _s),
    # server_unresponsive
    "longest_silence_s": Field("longest silence", _s), "silences": Field("silences"),
    "start": Field("from", _time), "end": Field("to", _time), "seconds": Field("for", _s),
    "rpcs_waiting": Field("RPCs waiting", _count), "timeouts": Field("timeouts", _count),
    "retransmits": Field("retransmissions", _count), "outstanding_at_stop": Field("RPCs outstanding at the stop", _count),
    "oldest_outstanding_s": Field("oldest outstanding RPC", _s),
    "kernel_not_responding": Field("kernel 'not responding' lines", _count),
    "kernel_ok": Field("kernel 'OK' lines", _count), "first_not_responding": Field("first 'not responding'", _time),
    "kernel_uptime_s": Field("at kernel uptime", _uptimes),
    # flush_commit_stall
    "median_flush_s": Field("median time in flushes per rank", _s),
    "median_flush_share": Field("median share of a rank's save in flushes", pct),
    "calls": Field("flush calls"), "count": Field("calls", _count),
    "total_s": Field("total time", _s),
    "ranks_stalled": Field("ranks stalled", _count), "ranks": Field("ranks", _count),
    "commit_rpcs": Field("COMMIT RPCs", _count), "commit_execute_s": Field("COMMIT time, summed", _s),
    "commit_mean_ms": Field("mean COMMIT", _ms), "commit_mean_rtt_ms": Field("mean COMMIT round trip", _ms),
    "median_bytes_per_rank": Field("median bytes per rank", size), "bytes_per_fsync": Field("bytes per fsync", size),
    # small_sync_writes
    "small_sync_rpcs": Field("small synchronous WRITEs", _count), "share": Field("their share", pct),
    "stable": Field("WRITEs by stability"), "size_histogram": Field("WRITEs by size"),
    "ranks_affected": Field("ranks affected", _count), "per_rank": Field("per rank"),
    "small_sync": Field("small synchronous WRITEs", _count), "writes": Field("WRITEs", _count),
    "mean_bytes": Field("mean WRITE", size),
    # metadata_storm
    "source": Field("measured on"), "metadata_ops": Field("metadata operations", _count),
    "share_of_time": Field("share of the time", pct), "by_op": Field("by operation"),
    "metadata_rpcs": Field("metadata RPCs"), "metadata_s": Field("time in metadata", _s),
    # straggler_rank
    "median_end_s": Field("median rank's end", _s), "save_s": Field("save", _s),
    "median_bytes": Field("median bytes per rank", size), "stragglers": Field("stragglers"),
    "end_s": Field("ended at", _s), "bytes_written": Field("written", size), "blocked_s": Field("blocked", _s),
    "slot_wait_s": Field("slot wait", _s), "critical_path": Field("critical path"),
    "blocked_in": Field("blocked in"), "why": Field("why"),
    # straggler_node
    "nodes": Field("late nodes"), "node_ranks": Field("ranks", _names),
    "node_throughput_Bps": Field("its ranks wrote", byte_rate), "other_nodes_median_end_s": Field("the other nodes' median rank's end", _s),
    "other_nodes_throughput_Bps": Field("the other nodes' ranks wrote", byte_rate),
    # hung_tasks
    "rpcs_never_completed": Field("RPCs never completed", _count), "oldest_rpc_s": Field("oldest RPC", _s),
    "rpc_procs": Field("by procedure"), "blocked_syscalls": Field("syscalls blocked"),
    "still_blocked": Field("still blocked at the stop", _yes),
    "kernel_hung_task_reports": Field("kernel hung-task reports", _count),
    "kernel_hung_in_nfs": Field("in NFS/RPC code", _count), "kernel_hung_tasks": Field("hung tasks"),
    "functions": Field("in", _names),
}


def label(key: str) -> str:
    """A field's label; a field not declared reads as its key with spaces."""
    field = FIELDS.get(key)
    return field.label if field else key.replace("_", " ")


def _is_record(v) -> bool:
    return isinstance(v, dict) and bool(v) and all(k in FIELDS for k in v)


def value(key: str, v) -> str:
    """A field's value as it reads in a line: scalars through their formatter, a record as
    'label value' pairs, a tally as 'name value' pairs."""
    if v is None:
        return "-"
    if _is_record(v):
        return record(v)
    if isinstance(v, dict):         # a tally: names (not fields) to counts or records
        return ", ".join(f"{name} ({record(x)})" if isinstance(x, dict) else f"{name} {_count(x)}"
                         for name, x in v.items())
    if isinstance(v, list) and v and isinstance(v[0], dict):
        return "; ".join(record(x) for x in v)
    field = FIELDS.get(key)
    if field is None:
        return number(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
    return field.fmt(v)


def record(rec: dict) -> str:
    """'rank 1, host vm, small synchronous WRITEs 128': its known fields, nulls (and a flag that is
    not set) left out."""
    return ", ".join(f"{label(k)} {value(k, v)}" for k, v in rec.items() if v is not None and v is not False and v != [])


def is_nested(v) -> bool:
    return isinstance(v, (dict, list)) and not (isinstance(v, list) and v and not isinstance(v[0], dict))


def scalars(evidence: dict) -> list[tuple[str, str, str]]:
    """(key, label, value) of the evidence's known scalar values (lists of names count as
    scalars: a pair of uptimes, a task's functions)."""
    return [(k, label(k), value(k, v)) for k, v in evidence.items() if v is not None and not is_nested(v)]


def nested(evidence: dict) -> list[tuple[str, object]]:
    """(key, value) of the evidence's records, lists of records and tallies that hold something."""
    return [(k, v) for k, v in evidence.items() if is_nested(v) and v]


def table(v: dict | list) -> tuple[list[str], list[list[str]]]:
    """A nested value as a table: (head, rows) of labels and formatted cells."""
    if isinstance(v, list):
        keys = [k for k in dict.fromkeys(k for x in v for k in x) if any(x.get(k) is not None for x in v)]
        return [label(k) for k in keys], [[value(k, x.get(k)) for k in keys] for x in v]
    if _is_record(v):
        return ["", "value"], [[label(k), value(k, x)] for k, x in v.items() if x is not None]
    return ["", "count"], [[name, record(x) if isinstance(x, dict) else _count(x)] for name, x in v.items()]


def lines(evidence: dict, items: int = 4) -> list[str]:
    """The evidence in lines for a terminal: the scalars in one ('evidence: ...', to be wrapped),
    then each nested value, a list of records one line per record (the first `items`)."""
    out = []
    flat = scalars(evidence)
    if flat:
        out.append("evidence: " + ", ".join(f"{name} {text}" for _, name, text in flat))
    for k, v in nested(evidence):
        if isinstance(v, list):
            out.append(f"{label(k)}:")
            out += [f"  {record(x)}" for x in v[:items]]
            if len(v) > items:
                out.append(f"  ... {len(v) - items} more (--json for all)")
        else:
            out.append(f"{label(k)}: {value(k, v)}")
    return out
