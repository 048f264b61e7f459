"""Which rank each RPC worked for: direct (its owner wrote), by inode (background
writeback charged to the file's last writer), or unknown."""
import os

import numpy as np
import pyarrow as pa
import pytest
from unit_helpers import meta, proc, procs_table, sc, syscall_table

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import OWNERS, RPC
from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.attribution import attributed_rpcs, kernel_dev, last_writer
from slotscope.analyzer.job import Job

pytestmark = pytest.mark.unit

KDEV_NFS = (0 << 20) | 30          # the kernel's dev_t of an NFS mount, 0:30
DEV_NFS = os.makedev(0, 30)


@pytest.mark.parametrize("major,minor", [(0, 30), (8, 1), (259, 3), (0, 300), (4095, 1 << 19)])
def test_kernel_dev_undoes_makedev(major, minor):
    assert kernel_dev(pa.array([os.makedev(major, minor)], pa.uint64()))[0].as_py() == (major << 20) | minor


def rpc(owner, fileid, t, count=4096, slot_wait=1000, procname="WRITE"):
    row = {f.name: 0 for f in RPC if pa.types.is_integer(f.type)}
    row.update(ts_begin=t, owner_tgid=owner, fileid=fileid, io_dev=KDEV_NFS, io_count=count, complete=1,
               attempts=1, slot_wait_ns=slot_wait, procname=procname, progname="nfs", server="10.0.0.1:2049")
    return row


def write(tgid, ino, t, nbytes=4096):
    row = sc(tgid, "write", nbytes=nbytes)
    row.update(ts_enter=t, ts_exit=t + 10, dev=DEV_NFS, ino=ino, fstype="nfs", path=f"/mnt/nfs/f{ino}")
    return row


@pytest.fixture
def job(tmp_path):
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta("node-a"))
    # rank 0 (pid 100) writes file 7 then file 9 later; rank 1 (pid 200) writes file 8
    w.append("syscall", syscall_table([write(100, 7, 1_000), write(200, 8, 1_100), write(100, 9, 5_000)]))
    w.append("procs", procs_table([proc(100, rank=0), proc(200, rank=1), proc(55, comm="kworker/u4:1")]))
    w.append("rpc", pa.Table.from_pylist([
        rpc(100, 7, 2_000, slot_wait=300),       # O_SYNC write in rank 0's own context: direct
        rpc(55, 8, 2_000, slot_wait=500),        # kworker writes back file 8: rank 1 by inode
        rpc(55, 9, 4_000),                       # file 9 before anyone wrote it: unknown
        rpc(55, 9, 6_000, slot_wait=700),        # ... and after rank 0 wrote it: rank 0
        rpc(55, 0, 6_000, procname="GETATTR"),   # not an I/O RPC: no file
    ], schema=RPC))
    w.close()
    return Job.open([path])


def test_each_rpc_says_how_it_was_attributed(job):
    t = attributed_rpcs(job).to_pylist()
    assert [(r["attributed_tgid"], r["attribution"]) for r in t] == [
        (100, "direct"), (200, "inode"), (None, "unknown"), (100, "inode"), (None, "unknown")]


def test_ranks_are_charged_their_write_rpcs_and_slot_wait(job):
    ranks = {r["rank"]: r for r in analyze(job, "0")["ranks"]}
    assert (ranks[0]["write_rpcs"], ranks[0]["slot_wait_ns"]) == (2, 1000)
    assert (ranks[1]["write_rpcs"], ranks[1]["slot_wait_ns"]) == (1, 500)


def test_a_file_written_by_two_ranks_is_charged_to_the_last_writer_before_each_rpc(tmp_path):
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta("node-a"))
    # ranks 0 and 1 take turns writing the shared file 10; rank 1 alone writes file 11
    w.append("syscall", syscall_table([write(100, 10, 1_000), write(200, 10, 3_000), write(100, 10, 5_000),
                                       write(200, 11, 500)]))
    w.append("procs", procs_table([proc(100, rank=0), proc(200, rank=1), proc(55, comm="kworker/u4:1")]))
    w.append("rpc", pa.Table.from_pylist([rpc(55, 10, t) for t in (2_000, 4_000, 6_000, 900)] + [rpc(55, 11, 600)],
                                         schema=RPC))
    w.close()
    t = attributed_rpcs(Job.open([path])).to_pylist()
    assert [(r["attributed_tgid"], r["attribution"]) for r in t] == [
        (100, "inode"), (200, "inode"), (100, "inode"), (None, "unknown"), (200, "inode")]


