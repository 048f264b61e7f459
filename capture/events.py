"""The kernel events' fields, declared once as plain data: (name, C type) in the order of
the C struct. The agent generates its C structs and numpy decoding from them
(agent/layouts.py); the capture's tables take their column types from them (tables.py).
Times are s64 bpf_ktime_get_ns(): int64 nanoseconds of CLOCK_MONOTONIC.
"""
from __future__ import annotations

import re

import pyarrow as pa

# C scalar type -> Arrow type; char[N] is a C string.
ARROW_TYPES = {
    "u8": pa.uint8(), "u16": pa.uint16(), "u32": pa.uint32(), "u64": pa.uint64(),
    "s32": pa.int32(), "s64": pa.int64(),
}
C_STRING = re.compile(r"^char\[(\d+)\]$")


def arrow_type(ctype: str) -> pa.DataType:
    return pa.string() if C_STRING.match(ctype) else ARROW_TYPES[ctype]


def columns(fields: tuple[tuple[str, str], ...], skip=()) -> list[tuple[str, pa.DataType]]:
    """The table columns of an event's fields: padding (a leading _) and `skip` left out."""
    return [(name, arrow_type(ctype)) for name, ctype in fields if not name.startswith("_") and name not in skip]


# One row per traced syscall, emitted at sys_exit. ts_* are bpf_ktime_get_ns().
SYS_FIELDS = (
    ("ts_enter", "s64"),
    ("ts_exit", "s64"),
    ("ret", "s64"),        # returned bytes or fd, or -errno
    ("count", "u64"),      # requested bytes (write: count; writev: sum of iov_len; ftruncate: length)
    ("offset", "s64"),     # file offset for pwrite*/sync_file_range, else -1
    ("nfs_ns", "u64"),     # time inside the NFS client's entry points (NFS_CALLS below)
    ("tid", "u32"),
    ("tgid", "u32"),
    ("fd", "s32"),         # fd, or the directory fd of *at() calls (-100 = AT_FDCWD)
    ("fd2", "s32"),        # second fd: new dirfd of renameat*, new fd of dup2/dup3
    ("flags", "u32"),      # open flags, rename/unlink/stat flags, fcntl cmd
    ("op", "u16"),         # an OP_* number below
    ("nfs_calls", "u16"),  # which NFS entry points it went through: NFS_CALL_* bits
    ("npaths", "u8"),      # how many path records follow in the path ring
    ("partial", "u8"),     # 1 when writev's iovecs were only partly summed
)

# A client's slot counts, as the kernel keeps them (bpf/sunrpc.c struct client_slots, in this
# order): the `slots` table's, and an RPC's copies of them.
SLOT_COUNTS = ("in_use", "backlog", "session_wait", "sending", "pending")
SLOT_TAKEN = tuple(f"taken_{name}" for name in SLOT_COUNTS)
SLOT_FREED = tuple(f"freed_{name}" for name in SLOT_COUNTS)

# One row per RPC attempt (what /proc/self/mountstats counts as one op), emitted
# with the kernel's accounting record (sunrpc tracepoints). Times are
# bpf_ktime_get_ns(); 0 means the event was not seen. backlog/rtt/execute are the
# kernel's own numbers (rpc_stats_latency); attempts is 1, or 0 for a task still
# outstanding (complete = 0) or ended without accounting when recording stopped.
RPC_FIELDS = (
    ("ts_begin", "s64"),
    ("ts_end", "s64"),
    ("ts_reserve_start", "s64"),   # first call_reserve: the slot wait begins
    ("ts_reserved", "s64"),        # xprt_reserve: slot obtained, xid assigned
    ("ts_transmit_start", "s64"),  # first call_transmit
    ("ts_first_tx", "s64"),
    ("ts_last_tx", "s64"),
    ("backlog_us", "u64"),
    ("rtt_us", "u64"),
    ("execute_us", "u64"),
    ("backlog_sleep_ns", "u64"),   # asleep on xprt_backlog (no transport slot)
    ("session_sleep_ns", "u64"),   # asleep on the NFSv4.1 session slot table
    ("sending_sleep_ns", "u64"),   # asleep on xprt_sending (transport write lock, cwnd)
    ("pending_sleep_ns", "u64"),   # asleep on xprt_pending (waiting for the reply)
    ("delay_sleep_ns", "u64"),     # rpc_delay (e.g. after NFS4ERR_DELAY, EJUKEBOX)
    ("fileid", "u64"),             # WRITE/COMMIT/READ: the file (nfs_initiate_* just before the task)
    ("lock_owner", "u64"),         # WRITE: its pages' lock owner, the writer's files_struct (nfs_owner group)
    ("open_file", "u64"),          # WRITE: its pages' open file, a struct file (nfs_owner group)
    ("io_offset", "s64"),
    ("io_count", "u32"),
    ("io_stable", "u32"),
    ("io_dev", "u32"),             # the kernel's dev_t (major << 20 | minor)
    ("task_id", "u32"),
    ("client_id", "u32"),
    ("xprt_id", "s32"),            # the transport it used (xprt group: kprobe on xprt_reserve); -1 unknown
    ("xid", "u32"),
    ("owner_tid", "u32"),          # current at rpc_task_begin (kworker/rpciod for async writeback)
    ("owner_tgid", "u32"),
    ("status", "s32"),
    ("version", "u32"),
    ("attempts", "u16"),
    ("transmits", "u16"),
    ("retransmits", "u16"),
    ("timeouts", "u16"),
    ("task_flags", "u16"),
    ("complete", "u8"),            # 0: still outstanding when recording stopped
    ("slot_rows", "u8"),           # SLOT_ROW_* bits: which of the two counts below were taken
    ("procname", "char[24]"),
    ("progname", "char[16]"),
    # The client's slot counts (SLOT_COUNTS) just after this RPC took its transport slot, and
    # just after it gave it back (at ts_reserved, at ts_end): the `slots` rows of those changes,
    # made in user space (agent/rpc_rows.py), not in the RPC table.
    *((name, "s32") for name in SLOT_TAKEN + SLOT_FREED),
)
SLOT_ROW_TAKEN, SLOT_ROW_FREED = 1, 2

