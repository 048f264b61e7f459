"""Which process, and so which rank, each RPC worked for.

A WRITE run by a flusher kworker or rpciod names the kworker as its owner; its pages
remember their writer. In order, the first that finds one wins:
  lock_context  the WRITE's lock owner (the writer's files_struct, kprobe group nfs_owner)
                joined to the process the agent saw writing with it, as of the RPC's start;
  open_file     the WRITE's open file (struct file), the same way;
  direct        the RPC's owner is itself a process that wrote (fsync, close() flush,
                O_SYNC writes, and every RPC on kernels without the kprobes);
  inode         the process that last wrote the same file (device and inode) before the
                RPC began, from the syscall rows;
  unknown.
Every row says which. Work is per capture (one host each): the syscall table is the
biggest, and nothing here needs to compare hosts.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .calls import file_calls
from slotscope.capture.syscalls import OPEN_SYSCALLS, WRITE_SYSCALLS

from .job import Job, with_host

# Who writes a file: its write calls, and the open that created or truncated it. Taken
# from when each call began: writeback can start before a large write() returns.
WRITER_SYSCALLS = WRITE_SYSCALLS + OPEN_SYSCALLS
# How an RPC's writer was found, best first (see _attribute).
METHODS = ("lock_context", "open_file", "direct", "inode", "unknown")


def kernel_dev(user: pa.Array) -> pa.Array:
    """st_dev's encoding (glibc's makedev), as syscall rows carry devices, in the kernel's dev_t
    (major << 20 | minor) of the RPC rows. Mapped value by value: the devices are few."""
    values = pc.unique(user).to_pylist()
    mapped = pa.array([(os.major(v) << 20) | os.minor(v) for v in values], pa.uint64())
    return pc.take(mapped, pc.index_in(user, pa.array(values, pa.uint64())))


def syscall_is(names: pa.ChunkedArray, wanted: tuple[str, ...]) -> pa.ChunkedArray:
    """Rows whose (dictionary-encoded) syscall is one of `wanted`, without decoding every row."""
    chunks = []
    for chunk in names.chunks:
        if pa.types.is_dictionary(chunk.type):
            codes = pc.index_in(chunk.dictionary, pa.array(wanted))
            hit = pa.array(list(range(len(chunk.dictionary))), chunk.indices.type).filter(pc.is_valid(codes))
            chunks.append(pc.is_in(chunk.indices, hit))
        else:
            chunks.append(pc.is_in(chunk, pa.array(wanted)))
    return pa.chunked_array(chunks, pa.bool_())


def writers(calls: pa.Table, sc: pa.Table) -> pa.Table:
    """(writer, dev, ino, t) of the calls that wrote each file, thinned for the as-of join: a
    file with one writer keeps that writer's first call only (the last writer before any later
    time is then that one); files with several writers keep every call (from `sc`, the raw
    rows). `calls` is file_calls() of the same capture."""
    w = calls.filter(pc.and_(pc.is_in(calls["syscall"], pa.array(WRITER_SYSCALLS)),
                             pc.and_(pc.is_valid(calls["dev"]), pc.is_valid(calls["ino"]))))
    per = w.group_by(["dev", "ino", "tgid"]).aggregate([("ts_enter_min", "min")])
    per = pa.table({"writer": per["tgid"], "dev": pc.cast(per["dev"], pa.uint64()),
                    "ino": pc.cast(per["ino"], pa.uint64()), "t": per["ts_enter_min_min"]})
    nwriters = per.group_by(["dev", "ino"]).aggregate([("writer", "count")])
    shared = nwriters.filter(pc.greater(nwriters["writer_count"], 1)).select(["dev", "ino"])
    if shared.num_rows == 0:
        return per
    rows = sc.select(["tgid", "syscall", "dev", "ino", "ts_enter"])
    rows = rows.filter(pc.is_in(rows["ino"], shared["ino"]))
    rows = rows.filter(syscall_is(rows["syscall"], WRITER_SYSCALLS))
    rows = pa.table({"writer": rows["tgid"], "dev": pc.cast(rows["dev"], pa.uint64()),
                     "ino": pc.cast(rows["ino"], pa.uint64()), "t": rows["ts_enter"]})
    many = rows.join(shared, ["dev", "ino"], join_type="left semi")
    single = per.join(shared, ["dev", "ino"], join_type="left anti")
    return pa.concat_tables([single.select(["writer", "dev", "ino", "t"]), many.select(["writer", "dev", "ino", "t"])])


def last_writer(left: pa.Table, wr: pa.Table, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """For each row of `left` (row, keys..., t): the writer of the last row of `wr` (writer,
    keys..., t) with the same keys at or before t. -> (rows, writers) of the rows that have
    one. Keys with one writer row (a rank's own file) are a plain join; the others an as-of
    join (key values numbered, times ranked among the writers' times, one searchsorted)."""
    counts = wr.group_by(keys).aggregate([("t", "count")])
    single = counts.filter(pc.equal(counts["t_count"], 1)).select(keys)
    one = left.join(wr.join(single, keys, join_type="left semi").rename_columns({"t": "t_written"}), keys)
    one = one.filter(pc.greater_equal(one["t"], one["t_written"]))
    rows, found = _as_of(left, wr.join(single, keys, join_type="left anti"), keys)
    return np.concatenate([one["row"].to_numpy(), rows]), np.concatenate([one["writer"].to_numpy(), found])


def _as_of(left: pa.Table, wr: pa.Table, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    if wr.num_rows == 0:
        return np.empty(0, np.int64), np.empty(0, np.uint32)     # (rows, tgids)
    ids = wr.group_by(keys).aggregate([])
    ids = ids.append_column("k", pa.array(np.arange(ids.num_rows, dtype=np.int64)))
    w = wr.join(ids, keys).sort_by([("k", "ascending"), ("t", "ascending")])
    q = left.join(ids, keys, join_type="inner")
    times = np.unique(w["t"].to_numpy())
    span = times.size + 1            # key = number * span + how many writer times are <= t
    wk = w["k"].to_numpy()
    wkey = wk * span + np.searchsorted(times, w["t"].to_numpy(), "right")
    qk = q["k"].to_numpy()
    i = np.searchsorted(wkey, qk * span + np.searchsorted(times, q["t"].to_numpy(), "right"), "right") - 1
    ok = i >= 0
    ok[ok] = wk[i[ok]] == qk[ok]     # the row found has the same keys
    return q["row"].to_numpy()[ok], w["writer"].to_numpy()[i[ok]]


class _Charges:
    """Each RPC row's writer and method, settled by the first method that finds one."""

    def __init__(self, n: int):
        self.tgid = np.zeros(n, np.uint32)
        self.method = np.full(n, METHODS.index("unknown"), np.int8)

    def open(self) -> np.ndarray:
        return self.method == METHODS.index("unknown")

    def settle(self, rows: np.ndarray, tgids: np.ndarray, method: str) -> None:
        fresh = self.method[rows] == METHODS.index("unknown")
        self.tgid[rows[fresh]] = tgids[fresh]
        self.method[rows[fresh]] = METHODS.index(method)

    def columns(self) -> tuple[pa.Array, pa.Array]:
        unknown = self.open()
        return (pa.array(self.tgid, mask=unknown),
                pa.DictionaryArray.from_arrays(pa.array(self.method), pa.array(METHODS)))  # a byte a row


def _by_pointer(rpc: pa.Table, owners: pa.Table, charges: _Charges) -> None:
    """Lock context, then open file: the WRITE's lock owner (the writer's files_struct) or open
    file (its struct file), as the agent saw them in nfs_file_write (the owners rows)."""
    for column, pointer, method in (("lock_owner", "files", "lock_context"), ("open_file", "file", "open_file")):
        wanted = np.flatnonzero(charges.open() & (rpc[column].to_numpy() > 0))
        if wanted.size == 0:
            continue
        left = pa.table({"row": wanted, "ptr": rpc[column].take(wanted), "t": rpc["ts_begin"].take(wanted)})
        right = pa.table({"writer": owners["tgid"], "ptr": owners[pointer], "t": owners["ts"]})
        charges.settle(*last_writer(left, right, ["ptr"]), method)


def _attribute(rpc: pa.Table, calls: pa.Table | None, sc: pa.Table | None, owners: pa.Table | None) -> pa.Table:
    charges = _Charges(rpc.num_rows)
    if owners is not None and "lock_owner" in rpc.column_names:
        _by_pointer(rpc, owners, charges)
    if sc is not None and calls is not None:
        wr = writers(calls, sc)
        direct = pc.fill_null(pc.is_in(rpc["owner_tgid"], pc.unique(wr["writer"])), False)
        rows = np.flatnonzero(direct.to_numpy(zero_copy_only=False))
        charges.settle(rows, rpc["owner_tgid"].to_numpy()[rows], "direct")
        # Captures from before the rpc rows carried their file (fileid, io_dev) have no inode.
        if wr.num_rows and {"fileid", "io_dev"} <= set(rpc.column_names):
            wanted = np.flatnonzero(charges.open() & (rpc["fileid"].to_numpy() > 0))
            if wanted.size:
                left = pa.table({"row": wanted, "dev": pc.cast(rpc["io_dev"].take(wanted), pa.uint64()),
                                 "ino": rpc["fileid"].take(wanted), "t": rpc["ts_begin"].take(wanted)})
                wr = wr.set_column(1, "dev", kernel_dev(wr["dev"]))
                charges.settle(*last_writer(left, wr, ["dev", "ino"]), "inode")
    tgid, method = charges.columns()
    return rpc.append_column("attributed_tgid", tgid).append_column("attribution", method)


def attributed_rpcs(job: Job) -> pa.Table | None:
    """The rpc table with `host`, `attributed_tgid` and `attribution`: how its writer was found
    (lock_context, open_file, direct, inode, or unknown)."""
    def compute():
        parts = []
        summary = file_calls(job)
        syscalls = {id(cap): t for cap, t in job.per_capture("syscall")}
        owners = {id(cap): t for cap, t in job.per_capture("owners")}
        for cap, rpc in job.per_capture("rpc"):
            host = cap.meta.get("host", "?")
            calls = summary.filter(pc.equal(summary["host"], host)) if summary is not None else None
            parts.append(with_host(_attribute(rpc, calls, syscalls.get(id(cap)), owners.get(id(cap))), host))
        return pa.concat_tables(parts, promote_options="permissive") if parts else None
    return job.memo("attributed_rpcs", compute)


def attributed_writes(job: Job) -> pa.Table | None:
    """The attributed WRITE RPCs (host, attributed_tgid, io_count, io_stable, slot_wait_ns):
    what is charged to ranks."""
    def compute():
        rpcs = attributed_rpcs(job)
        if rpcs is None:
            return None
        w = rpcs.select(["host", "attributed_tgid", "io_count", "io_stable", "slot_wait_ns"])
        return w.filter(pc.and_(pc.equal(rpcs["procname"], "WRITE"), pc.is_valid(rpcs["attributed_tgid"])))
    return job.memo("attributed_writes", compute)
