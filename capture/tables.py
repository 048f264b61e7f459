"""The capture's tables: one registry, name -> major version -> Arrow schema, for the writer,
every reader and export alike.

Raw event fields keep the Arrow types their declaration gives (events.py); the rest are what
the agent adds in user space (file names, identities, counters). A new column keeps the major
version (readers give older segments nulls for it); a change that older readers would misread
takes a new major, added beside the old one so that old captures still read.
"""
from __future__ import annotations

import pyarrow as pa

from . import events
from .events import NFS_FIELDS, OWNER_FIELDS, RPC_FIELDS, SLOT_FIELDS, XPRT_FIELDS


def _sys(name: str) -> pa.DataType:
    return events.arrow_type(dict(events.SYS_FIELDS)[name])


SYSCALL = pa.schema([
    ("ts_enter", _sys("ts_enter")), ("ts_exit", _sys("ts_exit")), ("latency_ns", pa.int64()),
    ("tid", _sys("tid")), ("tgid", _sys("tgid")),
    ("syscall", pa.dictionary(pa.int8(), pa.string())),
    ("fd", _sys("fd")), ("ret", _sys("ret")),
    ("bytes", pa.int64()),          # bytes written, for the write family and successes
    ("requested", _sys("count")), ("offset", _sys("offset")),
    ("errno", pa.int32()), ("flags", _sys("flags")), ("iov_partial", pa.bool_()),
    ("path", pa.string()), ("path2", pa.string()), ("dev", pa.uint64()), ("ino", pa.uint64()),
    ("fstype", pa.string()),
    # time inside the NFS client's fsync/flush/getattr, and which of them (null: not traced)
    ("nfs_ns", pa.int64()), ("nfs_calls", pa.string()),
])

PROCS = pa.schema([
    ("ts", pa.int64()), ("tgid", pa.uint32()), ("ppid", pa.uint32()), ("comm", pa.string()),
    ("cmdline", pa.string()), ("cgroup", pa.string()),
    ("rank", pa.int32()), ("local_rank", pa.int32()), ("world_size", pa.int32()),
    ("rank_env", pa.map_(pa.string(), pa.string())),
    ("rank_source", pa.string()), ("inherited_from", pa.uint32()), ("complete", pa.bool_()),
])

# Snapshots of the traced syscalls in progress (blocked) for a while: who is stuck, in
# what, since when; one row per call per snapshot (about every second, and at stop).
BLOCKED = pa.schema([
    ("ts", pa.int64()), ("tid", pa.uint32()), ("tgid", pa.uint32()), ("syscall", pa.string()),
    ("ts_enter", pa.int64()), ("fd", pa.int32()), ("path", pa.string()), ("dev", pa.uint64()),
    ("ino", pa.uint64()),
])

LOSS = pa.schema([
    ("ts", pa.int64()), ("interval_ns", pa.int64()), ("probe", pa.string()),
    ("counter", pa.string()), ("lost", pa.uint64()),
])

AGENT = pa.schema([
    ("ts", pa.int64()), ("cpu_user_ns", pa.int64()), ("cpu_sys_ns", pa.int64()),
    ("rss_bytes", pa.int64()), ("events", pa.int64()), ("rows", pa.int64()),
    ("capture_bytes", pa.int64()), ("bpf_run_ns", pa.int64()), ("bpf_run_cnt", pa.int64()),
])

# Raw RPC fields (as declared), then the spans derived from them, all in ns.
RPC = pa.schema(events.columns(RPC_FIELDS, skip=("slot_rows", *events.SLOT_TAKEN, *events.SLOT_FREED)) + [
    ("slot_wait_ns", pa.int64()),      # call_reserve -> xprt_reserve (or the backlog sleeps)
    ("transmit_wait_ns", pa.int64()),  # call_transmit -> first transmit (or the xprt_sending sleeps)
    ("backlog_ns", pa.int64()), ("rtt_ns", pa.int64()), ("execute_ns", pa.int64()),
    ("age_ns", pa.int64()),            # outstanding ones: how long they had been running at stop
    ("server", pa.string()),
])

NFS_IO = pa.schema(events.columns(NFS_FIELDS, skip=("kind",)) + [("kind", pa.string())])

XPRT = pa.schema(events.columns(XPRT_FIELDS) + [("server", pa.string())])

OWNERS = pa.schema(events.columns(OWNER_FIELDS))

SLOTS = pa.schema(events.columns(SLOT_FIELDS) + [("server", pa.string())])

NETDEV = pa.schema([
    ("ts", pa.int64()), ("iface", pa.string()), ("server", pa.string()), ("speed_bps", pa.int64()),
    ("tx_bytes", pa.uint64()), ("rx_bytes", pa.uint64()), ("tx_packets", pa.uint64()), ("rx_packets", pa.uint64()),
])

