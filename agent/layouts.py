"""Event layouts, declared once.

Each event the BPF programs emit is declared here as an ordered list of
(name, C type). From that one declaration come the C struct handed to BCC,
the numpy dtype that decodes a whole ring-buffer span at once, and the Arrow
types of the decoded columns. Nothing here imports bcc.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

# C scalar type -> (numpy type, arrow type). Timestamps are s64 so they land
# in Arrow as int64 nanoseconds of CLOCK_MONOTONIC, as the capture format says.
_SCALARS = {
    "u8": (np.uint8, pa.uint8()),
    "u16": (np.uint16, pa.uint16()),
    "u32": (np.uint32, pa.uint32()),
    "u64": (np.uint64, pa.uint64()),
    "s32": (np.int32, pa.int32()),
    "s64": (np.int64, pa.int64()),
}
_ARRAY = re.compile(r"^char\[(\d+)\]$")


@dataclass(frozen=True)
class Layout:
    name: str
    fields: tuple[tuple[str, str], ...]

    def c_struct(self) -> str:
        """The C declaration, with a compile-time size check against numpy's view."""
        lines = []
        for fname, ctype in self.fields:
            m = _ARRAY.match(ctype)
            lines.append(f"    char {fname}[{m.group(1)}];" if m else f"    {ctype} {fname};")
        body = "\n".join(lines)
        return (
            f"struct {self.name} {{\n{body}\n}};\n"
            f"_Static_assert(sizeof(struct {self.name}) == {self.dtype.itemsize}, "
            f'"{self.name}: C and numpy layouts differ");\n'
        )

    @cached_property
    def dtype(self) -> np.dtype:
        spec = []
        for fname, ctype in self.fields:
            m = _ARRAY.match(ctype)
            spec.append((fname, f"S{m.group(1)}") if m else (fname, _SCALARS[ctype][0]))
        # align=True reproduces the C compiler's padding on x86_64 and arm64.
        return np.dtype(spec, align=True)

    def arrow_type(self, fname: str) -> pa.DataType:
        ctype = dict(self.fields)[fname]
        return pa.string() if _ARRAY.match(ctype) else _SCALARS[ctype][1]

    @cached_property
    def _strings(self) -> tuple[str, ...]:
        """The C string fields (padding aside)."""
        return tuple(f for f, ctype in self.fields if _ARRAY.match(ctype) and not f.startswith("_"))

    @cached_property
    def _struct_type(self) -> pa.StructType:
        """The record as Arrow sees it (padding left out): C strings as fixed-size binary."""
        return pa.struct([(fname, pa.binary(self.dtype[fname].itemsize) if fname in self._strings
                           else self.arrow_type(fname)) for fname, _ in self.fields if not fname.startswith("_")])

    def to_arrow(self, records: np.ndarray) -> dict[str, pa.Array]:
        """Columns of a decoded record array (padding fields left out), in one conversion:
        a pa.array per field was most of rpc_table's time (its 38 fields, whatever the rows)."""
        batch = pa.RecordBatch.from_struct_array(pa.array(records, type=self._struct_type))
        cols = dict(zip(batch.schema.names, batch.columns))
        for fname in self._strings:   # procedure names, paths: few distinct values
            cols[fname] = per_value(cols[fname], _c_string, pa.string())
        return cols


def _c_string(v: bytes) -> str:
    return v.split(b"\0", 1)[0].decode("utf-8", "replace")


# One row per traced syscall, emitted at sys_exit. ts_* are bpf_ktime_get_ns().
SYS_EVENT = Layout("sys_event", (
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
))

# A syscall between its enter and exit, per thread (the `inflight` map, keyed by tid):
# the agent reads the map to see who is blocked right now, and in what.
INFLIGHT = Layout("inflight", (
    ("ts_enter", "s64"),
    ("count", "u64"),
    ("offset", "s64"),
    ("path1", "u64"),      # user pointers of the path arguments (read at exit)
    ("path2", "u64"),
    ("nfs_since", "s64"),  # entry of the outermost NFS call in progress
    ("nfs_ns", "u64"),     # time in NFS calls so far
    ("tgid", "u32"),
    ("fd", "s32"),
    ("fd2", "s32"),
    ("flags", "u32"),
    ("op", "u16"),
    ("nfs_calls", "u16"),
    ("partial", "u8"),
    ("skip", "u8"),        # an ignored fd's close: bump the generation, emit nothing
    ("nfs_depth", "u8"),   # NFS calls nest (a flush inside a getattr): time the outermost
))

