"""analyzer.timeline: the job as of a time cursor, per-rank extras of the TUI's rank table, and
following a capture that grows (no textual here: it is analyzer code)."""
from __future__ import annotations

import pytest

from slotscope.agent.capture_writer import CaptureWriter
from slotscope.agent.tables import SCHEMAS
from slotscope.analyzer.job import Job
from slotscope.analyzer.ranks import rank_table
from slotscope.analyzer.timeline import JobSource, overview, rank_extras, rank_key
from unit_helpers import meta, proc, sc, syscall_table

pytestmark = pytest.mark.unit

S = 1_000_000_000
T0 = 1_000                      # meta()'s start monotonic_ns


def at(seconds: float) -> int:
    """ts_enter of a syscall entered `seconds` after the capture's start."""
    return T0 + int(seconds * S)


SYSCALLS = [
    sc(10, "write", 1_000_000, 4096, ts=at(1)),
    sc(10, "write", 3_000_000, 8192, ts=at(2), path="/mnt/ckpt/optim"),
    sc(10, "fsync", 50_000_000, ts=at(2.5)),
    sc(11, "write", 2_000_000, 1000, ts=at(1)),
    sc(11, "write", 7_000_000, 100_000, ts=at(8)),
    sc(12, "write", 1_000_000, 10, ts=at(9)),
    sc(13, "write", 10, 5, ts=at(3)),
]
PROCS = [proc(10, rank=0), proc(11, rank=1), proc(12, rank=2, comm="zzz"), proc(13, comm="rsync")]


@pytest.fixture
def cap(build_capture):
    return build_capture(syscalls=SYSCALLS, procs=PROCS)


def test_job_at_cursor_holds_rows_up_to_it(cap):
    source = JobSource(Job.open([cap]))
    assert source.span_ns() == 61 * S - T0          # the stop record of a finished capture
    everything = rank_table(source.at(None))
    assert [r["rank"] for r in everything] == [0, 1, 2, None]
    early = rank_table(source.at(5 * S))
    assert [r["rank"] for r in early] == [0, 1, None]
    assert {r["rank"]: r["bytes_written"] for r in early} == {0: 12288, 1: 1000, None: 5}
    assert rank_table(source.at(0)) == []


def test_rank_extras(cap):
    extras = rank_extras(Job.open([cap]), now_ns=at(4))
    r0 = extras[("node-a", 0, None)]
    assert r0["p99_ns"] == 50_000_000
    assert r0["write_calls"] == 2
    assert r0["mean_write"] == (4096 + 8192) / 2
    # the slowest syscall that ended in the 5 s before the cursor
    assert r0["slowest_recent"]["syscall"] == "fsync"
    assert r0["slowest_recent"]["latency_ns"] == 50_000_000
    assert r0["files"] == [                                          # most written first
        {"path": "/mnt/ckpt/optim", "bytes": 8192, "calls": 1, "total_ns": 3_000_000},
        {"path": "/mnt/ckpt/shard", "bytes": 4096, "calls": 2, "total_ns": 51_000_000},
    ]
    # rank 1's slow write at 8 s is after the cursor: only the early one is recent
    assert extras[("node-a", 1, None)]["slowest_recent"]["latency_ns"] == 2_000_000
    # a process without a rank is keyed by its pid
    assert extras[("node-a", None, 13)]["write_calls"] == 1


def test_slowest_recent_forgets_old_syscalls(cap):
    extras = rank_extras(Job.open([cap]), now_ns=at(20))
    assert extras[("node-a", 0, None)]["slowest_recent"] is None
    assert extras[("node-a", 0, None)]["p99_ns"] == 50_000_000      # p99 is over everything so far


def test_overview_extends_analyze(cap):
    result = overview(JobSource(Job.open([cap])), 5 * S, "0")
    assert result["verdict"] == "healthy" and result["findings"] == []
    assert result["timeline"]["cursor_ns"] == 5 * S and not result["timeline"]["live"]
    assert result["has_rpc"] is False
    by = {rank_key(r): r for r in result["ranks"]}
    assert by[("node-a", 1, None)]["bytes_written"] == 1000
    assert by[("node-a", 1, None)]["p99_ns"] == 2_000_000


def grow(writer: CaptureWriter, rows: list[dict]) -> None:
    """A new finished segment, as the agent closes one about every second."""
    writer.append("syscall", syscall_table(rows))
    writer.tables["syscall"].close_segment()


def test_live_source_follows_new_segments_and_the_stop(tmp_path):
    path = str(tmp_path / "live")
    live_meta = meta()
    del live_meta["stop"]
    w = CaptureWriter(path, SCHEMAS)
    w.write_meta(live_meta)
    grow(w, [sc(10, "write", 1000, 100, ts=at(1))])
    source = JobSource(Job.open([path]))
    assert source.live
    assert [r["pids"] for r in rank_table(source.at(None))] == [[10]]
    assert source.span_ns() == 1 * S + 1000

    grow(w, [sc(11, "write", 1000, 100, ts=at(2))])
    assert [r["pids"] for r in rank_table(source.at(None))] == [[10]]     # cached until refresh
    source.refresh()
    assert [r["pids"] for r in rank_table(source.at(None))] == [[10], [11]]

    w.write_meta(meta())
    w.close()
    source.refresh()
    assert not source.live
    assert source.span_ns() == 61 * S - T0