KMSG = pa.schema([("ts", pa.int64()), ("level", pa.int8()), ("message", pa.string())])

# Sampled mode (record --no-bpf): what an ordinary user can read, every interval. Counters are
# deltas over the interval that ends at ts, except max_slots (a high-water mark since the mount)
# and the io columns of proc_io (cumulative, as /proc/PID/io gives them). Times in ns (mountstats
# counts whole ms).
MS_OPS = pa.schema([
    ("ts", pa.int64()), ("interval_ns", pa.int64()), ("mount", pa.string()), ("server", pa.string()),
    ("op", pa.string()), ("ops", pa.int64()), ("ntrans", pa.int64()), ("timeouts", pa.int64()),
    ("bytes_sent", pa.int64()), ("bytes_recv", pa.int64()), ("queue_ns", pa.int64()),
    ("rtt_ns", pa.int64()), ("execute_ns", pa.int64()), ("errors", pa.int64()),
])

MS_XPRT = pa.schema([
    ("ts", pa.int64()), ("interval_ns", pa.int64()), ("mount", pa.string()), ("server", pa.string()),
    ("xprt", pa.int16()), ("srcport", pa.int32()), ("connect_count", pa.int64()), ("sends", pa.int64()),
    ("recvs", pa.int64()), ("bad_xids", pa.int64()), ("req_u", pa.int64()), ("bklog_u", pa.int64()),
    ("sending_u", pa.int64()), ("pending_u", pa.int64()), ("max_slots", pa.int64()),
])

# One row per thread of the job per interval: where it was when looked at.
THREAD_SAMPLES = pa.schema([
    ("ts", pa.int64()), ("tgid", pa.uint32()), ("tid", pa.uint32()), ("state", pa.string()),
    ("wchan", pa.string()), ("syscall", pa.string()), ("fd", pa.int32()), ("path", pa.string()),
    ("read_ok", pa.bool_()),        # false: /proc did not answer within the timeout (the row holds what did)
])

PROC_IO = pa.schema([
    ("ts", pa.int64()), ("tgid", pa.uint32()), ("rchar", pa.int64()), ("wchar", pa.int64()),
    ("syscr", pa.int64()), ("syscw", pa.int64()), ("read_bytes", pa.int64()), ("write_bytes", pa.int64()),
])

# Every table: name -> {major version: schema}. The writer writes the newest major; a reader
# reads every major listed and refuses a newer one. Order: how export and dump list them.
TABLES: dict[str, dict[int, pa.Schema]] = {
    "slots": {1: SLOTS},
    "netdev": {1: NETDEV},
    "kmsg": {1: KMSG},
    "ms_ops": {1: MS_OPS}, "ms_xprt": {1: MS_XPRT}, "thread_samples": {1: THREAD_SAMPLES}, "proc_io": {1: PROC_IO},
    "rpc": {1: RPC},
    "nfs_io": {1: NFS_IO},
    "owners": {1: OWNERS},
    "xprt": {1: XPRT},
    "syscall": {1: SYSCALL},
    "blocked": {1: BLOCKED},
    "procs": {1: PROCS},
    "loss": {1: LOSS},
    "agent": {1: AGENT},
}


# Each table's times (CLOCK_MONOTONIC ns; 0 means "not seen"): what a reader converts to UTC
# with meta.json's clock pair.
TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "syscall": ("ts_enter", "ts_exit"),
    "rpc": ("ts_begin", "ts_end", "ts_reserve_start", "ts_reserved", "ts_transmit_start",
            "ts_first_tx", "ts_last_tx"),
    "blocked": ("ts", "ts_enter"),
    **dict.fromkeys(("slots", "netdev", "kmsg", "nfs_io", "owners", "xprt", "procs", "loss", "agent", "ms_ops", "ms_xprt", "thread_samples", "proc_io"), ("ts",)),
}


# The columns a row means nothing without: its times, and what an RPC or a syscall was and how it
# ended. A segment without one of them, or with nulls in one, is damaged and skipped; a segment
# without another column reads it as nulls (it is from before the column was added).
ESSENTIAL: dict[str, tuple[str, ...]] = {
    **TIME_COLUMNS,
    "rpc": TIME_COLUMNS["rpc"] + ("procname", "complete", "status", "timeouts", "execute_ns", "io_count",
                                  "io_stable"),
    "syscall": TIME_COLUMNS["syscall"] + ("syscall", "latency_ns"),
}


def newest(table: str) -> tuple[int, pa.Schema]:
    """The major version the writer writes, and its schema."""
    major = max(TABLES[table])
    return major, TABLES[table][major]


def schema(table: str) -> pa.Schema:
    return newest(table)[1]
