"""The TUI's rank rows as of a moving cursor, incrementally (analyzer.rank_rows.RankIndex, view.moved,
the worker's `moving` requests and its wire format) against the full analysis as of the same cursor
(view.overview): the same rows at every cursor where a row of any table comes in or a call leaves a
window, walked forward, back and at random, on a job of three captures (a buffered save with a rank
hung until the stop, an O_SYNC save with a slow rank, and a node whose WRITEs change hands as their
writers' calls return)."""
from __future__ import annotations

import os
import pickle
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slotscope.analyzer.job import Job
from slotscope.analyzer.rank_rows import RankIndex
from slotscope.analyzer.timeline import JobSource
from slotscope.analyzer.view import moved, overview
from slotscope.capture.meta import start_ns
from slotscope.capture.tables import RPC, schema
from slotscope.capture.writer import CaptureWriter
from slotscope.tui import worker
from unit_helpers import meta, proc, procs_table, sc, syscall_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

pytestmark = pytest.mark.unit

S, MS = 1_000_000_000, 1_000_000
T0 = 1_000                          # meta()'s start, monotonic ns
KDEV, DEV = 30, os.makedev(0, 30)   # the NFS mount's dev_t in RPC rows and in syscall rows


def at(seconds: float) -> int:
    return T0 + int(seconds * S)


def write(tgid: int, ino: int, enter_s: float, exit_s: float, nbytes: int = 4096, **more) -> dict:
    row = sc(tgid, "write", nbytes=nbytes, ts=at(enter_s), latency_ns=int((exit_s - enter_s) * S), **more)
    row.update(dev=DEV, ino=ino, fstype="nfs", path=f"/mnt/nfs/f{ino}")
    return row


def rpc(owner: int, fileid: int, begin_s: float, end_s: float, count: int = 4096, slot_ms: int = 3) -> dict:
    row = {f.name: 0 for f in RPC if pa.types.is_integer(f.type)}
    row.update(ts_begin=at(begin_s), ts_end=at(end_s), owner_tgid=owner, owner_tid=owner, fileid=fileid, io_dev=KDEV,
               io_count=count, complete=1, attempts=1, slot_wait_ns=slot_ms * MS,
               execute_ns=int((end_s - begin_s) * S), procname="WRITE", progname="nfs", server="10.0.0.1:2049")
    return row


def handoff_capture(path: str) -> str:
    """node-c: WRITEs whose charge changes as the cursor passes their writers' returns, a rank of
    two processes, an identity that comes in mid-capture, a process of 200 calls (its p99 is not
    its slowest), a call in progress for seconds, in the trace and in the agent's snapshots, and
    one still blocked at the stop, last seen exactly 2 s before it."""
    rows = [
        sc(300, "newfstatat", ts=at(0.2), path="/mnt/nfs/f20", dev=DEV, ino=20),
        write(300, 20, 1.0, 3.0),                   # no open traced: its WRITE is its own from 3.0 s on
        sc(301, "newfstatat", ts=at(0.3), path="/mnt/nfs/f21", dev=DEV, ino=21),
        write(302, 21, 1.5, 1.55), write(301, 21, 1.6, 3.5),   # file 21's last writer before 2.0 s: 301 from 3.5 s
        write(305, 22, 4.0, 4.2), write(306, 22, 4.5, 4.6, nbytes=8192),   # one rank, two processes
        sc(304, "fsync", ts=at(0.5), latency_ns=int(7.5 * S), path="/mnt/nfs/f23", dev=DEV, ino=23),
    ]
    rows += [write(303, 24, 5 + i * 0.005, 5 + i * 0.005 + (i * 7 % 200 + 1) * 1e-5, nbytes=100) for i in range(200)]
    w = CaptureWriter(path)
    w.write_meta(meta("node-c"))
    w.append("syscall", syscall_table(rows))
    w.append("procs", procs_table([proc(300, rank=7, ts=at(5.0)),        # known as rank 7 from 5 s on
                                   proc(301, rank=9), proc(302, rank=10), proc(304, rank=11),
                                   proc(305, rank=8), proc(306, rank=8, comm="pt_data_worker"),
                                   proc(303, comm="rsync"), proc(307, rank=12), proc(55, comm="kworker/u4:1")]))
    w.append("rpc", pa.Table.from_pylist([rpc(300, 20, 1.5, 2.0), rpc(55, 21, 2.0, 2.5),
                                          rpc(55, 22, 4.7, 4.8, count=12288)], schema=RPC))
    w.append("blocked", pa.Table.from_pylist(
        [{"ts": at(s), "tid": 304, "tgid": 304, "syscall": "fsync", "ts_enter": at(0.5), "fd": 3,
          "path": "/mnt/nfs/f23", "dev": DEV, "ino": 23} for s in (2, 3, 4)]
        + [{"ts": meta()["stop"]["monotonic_ns"] - 2 * S, "tid": 307, "tgid": 307, "syscall": "close",
            "ts_enter": at(55), "fd": 4, "path": "/mnt/nfs/f25", "dev": DEV, "ino": 25}], schema=schema("blocked")))
    w.close()
    return path


