"""Which process, and so which rank, each RPC worked for.

An RPC run in the writer's own context (fsync, close() flush, O_SYNC writes) names
its owner directly. Background writeback runs in a flusher kworker or rpciod: such
an RPC is charged to the process that last wrote the same file (device and inode)
before the RPC began, from the syscall rows. Every row says how it was attributed:
direct, inode or unknown. Work is per capture (one host each): the syscall table is
the biggest, and nothing here needs to compare hosts.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .calls import file_calls
from .job import WRITE_SYSCALLS, Job, with_host

# Who writes a file: its write calls, and the open that created or truncated it. Taken
# from when each call began: writeback can start before a large write() returns.
WRITER_SYSCALLS = WRITE_SYSCALLS + ("openat", "openat2", "creat")
METHODS = ("direct", "inode", "unknown")


def user_dev(kernel_dev: pa.Array) -> pa.Array:
    """The kernel's dev_t (major << 20 | minor), as tracepoints report it, in st_dev's encoding."""
    major = pc.shift_right(kernel_dev, 20)
    minor = pc.bit_wise_and(kernel_dev, 0xFFFFF)
    # glibc's makedev: minor's low byte, major's low 12 bits, then the high bits of each
    low = pc.bit_wise_or(pc.bit_wise_and(minor, 0xFF), pc.shift_left(pc.bit_wise_and(major, 0xFFF), 8))
    high = pc.bit_wise_or(pc.shift_left(pc.bit_wise_and(minor, 0xFFF00), 12),
                          pc.shift_left(pc.bit_wise_and(major, 0xFFFFF000), 32))
    return pc.bit_wise_or(low, high)


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
        return per.sort_by("t")
    rows = sc.filter(pc.is_in(sc["ino"], shared["ino"]))
    rows = rows.filter(syscall_is(rows["syscall"], WRITER_SYSCALLS))
    rows = pa.table({"writer": rows["tgid"], "dev": pc.cast(rows["dev"], pa.uint64()),
                     "ino": pc.cast(rows["ino"], pa.uint64()), "t": rows["ts_enter"]})
    many = rows.join(shared, ["dev", "ino"], join_type="left semi")
    single = per.join(shared, ["dev", "ino"], join_type="left anti")
    return pa.concat_tables([single.select(["writer", "dev", "ino", "t"]),
                             many.select(["writer", "dev", "ino", "t"])]).sort_by("t")


def _attribute(rpc: pa.Table, calls: pa.Table | None, sc: pa.Table | None) -> pa.Table:
    rpc = rpc.append_column("row", pa.array(np.arange(rpc.num_rows, dtype=np.int64)))
    by_inode = pa.nulls(rpc.num_rows, pa.uint32())
    direct = pa.array(np.zeros(rpc.num_rows, bool))
    if sc is not None and calls is not None:
        wr = writers(calls, sc)
        direct = pc.fill_null(pc.is_in(rpc["owner_tgid"], pc.unique(wr["writer"])), False)
        # Captures from before the rpc rows carried their file (fileid, io_dev) have only direct.
        if wr.num_rows and {"fileid", "io_dev"} <= set(rpc.column_names):
            left = pa.table({"dev": rpc["io_dev"], "ino": rpc["fileid"], "t": rpc["ts_begin"], "row": rpc["row"]})
            left = left.filter(pc.and_(pc.greater(rpc["fileid"], 0), pc.invert(direct))).sort_by("t")
            if left.num_rows:
                left = left.set_column(0, "dev", pc.cast(user_dev(pc.cast(left["dev"], pa.uint64())), pa.uint64()))
                joined = left.join_asof(wr, on="t", by=["dev", "ino"], tolerance=-(1 << 62))
                joined = joined.filter(pc.is_valid(joined["writer"])).sort_by("row")
                # scatter the found writers back to their rows
                idx = pc.index_in(rpc["row"], joined["row"])
                by_inode = pc.take(joined["writer"], idx)
    tgid = pc.if_else(direct, rpc["owner_tgid"], by_inode)
    # dictionary-encoded: one byte a row, not a string
    code = pc.cast(pc.if_else(direct, 0, pc.if_else(pc.is_valid(by_inode), 1, 2)), pa.int8())
    names = pa.array(METHODS)
    chunks = code.chunks if isinstance(code, pa.ChunkedArray) else [code]
    method = pa.chunked_array([pa.DictionaryArray.from_arrays(c, names) for c in chunks],
                              pa.dictionary(pa.int8(), pa.string()))
    return rpc.append_column("attributed_tgid", tgid).append_column("attribution", method)


def attributed_rpcs(job: Job) -> pa.Table | None:
    """The rpc table with `host`, `attributed_tgid` and `attribution` (direct, inode, unknown)."""
    def compute():
        parts = []
        summary = file_calls(job)
        for cap, rpc in job.per_capture("rpc"):
            host = cap.meta.get("host", "?")
            calls = summary.filter(pc.equal(summary["host"], host)) if summary is not None else None
            parts.append(with_host(_attribute(rpc, calls, cap.read("syscall")), host))
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
