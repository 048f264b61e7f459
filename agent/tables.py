"""Arrow schemas of the tables the agent writes, with their major versions.

Raw event fields keep the Arrow types their layout declares (agent/layouts.py);
the rest are what user space adds (file names, identities, counters).
"""
from __future__ import annotations

import pyarrow as pa

from .layouts import SYS_EVENT

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
])

PROCS = pa.schema([
    ("ts", pa.int64()), ("tgid", pa.uint32()), ("ppid", pa.uint32()), ("comm", pa.string()),
    ("cmdline", pa.string()), ("cgroup", pa.string()),
    ("rank", pa.int32()), ("local_rank", pa.int32()), ("world_size", pa.int32()),
    ("rank_env", pa.map_(pa.string(), pa.string())),
    ("rank_source", pa.string()), ("inherited_from", pa.uint32()), ("complete", pa.bool_()),
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

SCHEMAS: dict[str, tuple[pa.Schema, int]] = {
    "syscall": (SYSCALL, 1),
    "procs": (PROCS, 1),
    "loss": (LOSS, 1),
    "agent": (AGENT, 1),
}
