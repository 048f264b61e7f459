"""Syscalls that went through the NFS client (slow tier): each syscall row says which NFS
entry points it passed (fsync, the flush of close(), getattr) and how long it spent in them,
from the nfs:* tracepoints, so close() flush and fsync time show per call."""
import pyarrow.compute as pc
import pytest

pytestmark = pytest.mark.vm


def rows(out, syscall):
    from slotscope.capture.reader import Capture
    sc = Capture.open(str(out / "capture")).read("syscall")
    return sc.filter(pc.equal(pc.cast(sc["syscall"], "string"), syscall))


def test_fsync_and_close_flush_time_per_call(mixed):
    """The mixed scenario fsyncs three ranks' files and closes every file: every fsync ran
    nfs_file_fsync and nearly all its time is in it; every close of a written file ran the
    flush; O_SYNC writes show their per-write sync."""
    fsync = rows(mixed, "fsync")
    assert fsync.num_rows >= 3
    assert set(fsync["nfs_calls"].to_pylist()) <= {"fsync", "fsync+flush"} and pc.all(pc.is_valid(fsync["nfs_calls"])).as_py()
    assert pc.sum(fsync["nfs_ns"]).as_py() > 0.9 * pc.sum(fsync["latency_ns"]).as_py()
    assert pc.all(pc.less_equal(fsync["nfs_ns"], fsync["latency_ns"])).as_py()
    close = rows(mixed, "close")
    flushed = close.filter(pc.is_valid(close["nfs_calls"]))
    assert flushed.num_rows >= 4 and set(flushed["nfs_calls"].to_pylist()) == {"flush"}
    assert pc.all(pc.less_equal(flushed["nfs_ns"], flushed["latency_ns"])).as_py()
    # rank 1's O_SYNC writes sync each one through nfs_file_fsync; the buffered writes of the
    # others pass none of these entry points (0, not unknown)
    writes = rows(mixed, "write")
    assert writes["nfs_ns"].null_count == 0
    synced = writes.filter(pc.is_valid(writes["nfs_calls"]))
    assert set(synced["nfs_calls"].to_pylist()) == {"fsync"} and len(set(synced["tgid"].to_pylist())) == 1
    assert synced.num_rows == 256                                   # 1 MiB in 4 KiB writes
    assert pc.sum(synced["nfs_ns"]).as_py() > 0.8 * pc.sum(synced["latency_ns"]).as_py()
    plain = writes.filter(pc.is_null(writes["nfs_calls"]))
    assert plain.num_rows > 0 and pc.sum(plain["nfs_ns"]).as_py() == 0