FILES_A, FILES_B, FILE_A, FILE_B = 0xFFFF_0000_0000_1000, 0xFFFF_0000_0000_2000, 0xFFFF_0000_0001_0000, 0xFFFF_0000_0002_0000


def owner(tgid, files, file, t):
    return {"ts": t, "tid": tgid, "tgid": tgid, "files": files, "file": file}


def test_lock_context_then_open_file_win_over_the_inode(tmp_path):
    """Ranks 0 and 1 write the same file; the kworker's WRITEs carry the lock owner or the
    open file of the pages they send. Those name the writer even where the inode's last
    writer is the other rank; a WRITE with neither falls back to the inode."""
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta("node-a"))
    w.append("syscall", syscall_table([write(100, 10, 1_000), write(200, 10, 3_000)]))
    w.append("procs", procs_table([proc(100, rank=0), proc(200, rank=1)]))
    # what nfs_file_write saw: rank 0 writes with files_struct A through file A, rank 1 with B, B;
    # later rank 1's files_struct address is reused by a new process (pid 300)
    w.append("owners", pa.Table.from_pylist([owner(100, FILES_A, FILE_A, 900), owner(200, FILES_B, FILE_B, 2_900),
                                             owner(300, FILES_B, 0xFFFF_0000_0003_0000, 9_000)], schema=OWNERS))
    rows = [rpc(55, 10, 4_000), rpc(55, 10, 4_100), rpc(55, 10, 4_200), rpc(55, 10, 9_500)]
    rows[0].update(lock_owner=FILES_A, open_file=FILE_A)     # rank 0's pages, after rank 1 wrote last
    rows[1].update(open_file=FILE_A)                          # no lock context: the open file
    rows[2].update(lock_owner=0xDEAD, open_file=0xBEEF)      # pointers never seen: the inode
    rows[3].update(lock_owner=FILES_B)                        # the reused address: its new owner
    w.append("rpc", pa.Table.from_pylist(rows, schema=RPC))
    w.close()
    t = attributed_rpcs(Job.open([path])).to_pylist()
    assert [(r["attributed_tgid"], r["attribution"]) for r in t] == [
        (100, "lock_context"), (100, "open_file"), (200, "inode"), (300, "lock_context")]


def test_last_writer_matches_a_brute_force_search_with_one_and_many_writers_per_file():
    """Files with one writer take the join, shared ones the as-of search: both must agree
    with the definition (the last write at or before the RPC)."""
    rng = np.random.default_rng(7)
    wr = pa.table({"writer": pa.array(rng.integers(1, 9, 300), pa.uint32()),
                   "ino": pa.array(rng.integers(0, 40, 300), pa.uint64()),   # some files once, some often
                   "t": pa.array(rng.integers(0, 1000, 300), pa.int64())})
    wr = pa.concat_tables([wr, pa.table({"writer": pa.array([3], pa.uint32()), "ino": pa.array([99], pa.uint64()),
                                         "t": pa.array([500], pa.int64())})])
    left = pa.table({"row": pa.array(np.arange(500)), "ino": pa.array(rng.integers(0, 101, 500), pa.uint64()),
                     "t": pa.array(rng.integers(0, 1100, 500), pa.int64())})
    rows, found = last_writer(left, wr, ["ino"])
    got = dict(zip(rows.tolist(), found.tolist()))
    w = wr.to_pylist()
    want = {}
    for q in left.to_pylist():
        before = [x for x in w if x["ino"] == q["ino"] and x["t"] <= q["t"]]
        if before:
            last = max(x["t"] for x in before)
            want[q["row"]] = {x["writer"] for x in before if x["t"] == last}
    assert got.keys() == want.keys() and any(len(v) == 1 for v in want.values())
    assert all(got[r] in want[r] for r in want)
    assert got.get(int(np.flatnonzero((left["ino"].to_numpy() == 99) & (left["t"].to_numpy() >= 500))[0])) == 3