# The path strings of path-taking syscalls, in their own ring; joined to their
# syscall by (tid, ts_enter). slot 0 is the first path argument, 1 the second.
PATH_MAX_CAPTURED = 256
PATH_EVENT = Layout("path_event", (
    ("ts_enter", "s64"),
    ("tid", "u32"),
    ("len", "s32"),        # bpf_probe_read_user_str's result; PATH_MAX_CAPTURED = truncated
    ("slot", "u8"),
    ("_pad", "char[7]"),
    ("path", f"char[{PATH_MAX_CAPTURED}]"),
))

# Process lifecycle: new tasks (with clone flags, so threads and processes are
# told apart without reading kernel structs), exec and exit.
PROC_EVENT = Layout("proc_event", (
    ("ts", "s64"),
    ("clone_flags", "u64"),
    ("tid", "u32"),        # the task the event is about (the child for NEWTASK)
    ("tgid", "u32"),       # current's tgid (the parent for NEWTASK)
    ("ptid", "u32"),       # current's tid
    ("kind", "u32"),       # PROC_NEWTASK / PROC_EXEC / PROC_EXIT
))

# One row per RPC attempt (what /proc/self/mountstats counts as one op), emitted
# with the kernel's accounting record (sunrpc tracepoints). Times are
# bpf_ktime_get_ns(); 0 means the event was not seen. backlog/rtt/execute are the
# kernel's own numbers (rpc_stats_latency); attempts is 1, or 0 for a task still
# outstanding (complete = 0) or ended without accounting when recording stopped.
RPC_EVENT = Layout("rpc_event", (
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
    ("_pad", "u8"),
    ("procname", "char[24]"),
    ("progname", "char[16]"),
))

# Slot-table occupancy per RPC client, emitted on every change (so no peak is
# missed): tasks holding a transport slot, and tasks asleep on each queue.
SLOT_EVENT = Layout("slot_event", (
    ("ts", "s64"),
    ("in_use", "s32"),        # reserved a slot (xprt_reserve) and not yet finished
    ("backlog", "s32"),       # asleep on xprt_backlog: waiting for a slot
    ("session_wait", "s32"),  # asleep on the NFSv4.1 session slot table
    ("sending", "s32"),       # asleep on xprt_sending
    ("pending", "s32"),       # asleep on xprt_pending: sent, waiting for the reply
    ("client_id", "u32"),
))

# A transport's own slot counters (xprt group: kprobes on xprt_reserve and
# xprt_free_slot), sampled as each task asks for a slot and as each is given back.
XPRT_EVENT = Layout("xprt_event", (
    ("ts", "s64"),
    ("xprt_id", "u32"),            # struct rpc_xprt id: one per connection (nconnect makes several)
    ("client_id", "u32"),          # the RPC client of the task that asked or gave back
    ("num_reqs", "u32"),           # slots allocated (in use, plus up to min_reqs idle ones)
    ("max_reqs", "u32"),           # the table's limit
    ("min_reqs", "u32"),           # preallocated slots
    ("backlog", "u32"),            # tasks waiting for a slot
    ("sending", "u32"),            # tasks waiting to send
    ("pending", "u32"),            # tasks waiting for a reply
    ("alloc", "u8"),               # 1: sampled as a task asks for a slot, 0: as one is given back
    ("_pad", "char[7]"),
))

# Who writes through which open file with which files_struct (nfs_file_write kprobe),
# once per change: joins a WRITE's lock owner and open file back to a process.
OWNER_EVENT = Layout("owner_event", (
    ("ts", "s64"),
    ("files", "u64"),              # current->files: what the writer's lock contexts name
    ("file", "u64"),               # the struct file written through: its open context's flock_owner
    ("tid", "u32"),
    ("tgid", "u32"),
))

# WRITE / COMMIT / READ as the NFS client issues and completes them (nfs tracepoints).
NFS_EVENT = Layout("nfs_event", (
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
))
NFS_WRITE_START, NFS_WRITE_DONE, NFS_COMMIT_START, NFS_COMMIT_DONE, NFS_READ_START, NFS_READ_DONE = range(1, 7)
NFS_KINDS = {NFS_WRITE_START: "write_start", NFS_WRITE_DONE: "write_done", NFS_COMMIT_START: "commit_start",
             NFS_COMMIT_DONE: "commit_done", NFS_READ_START: "read_start", NFS_READ_DONE: "read_done"}

# The NFS client's entry points a syscall can spend its time in (nfs:* tracepoints):
# fsync (nfs_file_fsync), flush (nfs_wb_all: close() and the syncs before rename,
# setattr...), getattr (stat of a file, which flushes it when dirty). Bit i = 1 << i.
NFS_CALLS = ("fsync", "flush", "getattr")

PROC_NEWTASK, PROC_EXEC, PROC_EXIT = 1, 2, 3
CLONE_THREAD = 0x00010000