@pytest.fixture(scope="module")
def job_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("rank-index")
    synth.save(d / "a", host="node-a", ranks=4, mode="buffered", file_bytes=128 << 10, write_bytes=32 << 10,
               hung_rank=2, hung_returns=False, hung_s=3.0)
    synth.save(d / "b", host="node-b", ranks=3, first_rank=4, world_size=12, mode="osync", file_bytes=64 << 10,
               write_bytes=16 << 10, slow_rank=(5, 3), mono_start_ns=7_000 * S)
    return [str(d / "a"), str(d / "b"), handoff_capture(str(d / "c"))]


def edges(paths: list[str]) -> list[int]:
    """Every cursor (ns since the captures' starts) where something the rows show changes: a row
    comes in, a call passes the 100 ms of "blocked now" or leaves the 5 s "recent" window, a
    snapshot goes stale; and the nanoseconds either side."""
    out = set()
    for cap in Job.open(paths).captures:
        zero = start_ns(cap.meta)

        def rel(table, col, plus=0):
            t = cap.read(table)
            if t is not None:
                out.update(v - zero + plus for v in pc.cast(t[col], pa.int64()).to_pylist() if v)

        rel("syscall", "ts_exit")
        rel("syscall", "ts_exit", 5 * S)
        rel("syscall", "ts_enter", 100 * MS)
        rel("rpc", "ts_end")
        rel("procs", "ts")
        rel("blocked", "ts")
        rel("blocked", "ts", 2 * S)
    return sorted({c + d for c in out for d in (-1, 0, 1) if c + d >= 0})


@pytest.fixture(scope="module")
def expected(job_paths):
    """The full analysis' rank rows at a deterministic sample of the edges (all of node-c's first
    5 s, where its WRITEs change hands)."""
    source = JobSource(Job.open(job_paths))
    handoffs = {c for c in edges(job_paths[2:]) if c < 5 * S}
    picked = handoffs | set(random.Random(19).sample(edges(job_paths), 50)) | {0, 7 * S, source.span_ns()}
    return source, {c: overview(source, c, "0").ranks for c in sorted(picked)}


def differences(got, want) -> str:
    """The first rank whose row differs, said briefly."""
    g, w = {r.key: r for r in got}, {r.key: r for r in want}
    if set(g) != set(w):
        return f"ranks {sorted(map(str, set(g) ^ set(w)))} only on one side"
    for key, row in w.items():
        if g[key] != row:
            fields = [f for f in ("entry", "extras", "blocked_now") if getattr(g[key], f) != getattr(row, f)]
            if "entry" in fields:
                return f"{key}: " + ", ".join(f"{k} {g[key].entry.get(k)!r} != {v!r}" for k, v in row.entry.items()
                                               if g[key].entry.get(k) != v)
            return f"{key}: {fields[0]} {getattr(g[key], fields[0])} != {getattr(row, fields[0])}"
    return "the same rows in another order"


def test_the_job_has_what_the_index_must_follow(job_paths, expected):
    """The sample reaches the cases the index works out per move (else the comparison below
    proves less than it says)."""
    source, rows = expected
    charged = {c: {r.key: r.entry["write_rpcs"] for r in got} for c, got in rows.items()}
    by_rank = lambda c, rank: charged[c].get(("node-c", rank, None))      # noqa: E731
    # 300's WRITE: not charged before its write() returns at 3.0 s, its own after
    assert by_rank(at(2.5) - T0, None) is None and charged[at(2.5) - T0].get(("node-c", None, 300)) == 0
    assert charged[at(3.0) - T0][("node-c", None, 300)] == 1
    # the kworker's WRITE of file 21: to 302 (rank 10) until 301's later call returns at 3.5 s
    assert (by_rank(at(3.0) - T0, 10), by_rank(at(3.0) - T0, 9)) == (1, 0)
    assert (by_rank(at(3.5) - T0, 10), by_rank(at(3.5) - T0, 9)) == (0, 1)
    last = rows[max(rows)]
    assert any(r.entry["blocked_at_stop"] for r in last if r.entry["host"] == "node-a")   # the hung rank
    stuck = (meta()["stop"]["monotonic_ns"] - 2 * S - at(55)) / 1e9
    assert [r.entry["blocked_at_stop"]["seconds"] for r in last if r.key == ("node-c", 12, None)] == [stuck]
    assert any(r.blocked_now and r.blocked_now.longest.source == "snapshot" for got in rows.values() for r in got)
    assert any(r.extras.p99_ns is not None and r.extras.p99_ns < r.entry["syscalls"].get("write", {}).get("max_ns", 0)
               for got in rows.values() for r in got)                           # 303: p99 below its max
    assert [r.entry["syscalls"]["write"]["count"] for r in last if r.key == ("node-c", None, 303)] == [200]
    assert any(len(r.entry["pids"]) == 2 for r in last)                        # rank 8: 305 and 306


