"""Event layouts: the C structs and numpy decoding of the kernel events.

Each event's fields are declared once, as plain data, in capture/events.py (the
capture's tables take their columns from them); the agent-only events (in-flight
calls, paths, process lifecycle) are declared here. From each declaration come the
C struct handed to BCC, the numpy dtype that decodes a whole ring-buffer span at
once, and the Arrow types of the decoded columns. Nothing here imports bcc.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from slotscope.capture import events
from slotscope.capture.events import C_STRING as _ARRAY
from slotscope.capture.events import NFS_KINDS, SLOT_ROW_FREED, SLOT_ROW_TAKEN
from slotscope.capture.losses import BPF_COUNTERS
from slotscope.capture.syscalls import NFS_CALLS, OP_NUMBER

# C scalar type -> numpy type (the Arrow types are the capture's: events.ARROW_TYPES).
_NUMPY = {"u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "s32": np.int32, "s64": np.int64}


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
            spec.append((fname, f"S{m.group(1)}") if m else (fname, _NUMPY[ctype]))
        # align=True reproduces the C compiler's padding on x86_64 and arm64.
        return np.dtype(spec, align=True)

    def arrow_type(self, fname: str) -> pa.DataType:
        return events.arrow_type(dict(self.fields)[fname])

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


SYS_EVENT = Layout("sys_event", events.SYS_FIELDS)

# A syscall between its enter and exit, per thread (the `inflight` map, keyed by tid):
# the agent reads the map to see who is blocked right now, and in what.
INFLIGHT = Layout("inflight", (
    ("ts_enter", "s64"),
    ("count", "u64"),
    ("offset", "s64"),
    ("path1", "u64"),      # user pointers of the path arguments (read at exit)
    ("path2", "u64"),
    ("buf", "u64"),        # a stat call's result buffer (user pointer, read at exit)
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

# A rank variable of a traced program, read from its environment at execve (before the
# program runs): a rank that exits within milliseconds is gone before /proc can be read.
ENV_NAME_MAX = 32
ENV_EVENT = Layout("env_event", (
    ("ts", "s64"),         # the execve's: the variables of one execve share it
    ("tgid", "u32"),
    ("_pad", "char[4]"),
    ("name", f"char[{ENV_NAME_MAX}]"),
    ("value", "char[32]"),
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

RPC_EVENT = Layout("rpc_event", events.RPC_FIELDS)

SLOT_EVENT = Layout("slot_event", events.SLOT_FIELDS)

XPRT_EVENT = Layout("xprt_event", events.XPRT_FIELDS)

OWNER_EVENT = Layout("owner_event", events.OWNER_FIELDS)

NFS_EVENT = Layout("nfs_event", events.NFS_FIELDS)


PROC_NEWTASK, PROC_EXEC, PROC_EXIT = 1, 2, 3
CLONE_THREAD = 0x00010000


# Counters the programs keep in a per-CPU array (index = position here); the
# agent turns their deltas into the `loss` table.
LOSS_COUNTERS = tuple(BPF_COUNTERS)


LAYOUTS = (SYS_EVENT, INFLIGHT, PATH_EVENT, ENV_EVENT, PROC_EVENT, RPC_EVENT, SLOT_EVENT, NFS_EVENT, OWNER_EVENT, XPRT_EVENT)


RUN_SHARE = 8     # Distinct hashes runs, not rows, when there are fewer runs than rows / RUN_SHARE


class Distinct:
    """The distinct values of an array, and which one each row holds (a hash, not a sort).
    A batch of events repeats few values (files, servers, procedure names): anything
    computed in Python is computed once per distinct value, not once per row."""

    def __init__(self, values: np.ndarray | pa.Array):
        starts = None
        if isinstance(values, np.ndarray) and values.dtype.kind in "iu" and values.size:
            starts = np.flatnonzero(values[1:] != values[:-1]) + 1
        if starts is not None and starts.size < values.size // RUN_SHARE:   # long runs (a storm's fd): a value a run
            encoded = pa.array(values[np.concatenate(([0], starts))]).dictionary_encode()
            lengths = np.diff(np.concatenate(([0], starts, [values.size])))
            self._rows = pa.array(np.repeat(encoded.indices.to_numpy(), lengths))
        else:
            encoded = (values if isinstance(values, pa.Array) else pa.array(values)).dictionary_encode()
            self._rows = encoded.indices
        self.values = encoded.dictionary.to_pylist()

    @property
    def indices(self) -> np.ndarray:
        """Which of `values` each row holds."""
        return self._rows.to_numpy()

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
RINGS = ("sys_ring", "path_ring", "proc_ring", "rpc_ring", "slot_ring", "nfs_ring", "owner_ring", "xprt_ring",
         "env_ring")


def c_header() -> str:
    """Everything the C side needs from this module, as C text."""
    parts = ["/* generated from slotscope/agent/layouts.py: do not edit */"]
    # SYSOP_, not OP_: the kernel's nfs4.h has an OP_WRITE of its own (bpf/owners.c includes it)
    parts += [f"#define SYSOP_{name.upper()} {num}" for name, num in OP_NUMBER.items()]
    parts += [f"#define PROC_NEWTASK {PROC_NEWTASK}", f"#define PROC_EXEC {PROC_EXEC}",
              f"#define PROC_EXIT {PROC_EXIT}", f"#define CLONE_THREAD_FLAG {CLONE_THREAD}",
              f"#define PATH_MAX_CAPTURED {PATH_MAX_CAPTURED}", f"#define ENV_NAME_MAX {ENV_NAME_MAX}"]
    parts += [f"#define LOSS_{name.upper()} {i}" for i, name in enumerate(LOSS_COUNTERS)]
    parts += [f"#define NFS_{name.upper()} {num}" for num, name in NFS_KINDS.items()]
    parts += [f"#define NFS_CALL_{name.upper()} {1 << i}" for i, name in enumerate(NFS_CALLS)]
    parts += [f"#define SLOT_ROW_TAKEN {SLOT_ROW_TAKEN}", f"#define SLOT_ROW_FREED {SLOT_ROW_FREED}"]
    parts.append(f"#define LOSS_NCOUNTERS {len(LOSS_COUNTERS)}")
    parts += [f"#define {ring.upper()}_ID {i}" for i, ring in enumerate(RINGS)] + [f"#define NRINGS {len(RINGS)}"]
    parts += [layout.c_struct() for layout in LAYOUTS]
    return "\n".join(parts) + "\n"
