"""Which process, and so which rank, each RPC worked for.

An RPC run in the writer's own context (fsync, close() flush, O_SYNC writes) names
its owner directly. Background writeback runs in a flusher kworker or rpciod: such
an RPC is charged to the process that last wrote the same file (device and inode)
before the RPC began, from the syscall rows. Every row says how it was attributed:
direct, inode or unknown.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .job import WRITE_SYSCALLS, Job

# Who writes a file: its write calls, and the open that created or truncated it. Taken
# from when each call began: writeback can start before a large write() returns.
WRITER_SYSCALLS = WRITE_SYSCALLS + ("openat", "openat2", "creat")


def user_dev(kernel_dev: pa.Array) -> pa.Array:
    """The kernel's dev_t (major << 20 | minor), as tracepoints report it, in st_dev's encoding."""
    major = pc.shift_right(kernel_dev, 20)
    minor = pc.bit_wise_and(kernel_dev, 0xFFFFF)
    # glibc's makedev: minor's low byte, major's low 12 bits, then the high bits of each
    low = pc.bit_wise_or(pc.bit_wise_and(minor, 0xFF), pc.shift_left(pc.bit_wise_and(major, 0xFFF), 8))
    high = pc.bit_wise_or(pc.shift_left(pc.bit_wise_and(minor, 0xFFF00), 12),
                          pc.shift_left(pc.bit_wise_and(major, 0xFFFFF000), 32))
    return pc.bit_wise_or(low, high)


def attributed_rpcs(job: Job) -> pa.Table | None:
    """The rpc table with `attributed_tgid` and `attribution` (direct, inode, unknown)."""
    rpc = job.table("rpc")
    if rpc is None:
        return None
    rpc = rpc.append_column("row", pa.array(range(rpc.num_rows), pa.int64()))
    sc = job.table("syscall")
    writers = pa.table({"host": pa.array([], pa.string()), "tgid": pa.array([], pa.uint32())})
    if sc is not None:
        names = pc.cast(sc["syscall"], pa.string())
        w = sc.filter(pc.is_in(names, pa.array(WRITER_SYSCALLS)))
        writers = w.select(["host", "tgid", "dev", "ino", "ts_enter"])
    known = set(zip(writers["host"].to_pylist(), writers["tgid"].to_pylist()))
    direct = pa.array([(h, t) in known for h, t in zip(rpc["host"].to_pylist(), rpc["owner_tgid"].to_pylist())],
                      pa.bool_())

    # The last writer of the RPC's file before it began, per host.
    by_inode = pa.nulls(rpc.num_rows, pa.uint32())
    # Captures from before the rpc rows carried their file (fileid, io_dev) have only direct.
    if writers.num_rows and {"fileid", "io_dev"} <= set(rpc.column_names):
        left = pa.table({
            "host": rpc["host"], "dev": pc.cast(user_dev(pc.cast(rpc["io_dev"], pa.uint64())), pa.uint64()),
            "ino": rpc["fileid"], "t": rpc["ts_begin"], "row": rpc["row"],
        }).filter(pc.greater(rpc["fileid"], 0)).sort_by("t")
        right = pa.table({"host": writers["host"], "dev": pc.cast(writers["dev"], pa.uint64()),
                          "ino": pc.cast(writers["ino"], pa.uint64()), "t": writers["ts_enter"],
                          "writer": writers["tgid"]}).drop_null().sort_by("t")
        if left.num_rows and right.num_rows:
            joined = left.join_asof(right, on="t", by=["host", "dev", "ino"], tolerance=-(1 << 62))
            found = dict(zip(joined["row"].to_pylist(), joined["writer"].to_pylist()))
            by_inode = pa.array([found.get(r) for r in range(rpc.num_rows)], pa.uint32())

    tgid = pc.if_else(direct, rpc["owner_tgid"], by_inode)
    method = pc.if_else(direct, "direct", pc.if_else(pc.is_valid(by_inode), "inode", "unknown"))
    return rpc.append_column("attributed_tgid", tgid).append_column("attribution", method)
