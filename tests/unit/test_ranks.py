"""The analyzer's per-rank table and the JSON contract, from captures built with the real writer."""
from __future__ import annotations

import json

import pytest

from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.report_text import render_text
from slotscope.analyzer.job import Job
from slotscope.analyzer.ranks import rank_table
from unit_helpers import proc, run_slotscope, sc

pytestmark = pytest.mark.unit

CONTRACT_KEYS = {"slotscope_version", "schema", "captures", "verdict", "findings", "ranks", "transports", "rpc"}
RANK_KEYS = {"rank", "host", "pids", "comm", "bytes_written", "write_rpcs", "syscalls", "blocked_ns", "slot_wait_ns"}

# rank 0: pid 10; rank 1: pid 11 and its child 12 (rank inherited); pid 13 has no rank
SYSCALLS = [
    sc(10, "write", 1_000, 4096, ts=100),
    sc(10, "write", 3_000, 8192, ts=200),
    sc(10, "write", 500, ts=250, ret=-28),          # ENOSPC: a write of no bytes
    sc(10, "fsync", 50_000, ts=300),
    sc(11, "pwrite64", 2_000, 1000, ts=110),
    sc(12, "write", 7_000, 300, ts=120, tid=14),   # a thread of the child
    sc(12, "write", 1_000, 200, ts=130),
    sc(12, "close", 40_000, ts=400),
    sc(13, "write", 10, 5, ts=140),
]
PROCS = [
    proc(10, comm="bash", ts=10),                                    # before exec: no rank yet
    proc(10, rank=0, comm="python", ts=20),                          # the last identity counts
    proc(11, rank=1, comm="python"),
    proc(12, rank=1, ppid=11, comm="pt_ckpt", rank_source="inherited", inherited_from=11),
    proc(13, comm="rsync"),
]


@pytest.fixture
def one_node(build_capture):
    return build_capture("node-a", host="node-a", syscalls=SYSCALLS, procs=PROCS,
                         loss=[{"ts": 1, "interval_ns": 10**9, "probe": "syscalls", "counter": "sys_ring_full",
                                "lost": 3},
                               {"ts": 2, "interval_ns": 10**9, "probe": "syscalls", "counter": "path_ring_full",
                                "lost": 4}])


def test_rank_table(one_node):
    ranks = rank_table(Job.open([one_node]))
    assert [(r["rank"], r["pids"]) for r in ranks] == [(0, [10]), (1, [11, 12]), (None, [13])]
    r0, r1, solo = ranks
    for r in ranks:
        assert RANK_KEYS <= set(r)
        assert r["host"] == "node-a"

    assert r0["comm"] == "python"
    assert r0["bytes_written"] == 4096 + 8192
    assert r0["syscalls"] == {"write": {"count": 3, "total_ns": 4_500, "max_ns": 3_000},
                              "fsync": {"count": 1, "total_ns": 50_000, "max_ns": 50_000}}
    assert r0["blocked_ns"] == 54_500

    assert r1["bytes_written"] == 1000 + 300 + 200
    assert r1["syscalls"] == {"pwrite64": {"count": 1, "total_ns": 2_000, "max_ns": 2_000},
                              "write": {"count": 2, "total_ns": 8_000, "max_ns": 7_000},
                              "close": {"count": 1, "total_ns": 40_000, "max_ns": 40_000}}
    assert r1["blocked_ns"] == 50_000
    assert r1["comm"] in ("python", "pt_ckpt")

    assert solo["comm"] == "rsync"
    assert solo["bytes_written"] == 5
    assert solo["syscalls"] == {"write": {"count": 1, "total_ns": 10, "max_ns": 10}}


def test_processes_without_rank_stand_alone(build_capture):
    path = build_capture(syscalls=[sc(20, "write", 1, 10), sc(21, "write", 2, 20), sc(21, "write", 3, 30)],
                         procs=[proc(20, comm="cp"), proc(21, comm="dd")])
    ranks = rank_table(Job.open([path]))
    assert [(r["rank"], r["pids"], r["comm"], r["bytes_written"]) for r in ranks] == [
        (None, [20], "cp", 10), (None, [21], "dd", 50)]


def test_syscalls_of_processes_never_identified(build_capture):
    """No procs table at all (identities not yet written): rows still count, per process."""
    path = build_capture(syscalls=[sc(30, "write", 5, 100), sc(31, "fsync", 9)])
    ranks = rank_table(Job.open([path]))
    assert [(r["rank"], r["pids"], r["comm"]) for r in ranks] == [(None, [30], None), (None, [31], None)]
    assert ranks[0]["bytes_written"] == 100 and ranks[1]["bytes_written"] == 0


