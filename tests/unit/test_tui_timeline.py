"""analyzer.timeline and the TUI's view model (analyzer.view and its parts): the job as of a time
cursor, per-rank extras of the rank table, and following a capture that grows (no textual here:
it is analyzer code)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import RPC, schema
from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job
from slotscope.analyzer.in_progress import blocked_now, in_progress
from slotscope.analyzer.rank_detail import FileStats, rank_detail
from slotscope.analyzer.rank_extras import rank_extras
from slotscope.analyzer.ranks import rank_key, rank_table
from slotscope.analyzer.series import step_max, step_mean
from slotscope.analyzer.timeline import JobSource
from slotscope.analyzer.view import next_save, overview, save_at
from unit_helpers import meta, proc, save_writes, sc, syscall_table

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
    assert r0.p99_ns == 50_000_000
    assert r0.write_calls == 2
    assert r0.mean_write == (4096 + 8192) / 2
    # the slowest syscall that ended in the 5 s before the cursor
    assert r0.slowest_recent.syscall == "fsync"
    assert r0.slowest_recent.latency_ns == 50_000_000
    # rank 1's slow write at 8 s is after the cursor: only the early one is recent
    assert extras[("node-a", 1, None)].slowest_recent.latency_ns == 2_000_000
    # a process without a rank is keyed by its pid
    assert extras[("node-a", None, 13)].write_calls == 1


def test_slowest_recent_forgets_old_syscalls(cap):
    extras = rank_extras(Job.open([cap]), now_ns=at(20))
    assert extras[("node-a", 0, None)].slowest_recent is None
    assert extras[("node-a", 0, None)].p99_ns == 50_000_000         # p99 is over everything so far


def test_overview_extends_analyze(cap):
    source = JobSource(Job.open([cap]))
    result = overview(source, 5 * S, "0")
    assert result.analysis["verdict"] == "healthy" and result.analysis["findings"] == []
    assert result.timeline.cursor_ns == 5 * S and not result.timeline.live
    assert result.has_rpc is False
    by = {rank_key(r.entry): r for r in result.ranks}
    assert by[("node-a", 1, None)].entry["bytes_written"] == 1000
    assert by[("node-a", 1, None)].extras.p99_ns == 2_000_000
    # the analysis is analyze()'s as of the cursor, nothing added to it (the saves are not analysed
    # again at each cursor move: the TUI has the whole capture's)
    assert result.analysis == analyze(source.at(5 * S), "0", each_save=False)
    assert [r.key for r in result.ranks] == [rank_key(r) for r in result.analysis["ranks"]]


def grow(writer: CaptureWriter, rows: list[dict]) -> None:
    """A new finished segment, as the agent closes one about every second."""
    writer.append("syscall", syscall_table(rows))
    writer.tables["syscall"].close_segment()


def test_live_source_follows_new_segments_and_the_stop(tmp_path):
    path = str(tmp_path / "live")
    live_meta = meta()
    del live_meta["stop"]
    w = CaptureWriter(path)
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


def test_p99_is_numpys_higher_percentile(build_capture):
    import numpy as np
    lat = [(i * 7919) % 1000 * 1000 + 10 for i in range(250)]
    rows = [sc(10, "write", v, 1, ts=at(1 + i * 0.01)) for i, v in enumerate(lat)]
    rows += [sc(11, "write", 5, 1, ts=at(2))]
    path = build_capture(syscalls=rows, procs=[proc(10, rank=0), proc(11, rank=1)])
    extras = rank_extras(Job.open([path]))
    assert extras[("node-a", 0, None)].p99_ns == int(np.percentile(lat, 99, method="higher"))
    assert extras[("node-a", 1, None)].p99_ns == 5


def test_rank_detail_files_and_rpcs(cap):
    job = Job.open([cap])
    d = rank_detail(job, "node-a", [10])
    assert d.files == [                                             # most written first
        FileStats(path="/mnt/ckpt/optim", bytes=8192, calls=1, total_ns=3_000_000, max_ns=3_000_000),
        FileStats(path="/mnt/ckpt/shard", bytes=4096, calls=2, total_ns=51_000_000, max_ns=50_000_000),
    ]
    assert (d.by_proc, d.attribution) == ({}, {})                  # no rpc table in this capture
    assert d.blocked == []


# ---- captures with RPCs, slot samples, NIC counters and blocked snapshots ----

def rpc_row(tgid: int, proc: str = "WRITE", begin: float = 1.0, slot_ms: float = 5, rtt_ms: float = 2,
            exec_ms: float = 10, nbytes: int = 4096, complete: int = 1) -> dict:
    b = at(begin)
    row = {f.name: 0 for f in RPC}
    row.update(ts_begin=b, ts_end=b + int(exec_ms * 1e6), owner_tgid=tgid, owner_tid=tgid, procname=proc,
               progname="nfs", io_count=nbytes if proc == "WRITE" else 0, io_stable=2, complete=complete,
               slot_wait_ns=int(slot_ms * 1e6), transmit_wait_ns=100_000, rtt_ns=int(rtt_ms * 1e6),
               execute_ns=int(exec_ms * 1e6), backlog_ns=int(slot_ms * 1e6), server="10.0.0.1:2049", client_id=3,
               status=0, version=3)
    return row


def slots_rows(points: list[tuple[float, int, int]]) -> list[dict]:
    return [{"ts": at(t), "in_use": n, "backlog": w, "session_wait": 0, "sending": 0, "pending": 0,
             "client_id": 3, "server": "10.0.0.1:2049"} for t, n, w in points]


def netdev_rows(points: list[tuple[float, int]], speed: int | None = 1_000_000_000) -> list[dict]:
    return [{"ts": at(t), "iface": "eth0", "server": "10.0.0.1", "speed_bps": speed, "tx_bytes": b,
             "rx_bytes": b // 10, "tx_packets": 0, "rx_packets": 0} for t, b in points]


def blocked_rows(snap_s: float, calls: list[tuple[int, str, float]]) -> list[dict]:
    """One snapshot at snap_s: (tgid, syscall, entered at seconds)."""
    return [{"ts": at(snap_s), "tid": tgid, "tgid": tgid, "syscall": name, "ts_enter": at(enter), "fd": 3,
             "path": f"/mnt/ckpt/rank{tgid}", "dev": 42, "ino": tgid} for tgid, name, enter in calls]


NFS_META = {"nfs_mounts": [{"server": "10.0.0.1", "mountpoint": "/mnt/ckpt", "proto": "tcp", "vers": "3",
                            "nconnect": "1"}],
            "sunrpc": {"tcp_max_slot_table_entries": "2"}}


def write_capture(path: str, tables: dict[str, list[dict]], live: bool = False) -> CaptureWriter:
    w = CaptureWriter(path)
    m = meta(**NFS_META)
    if live:
        del m["stop"]
    w.write_meta(m)
    for name, rows in tables.items():
        if rows:
            w.append(name, pa.Table.from_pylist(rows, schema=schema(name)))
            w.tables[name].close_segment()
    if not live:
        w.close()
    return w


@pytest.fixture
def nfs_cap(tmp_path):
    path = str(tmp_path / "nfs")
    write_capture(path, {
        "procs": [proc(10, rank=0), proc(11, rank=1)],
        "syscall": [sc(10, "write", 10_000_000, 4096, ts=at(1)), sc(10, "write", 3_000_000_000, 4096, ts=at(2)),
                    sc(11, "write", 10_000_000, 4096, ts=at(1)), sc(11, "fsync", 20_000_000, ts=at(30))],
        "rpc": [rpc_row(10, begin=1.0), rpc_row(10, begin=2.0, slot_ms=100, exec_ms=200),
                rpc_row(11, begin=1.0), rpc_row(11, "COMMIT", begin=30.0, slot_ms=0, exec_ms=20)],
        "slots": slots_rows([(1, 1, 0), (2, 2, 3), (4, 1, 0), (6, 0, 0)]),
        "netdev": netdev_rows([(0, 0), (2, 125_000_000), (4, 125_000_000), (6, 375_000_000)]),
        "blocked": blocked_rows(40, [(11, "close", 38.5), (11, "fsync", 39.5)]),
    })
    return path


def test_rpcs_are_cut_at_the_cursor_by_their_end(nfs_cap):
    source = JobSource(Job.open([nfs_cap]))
    assert source.at(1 * S).table("rpc") is None                   # the first ones end at 1.01 s
    assert source.at(1.5 * S).table("rpc").num_rows == 2
    assert source.at(2.5 * S).table("rpc").num_rows == 3           # rank 0's second one ends at 2.2 s
    assert source.at(None).table("rpc").num_rows == 4


def test_in_progress_from_the_trace_and_from_snapshots(nfs_cap):
    source = JobSource(Job.open([nfs_cap]))
    # at 3 s rank 0 is 1 s into its 3 s write (a row written when it returned, at 5 s)
    calls = in_progress(source.at(3 * S), source.at(None), 3 * S)
    assert calls.select(["rank", "syscall", "age_ns", "source"]).to_pylist() == [
        {"rank": 0, "syscall": "write", "age_ns": 1 * S, "source": "trace"}]
    # following the end: only what the agent's snapshots say (the latest, 40 s: rank 1)
    now = blocked_now(in_progress(source.at(None), None, 40 * S))
    [(key, b)] = now.items()
    assert key == ("node-a", 1, None)
    assert (b.longest.syscall, b.longest.path, b.longest.age_ns, b.longest.source, b.calls) == (
        "close", "/mnt/ckpt/rank11", 1.5 * S, "snapshot", 2)
    # a snapshot more than 2 s before the cursor says nothing about now
    assert in_progress(source.at(None), None, 43 * S) is None
    # the overview puts it in the rank table
    result = overview(source, 41 * S, "0")
    by = {r.entry["rank"]: r for r in result.ranks}
    assert by[1].blocked_now.longest.syscall == "close" and by[0].blocked_now is None


def test_rank_detail_splits_the_ranks_rpcs_per_procedure(nfs_cap):
    source = JobSource(Job.open([nfs_cap]))
    d = rank_detail(source.at(None), "node-a", [10])
    assert sorted(d.by_proc) == ["WRITE"]
    w = d.by_proc["WRITE"]
    assert w["count"] == 2 and w["bytes"] == 8192 and w["slot_wait_ns"] == 105_000_000
    assert d.attribution == {"direct": 2}
    assert sorted(rank_detail(source.at(None), "node-a", [11]).by_proc) == ["COMMIT", "WRITE"]
    # as of 1.5 s: only the RPCs that had ended
    assert rank_detail(source.at(1.5 * S), "node-a", [10]).by_proc["WRITE"]["count"] == 1


def test_step_mean_and_max():
    ts = np.array([10, 20, 30])
    v = np.array([2, 4, 0])
    edges = np.array([0, 10, 20, 25, 40])
    assert step_mean(ts, v, edges).tolist() == [0.0, 2.0, 4.0, 4 * 5 / 15]
    assert step_max(ts, v, edges).tolist() == [0.0, 2.0, 4.0, 4.0]
    assert step_mean(np.array([], np.int64), np.array([]), edges).tolist() == [0.0] * 4


def test_transport_series(nfs_cap):
    source = JobSource(Job.open([nfs_cap]))
    span = source.span_ns()
    [s] = source.series(60)                     # one bin a second (60 s capture)
    assert s.server == "10.0.0.1:2049" and s.limit == 2 and s.bins == 60
    assert s.peak_in_use == 2 and s.waiting_peak == 3
    # the slot samples sit 1000 ns after each second (T0): the bin of second 2..3 is at 2 in use
    per = span / 60
    i = int(2.5 * S / per)
    assert s.in_use_peak[i] == 2 and s.in_use[i] == pytest.approx(2, abs=0.01)
    assert s.waiting[i] == pytest.approx(3, abs=0.01)
    assert s.in_use[int(10 * S / per)] == 0
    link = s.link
    assert link.iface == "eth0" and link.speed_bps == 1_000_000_000
    # 125 MB in the 2 s up to 2 s: 500 Mb/s; nothing from 2 to 4 s; 1 Gb/s from 4 to 6 s
    assert link.tx[int(1 * S / per)] == pytest.approx(500e6, rel=0.01)
    assert link.tx[int(3 * S / per)] == pytest.approx(0, abs=1e3)
    assert link.tx[int(5 * S / per)] == pytest.approx(1e9, rel=0.01)
    assert link.tx[int(20 * S / per)] == 0
    assert source.series(60) is source.series(60)                # cached until the capture grows


def test_live_source_reads_only_new_segments_and_its_end_follows_any_table(tmp_path):
    path = str(tmp_path / "live")
    w = write_capture(path, {"syscall": [sc(10, "write", 1000, 100, ts=at(1))]}, live=True)
    source = JobSource(Job.open([path]))
    first = source.views[0].full("syscall")
    assert source.span_ns() == 1 * S + 1000
    gen = source.generation
    assert not source.refresh() and source.generation == gen      # nothing new
    w.append("agent", pa.Table.from_pylist([{"ts": at(5), "cpu_user_ns": 0, "cpu_sys_ns": 0, "rss_bytes": 0,
                                            "events": 0, "rows": 0, "capture_bytes": 0, "bpf_run_ns": 0,
                                            "bpf_run_cnt": 0}], schema=schema("agent")))
    w.tables["agent"].close_segment()
    assert source.refresh() and source.generation == gen + 1
    assert source.span_ns() == 5 * S                                # the agent's heartbeat row
    assert source.views[0].full("syscall") is first                # not re-read
    grow(w, [sc(11, "write", 1000, 100, ts=at(6))])
    assert source.refresh()
    assert source.views[0].full("syscall").num_rows == 2
    assert source.updated_at() is not None
    w.close()


# ---- the saves, to jump between ----

SAVE_STARTS = (5, 22, 40)       # seconds of the monotonic clock; 10 s (save_gap_s) or more apart
SAVE_PROCS = [proc(10, rank=0), proc(11, rank=1)]


def three_ranked_saves() -> list[dict]:
    """Ranks 0 and 1 save three times: 8 MiB in 5 s at 5 s and 22 s, 16 MiB in 9 s at 40 s (on the
    time axis T0 earlier: the capture started at T0)."""
    rows = []
    for k, start in enumerate(SAVE_STARTS, 1):
        for tgid in (10, 11):
            rows += save_writes(start, tgid, f"/mnt/ckpt/step_{k}/r{tgid}.pt", n=8 if k == 3 else 4)
    return rows


@pytest.fixture
def saves_cap(build_capture):
    return build_capture(syscalls=three_ranked_saves(), procs=SAVE_PROCS)


def test_overview_holds_every_save_on_the_time_axis(saves_cap):
    source = JobSource(Job.open([saves_cap]))
    early = overview(source, 10 * S, "0")
    # where the cursor is makes no difference: the saves after it are there to jump to
    assert early.saves == overview(source, None, "0").saves
    assert [(s.number, s.start_ns, s.end_ns, s.bytes, s.files) for s in early.saves] == [
        (1, 5 * S - T0, 10 * S, 8 * 2**20, 2), (2, 22 * S - T0, 27 * S, 8 * 2**20, 2),
        (3, 40 * S - T0, 49 * S, 16 * 2**20, 2)]
    assert not any(s.ongoing for s in early.saves)                 # a finished capture
    assert [s.what for s in early.saves] == [f"torch.save checkpoint step_{k}/: 2 files (r10.pt, r11.pt)"
                                             for k in (1, 2, 3)]
    one, two, three = early.saves
    assert save_at(early.saves, one.start_ns) is one and save_at(early.saves, one.end_ns) is one
    assert save_at(early.saves, one.start_ns - 1) is None and save_at(early.saves, one.end_ns + 1) is None
    assert next_save(early.saves, 0, 1) is one and next_save(early.saves, one.start_ns, 1) is two
    assert next_save(early.saves, three.start_ns, 1) is None
    assert next_save(early.saves, two.start_ns + 1, -1) is two   # inside a save: its own start
    assert next_save(early.saves, two.start_ns, -1) is one       # at its start: the one before
    assert next_save(early.saves, one.start_ns, -1) is None
    # a cursor at a save's start is the moment its first calls entered (the ranks' opens, 1 us long)
    assert source.at(two.start_ns).table("syscall").num_rows == 12
    assert source.at(two.start_ns + 1000).table("syscall").num_rows == 12 + 2


def test_live_saves_appear_as_the_capture_grows(tmp_path):
    path = str(tmp_path / "live")
    w = write_capture(path, {"syscall": [sc(10, "openat", ts=at(1)), sc(10, "read", ts=at(2))]}, live=True)
    source = JobSource(Job.open([path]))
    assert overview(source, None, "0").saves == []              # before the first save
    grow(w, save_writes(5, 10, "/mnt/ckpt/step_1/r10.pt"))
    assert overview(source, None, "0").saves == []              # cached until the capture is re-read
    source.refresh()
    [save] = overview(source, None, "0").saves
    assert (save.number, save.start_ns, save.end_ns, save.bytes) == (1, 5 * S - T0, 10 * S, 4 * 2**20)
    # less than save_gap_s (10 s) since its last event: it may go on, and the end is in it
    assert save.ongoing and save_at([save], 15 * S) is save
    grow(w, [sc(10, "read", ts=at(21))])
    source.refresh()
    [save] = overview(source, None, "0").saves
    assert not save.ongoing and save_at([save], source.span_ns()) is None
    w.close()