# Slot-table occupancy per RPC client, a row on every change of in_use, backlog or
# session_wait (so no peak of a slot table is missed): tasks holding a transport slot, and
# tasks asleep on each queue (sending and pending as they stand at those changes). The
# kernel emits the rows of the waits' changes; those of in_use come with the RPC's record
# (RPC_FIELDS' taken_*, freed_*).
SLOT_FIELDS = (
    ("ts", "s64"),
    ("in_use", "s32"),        # reserved a slot (xprt_reserve) and not yet finished
    ("backlog", "s32"),       # asleep on xprt_backlog: waiting for a slot
    ("session_wait", "s32"),  # asleep on the NFSv4.1 session slot table
    ("sending", "s32"),       # asleep on xprt_sending
    ("pending", "s32"),       # asleep on xprt_pending: sent, waiting for the reply
    ("client_id", "u32"),
)

# A transport's own slot counters (xprt group: a kprobe on xprt_free_slot), sampled as each
# slot is given back, before the change: every peak of num_reqs and backlog is seen (bpf/xprt.c).
# (Captures before 2026-12-07 have its sending and pending queues' lengths too; the `slots` rows
# have them per client, each read here cost ~100 instructions a WRITE.)
XPRT_FIELDS = (
    ("ts", "s64"),
    ("xprt_id", "u32"),            # struct rpc_xprt id: one per connection (nconnect makes several)
    ("client_id", "u32"),          # an RPC client of the transport's (its latest request's): its server
    ("num_reqs", "u32"),           # slots allocated (in use, plus up to min_reqs idle ones)
    ("max_reqs", "u32"),           # the table's limit
    ("min_reqs", "u32"),           # preallocated slots
    ("backlog", "u32"),            # tasks waiting for a slot
    ("alloc", "u8"),               # 0: sampled as a slot is given back (1: as a task asked, in older captures)
    ("_pad", "char[7]"),
)

# Who writes through which open file with which files_struct (nfs_file_write kprobe),
# once per change: joins a WRITE's lock owner and open file back to a process.
OWNER_FIELDS = (
    ("ts", "s64"),
    ("files", "u64"),              # current->files: what the writer's lock contexts name
    ("file", "u64"),               # the struct file written through: its open context's flock_owner
    ("tid", "u32"),
    ("tgid", "u32"),
)

# WRITE / COMMIT / READ as the NFS client issues and completes them (nfs tracepoints).
NFS_FIELDS = (
    ("ts", "s64"),
    ("fileid", "u64"),
    ("offset", "s64"),
    ("stable", "u64"),
    ("count", "u32"),              # requested (arg_count)
    ("res_count", "u32"),          # done (res_count), on completion
    ("dev", "u32"),
    ("status", "s32"),             # the RPC status (bytes on success for WRITE), on completion
    ("tid", "u32"),
    ("tgid", "u32"),
    ("kind", "u32"),               # NFS_* below
    ("_pad", "u32"),
    ("verifier", "u64"),
)

NFS_WRITE_START, NFS_WRITE_DONE, NFS_COMMIT_START, NFS_COMMIT_DONE, NFS_READ_START, NFS_READ_DONE = range(1, 7)
NFS_KINDS = {NFS_WRITE_START: "write_start", NFS_WRITE_DONE: "write_done", NFS_COMMIT_START: "commit_start",
             NFS_COMMIT_DONE: "commit_done", NFS_READ_START: "read_start", NFS_READ_DONE: "read_done"}