def test_incremental_rows_are_the_full_analysis_rows_at_every_cursor(expected):
    source, rows = expected
    index = RankIndex(source.at(None), source.at)
    cursors = sorted(rows)
    shuffled = cursors[:]
    random.Random(7).shuffle(shuffled)
    for c in cursors + cursors[::-1] + shuffled:
        got = index.rows(c)
        assert got == rows[c], f"at {c} ns: {differences(got, rows[c])}"


def test_a_move_keeps_the_last_analysis_and_says_as_of_when(expected):
    source, rows = expected
    c0, c1 = sorted(rows)[len(rows) // 3], sorted(rows)[2 * len(rows) // 3]
    full = overview(source, c0, "0")
    step = moved(source, c1, full)
    assert step.ranks == rows[c1] and step.analysis is full.analysis
    assert (step.timeline.cursor_ns, step.analysis_ns, step.settled) == (c1, c0, False)
    back = moved(source, c0, step)                         # back where the analysis is as of: settled
    assert back.ranks == full.ranks and back.settled


def test_the_worker_answers_moves_incrementally_then_settles(expected, job_paths, monkeypatch):
    source, rows = expected
    monkeypatch.setattr(worker, "FULL_SHARE", 1e-9)       # no full analysis between moves here
    analyst = worker.ThreadAnalyst(Job.open(job_paths), "0")
    first = analyst.overview(None, 0, None, False)
    sent, held = {}, {}
    wire = lambda r: worker.unpack(pickle.loads(pickle.dumps(worker.pack(r, sent))), held)   # noqa: E731
    assert wire(first) == first
    for c in sorted(rows)[::7]:
        step = analyst.overview(c, 0, None, False, moving=True)
        assert step.ranks == rows[c] and step.analysis is first.analysis
        assert wire(step) == step
    rest = analyst.overview(c, 0, None, False)            # the cursor rests: the whole analysis
    assert rest.settled and rest == overview(source, c, "0")
    assert wire(rest) == rest


def test_the_wire_sends_only_the_rows_that_changed(expected):
    source, rows = expected
    c = sorted(rows)
    sent = {}
    worker.pack(overview(source, c[-2], "0"), sent)
    again = worker.pack(overview(source, c[-1], "0"), sent)
    named = [r for r in again.ranks if isinstance(r, tuple)]
    assert named and len(named) < len(again.ranks) or len(named) == len(again.ranks)
    assert worker.pack(overview(source, c[-1], "0"), sent).analysis is not None     # a new analysis object


def test_a_long_full_analysis_runs_beside_the_moves(expected, job_paths, monkeypatch):
    """Where the whole analysis takes long (seconds for 1,000 nodes), the cursor at rest starts it
    in a thread and is answered at once with the incremental rows; asked again once it is done,
    the answer is the whole analysis as of the cursor."""
    source, rows = expected
    monkeypatch.setattr(worker, "BACKGROUND_CPU_S", 0.0)
    analyst = worker.ThreadAnalyst(Job.open(job_paths), "0")
    analyst.overview(None, 0, None, False)
    c = sorted(rows)[len(rows) // 2]
    first = analyst.overview(c, 0, None, False)
    assert not first.settled and first.ranks == rows[c]
    analyst.wait()
    again = analyst.overview(c, 0, None, False)
    assert again.settled and again == overview(source, c, "0")


def test_without_rpc_rows_and_with_two_captures_of_one_host(tmp_path):
    """A job without RPC rows (the index answers: nothing is charged), and one of two captures
    of one host (it declines: a move is then analysed in full), at every edge."""
    alone = synth.save(tmp_path / "x", host="node-x", ranks=2, mode="osync", file_bytes=16 << 10)["path"]
    no_rpc = tmp_path / "y"
    w = CaptureWriter(str(no_rpc))
    w.write_meta(meta("node-y"))
    w.append("syscall", syscall_table([write(400, 30, 1.0, 1.5), write(401, 31, 2.0, 2.2)]))
    w.close()
    twice = synth.save(tmp_path / "z", host="node-x", ranks=2, mode="osync", file_bytes=16 << 10,
                       mono_start_ns=9_000 * S)["path"]
    for paths, incremental in (([str(no_rpc)], True), ([alone, twice], False)):
        source = JobSource(Job.open(paths))
        last = overview(source, None, "0")
        for c in edges(paths)[::3]:
            step = moved(source, c, last)
            assert (step is not None) == incremental
            if step is not None:
                assert step.ranks == overview(source, c, "0").ranks, c
