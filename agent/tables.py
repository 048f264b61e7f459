"""Arrow schemas of the tables the agent writes, with their major versions.

Raw event fields keep the Arrow types their layout declares (agent/layouts.py);
the rest are what user space adds (file names, identities, counters).
"""
from __future__ import annotations

import pyarrow as pa

from .layouts import NFS_EVENT, OWNER_EVENT, RPC_EVENT, SLOT_EVENT, SYS_EVENT, XPRT_EVENT

_sys = SYS_EVENT.arrow_type

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
RPC = pa.schema([(name, RPC_EVENT.arrow_type(name)) for name, _ in RPC_EVENT.fields if not name.startswith("_")] + [
    ("slot_wait_ns", pa.int64()),      # call_reserve -> xprt_reserve (or the backlog sleeps)
    ("transmit_wait_ns", pa.int64()),  # call_transmit -> first transmit (or the xprt_sending sleeps)
    ("backlog_ns", pa.int64()), ("rtt_ns", pa.int64()), ("execute_ns", pa.int64()),
    ("age_ns", pa.int64()),            # outstanding ones: how long they had been running at stop
    ("server", pa.string()),
])

NFS_IO = pa.schema([(name, NFS_EVENT.arrow_type(name)) for name, _ in NFS_EVENT.fields
                    if name not in ("_pad", "kind")] + [("kind", pa.string())])

XPRT = pa.schema([(name, XPRT_EVENT.arrow_type(name)) for name, _ in XPRT_EVENT.fields if not name.startswith("_")] +
                 [("server", pa.string())])

OWNERS = pa.schema([(name, OWNER_EVENT.arrow_type(name)) for name, _ in OWNER_EVENT.fields])

SLOTS = pa.schema([(name, SLOT_EVENT.arrow_type(name)) for name, _ in SLOT_EVENT.fields] +
                  [("server", pa.string())])

NETDEV = pa.schema([
    ("ts", pa.int64()), ("iface", pa.string()), ("server", pa.string()), ("speed_bps", pa.int64()),
    ("tx_bytes", pa.uint64()), ("rx_bytes", pa.uint64()), ("tx_packets", pa.uint64()), ("rx_packets", pa.uint64()),
])

KMSG = pa.schema([("ts", pa.int64()), ("level", pa.int8()), ("message", pa.string())])

SCHEMAS: dict[str, tuple[pa.Schema, int]] = {
    "slots": (SLOTS, 1),
    "netdev": (NETDEV, 1),
    "kmsg": (KMSG, 1),
    "rpc": (RPC, 1),
    "nfs_io": (NFS_IO, 1),
    "owners": (OWNERS, 1),
    "xprt": (XPRT, 1),
    "syscall": (SYSCALL, 1),
    "blocked": (BLOCKED, 1),
    "procs": (PROCS, 1),
    "loss": (LOSS, 1),
    "agent": (AGENT, 1),
}