# Syscalls by operation number. The order is the op number; the C program uses
# the SYSOP_<NAME> constants generated from this list.
OPS = (
    "write", "pwrite64", "writev", "pwritev", "pwritev2",
    "fsync", "fdatasync", "sync_file_range", "close",
    "openat", "openat2", "creat",
    "rename", "renameat", "renameat2", "unlink", "unlinkat",
    "mkdir", "mkdirat", "newfstatat", "statx", "ftruncate",
    "dup", "dup2", "dup3", "fcntl", "chdir", "fchdir", "close_range",
)
OP_NUMBER = {name: i + 1 for i, name in enumerate(OPS)}
OP_NAME = {i: name for name, i in OP_NUMBER.items()}

WRITE_OPS = frozenset({"write", "pwrite64", "writev", "pwritev", "pwritev2"})
OPEN_OPS = frozenset({"openat", "openat2", "creat"})
DUP_OPS = frozenset({"dup", "dup2", "dup3", "fcntl"})
# Bookkeeping calls: they keep the fd table and cwd right, they are not rows.
BOOKKEEPING_OPS = DUP_OPS | {"chdir", "fchdir", "close_range"}

# Counters the programs keep in a per-CPU array (index = position here); the
# agent turns their deltas into the `loss` table.
LOSS_COUNTERS = ("sys_ring_full", "path_ring_full", "proc_ring_full", "inflight_full", "path_read_failed",
                 "rpc_ring_full", "rpc_tasks_full", "nfs_ring_full", "rpc_slot_ring_full", "owner_ring_full", "xprt_ring_full")


LAYOUTS = (SYS_EVENT, INFLIGHT, PATH_EVENT, PROC_EVENT, RPC_EVENT, SLOT_EVENT, NFS_EVENT, OWNER_EVENT, XPRT_EVENT)


class Distinct:
    """The distinct values of an array, and which one each row holds (a hash, not a sort).
    A batch of events repeats few values (files, servers, procedure names): anything
    computed in Python is computed once per distinct value, not once per row."""

    def __init__(self, values: np.ndarray | pa.Array):
        encoded = (values if isinstance(values, pa.Array) else pa.array(values)).dictionary_encode()
        self.values = encoded.dictionary.to_pylist()
        self._rows = encoded.indices

    def map(self, fn, kind: pa.DataType) -> pa.Array:
        """fn(v) for every row's value."""
        return pa.array([fn(v) for v in self.values], kind).take(self._rows)


def per_value(values: np.ndarray | pa.Array, fn, kind: pa.DataType) -> pa.Array:
    """fn(v) for each of `values`, computed once per distinct value."""
    return Distinct(values).map(fn, kind)


def warm_up() -> None:
    """Decode a zero record of every layout once. pyarrow and numpy load parts of themselves
    on first use (the first pa.array of an ndarray imports numpy.ma): under emulation that
    took 0.6 s of CPU in the first drain with events, inside the first measured save."""
    for layout in LAYOUTS:
        layout.to_arrow(np.zeros(1, layout.dtype))


# Every probe group's rings, numbered for the kernel's wakeup counters (bpf/common.h).
RINGS = ("sys_ring", "path_ring", "proc_ring", "rpc_ring", "slot_ring", "nfs_ring", "owner_ring", "xprt_ring")


def c_header() -> str:
    """Everything the C side needs from this module, as C text."""
    parts = ["/* generated from slotscope/agent/layouts.py: do not edit */"]
    # SYSOP_, not OP_: the kernel's nfs4.h has an OP_WRITE of its own (bpf/owners.c includes it)
    parts += [f"#define SYSOP_{name.upper()} {num}" for name, num in OP_NUMBER.items()]
    parts += [f"#define PROC_NEWTASK {PROC_NEWTASK}", f"#define PROC_EXEC {PROC_EXEC}",
              f"#define PROC_EXIT {PROC_EXIT}", f"#define CLONE_THREAD_FLAG {CLONE_THREAD}",
              f"#define PATH_MAX_CAPTURED {PATH_MAX_CAPTURED}"]
    parts += [f"#define LOSS_{name.upper()} {i}" for i, name in enumerate(LOSS_COUNTERS)]
    parts += [f"#define NFS_{name.upper()} {num}" for num, name in NFS_KINDS.items()]
    parts += [f"#define NFS_CALL_{name.upper()} {1 << i}" for i, name in enumerate(NFS_CALLS)]
    parts.append(f"#define LOSS_NCOUNTERS {len(LOSS_COUNTERS)}")
    parts += [f"#define {ring.upper()}_ID {i}" for i, ring in enumerate(RINGS)] + [f"#define NRINGS {len(RINGS)}"]
    parts += [layout.c_struct() for layout in LAYOUTS]
    return "\n".join(parts) + "\n"