def test_no_syscalls_no_ranks(build_capture):
    assert rank_table(Job.open([build_capture(procs=[proc(10, rank=0)])])) == []


def test_json_contract(one_node):
    result = analyze(Job.open([one_node]), "9.9.9")
    assert CONTRACT_KEYS <= set(result)
    assert result["slotscope_version"] == "9.9.9"
    assert result["schema"] == 1
    # syscalls only: healthy as far as they tell, and the report says RPCs were not seen
    assert result["verdict"] == "healthy" and result["findings"] == []
    assert any(n.startswith("no RPC rows") for n in result["notes"])
    assert isinstance(result["findings"], list)
    assert isinstance(result["transports"], list)
    assert isinstance(result["rpc"]["by_proc"], dict)
    [cap] = result["captures"]
    assert cap == {"path": one_node, "host": "node-a", "kernel": "6.1.0-test",
                   "start": "2023-11-14T22:13:20.000+00:00", "end": "2023-11-14T22:14:20.000+00:00",
                   "lost_events": 7, "verified": False,
                   "clock": {"synchronized": None, "uncertainty_ns": None}}     # no clock_sync in its meta.json
    assert [r["rank"] for r in result["ranks"]] == [0, 1, None]
    assert json.loads(json.dumps(result)) == result        # plain JSON types only


def test_two_hosts_analysed_as_one_job(build_capture):
    """One capture per node: ranks from both hosts; the same pid on two hosts is two processes."""
    a = build_capture("a", host="node-a",
                      syscalls=[sc(10, "write", 100, 1000), sc(11, "write", 200, 2000)],
                      procs=[proc(10, rank=0), proc(11, rank=1)])
    b = build_capture("b", host="node-b",
                      syscalls=[sc(10, "write", 300, 3000), sc(11, "write", 400, 4000), sc(12, "fsync", 50)],
                      procs=[proc(10, rank=2), proc(11, rank=3), proc(12, comm="sync")])
    result = analyze(Job.open([a, b]), "0")
    assert [(r["rank"], r["host"], r["pids"], r["bytes_written"]) for r in result["ranks"]] == [
        (0, "node-a", [10], 1000), (1, "node-a", [11], 2000),
        (2, "node-b", [10], 3000), (3, "node-b", [11], 4000), (None, "node-b", [12], 0)]
    assert [c["host"] for c in result["captures"]] == ["node-a", "node-b"]


def test_cli_json_and_text(one_node):
    res = run_slotscope("analyze", "--json", one_node)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert CONTRACT_KEYS <= set(result)
    assert [r["bytes_written"] for r in result["ranks"]] == [12288, 1500, 5]

    text = run_slotscope("analyze", one_node)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0] == "verdict: healthy"
    assert "7 events lost" in text.stdout
    assert render_text(result) == text.stdout.rstrip("\n")


def test_a_ranks_syscalls_are_listed_in_the_vocabularys_order():
    """Each rank's syscalls in the order of capture/syscalls.py OPS, whatever order the grouping
    gave them: analyze --json on one capture is the same text every run (it was not)."""
    from slotscope.capture.syscalls import OP_NUMBER
    from unit_helpers import REPO
    ranks = rank_table(Job.open([str(REPO / "analyzer" / "sample")]))
    orders = [list(r["syscalls"]) for r in ranks]
    assert any(len(o) > 3 for o in orders)
    assert all(o == sorted(o, key=OP_NUMBER.__getitem__) for o in orders), orders


def test_a_rank_of_several_processes_shows_its_first_pid_and_how_many_more(build_capture):
    """The text report's pid column (issue 19 point 8): '10742+1', as top shows it, where a list
    cut to the column read '10742,107', like two pids."""
    from slotscope.analyzer.analysis import analyze
    from slotscope.analyzer.report_text import render_text
    cap = build_capture(syscalls=[sc(10742, nbytes=4096), sc(10744, nbytes=4096, ts=2_000_000)],
                        procs=[proc(10742, rank=3), proc(10744, rank=3, ppid=10742)])
    result = analyze(Job.open([cap]), "test")
    assert [r["pids"] for r in result["ranks"]] == [[10742, 10744]]
    [row] = [line for line in render_text(result).splitlines() if line.lstrip().startswith("3 ")]
    assert " 10742+1 " in row and "10742,107" not in row
