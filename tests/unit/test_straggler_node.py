"""One job over two nodes: a node whose ranks all end late is named with its ranks
(straggler_node), and each capture's clock says how closely it lines up with the others'."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job
from slotscope.analyzer.report_text import render_text
from slotscope.capture.meta import clock_uncertainty

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

pytestmark = pytest.mark.unit


def two_nodes(tmp_path, slow_link_bps=20e6):
    """Ranks 0-3 on node-a (10 Gb/s), 4-7 on node-b (slow_link_bps): 2 MiB each, buffered, flushed
    in 1 MiB WRITEs, so that node-b's link sets its ranks' pace."""
    common = {"ranks": 4, "world_size": 8, "slots": 16, "file_bytes": 2 << 20, "mode": "buffered", "rtt_ms": 1.0}
    a = synth.save(tmp_path / "a", host="node-a", **common)
    b = synth.save(tmp_path / "b", host="node-b", first_rank=4, link_bps=slow_link_bps, **common)
    return Job.open([a["path"], b["path"]])


def test_a_node_behind_a_slow_link_is_the_straggler(tmp_path):
    result = analyze(two_nodes(tmp_path), "0")
    assert result["verdict"] == "straggler_node"
    [f] = [f for f in result["findings"] if f["kind"] == "straggler_node"]
    assert f["ranks"] == [4, 5, 6, 7]
    [node] = f["evidence"]["nodes"]
    assert (node["host"], node["node_ranks"]) == ("node-b", [4, 5, 6, 7])
    assert node["median_end_s"] > 2 * f["evidence"]["other_nodes_median_end_s"]
    # the late ranks are the node's: straggler_rank, if found, follows from it
    assert all(g["explained_by"] == "straggler_node" for g in result["findings"] if g["kind"] == "straggler_rank")
    assert "host node-b (ranks 4-7)" in render_text(result)


# One late rank on a node of on-time ranks is a straggler_rank, not a late node:
# test_analysis_edges.py's test_two_hosts_with_unrelated_monotonic_clocks.


def test_equal_nodes_have_no_straggler(tmp_path):
    result = analyze(two_nodes(tmp_path, slow_link_bps=10e9), "0")
    assert "straggler_node" not in {f["kind"] for f in result["findings"]}


def meta(**keys):
    return {"start": {"monotonic_ns": 1, "realtime_ns": 2, "uncertainty_ns": 4_000}, **keys}


def test_clock_uncertainty_adds_the_synchronization_s_error():
    synced = {"synchronized": True, "esterror_ns": 1_191_000, "maxerror_ns": 60_000_000}
    assert clock_uncertainty(meta(clock_sync=synced)) == {"synchronized": True, "uncertainty_ns": 1_195_000}
    assert clock_uncertainty(meta(clock_sync={**synced, "synchronized": False})) == {
        "synchronized": False, "uncertainty_ns": None}
    assert clock_uncertainty(meta()) == {"synchronized": None, "uncertainty_ns": None}


def test_each_capture_states_its_clock(tmp_path):
    """meta.json's clock_sync (the agent's adjtimex reading) reaches the report, per capture."""
    job = two_nodes(tmp_path, slow_link_bps=10e9)
    path = Path(job.captures[1].path) / "meta.json"
    m = json.loads(path.read_text())
    m["clock_sync"] = {"synchronized": True, "esterror_ns": 1_191_000, "maxerror_ns": 60_000_000}
    path.write_text(json.dumps(m))
    result = analyze(Job.open([c.path for c in job.captures]), "0")
    assert [c["clock"]["synchronized"] for c in result["captures"]] == [None, True]
    text = " ".join(render_text(result).split())    # as read, whatever the wrapping (the paths' lengths)
    assert "host node-a, " in text and "clock synchronization not recorded" in text
    assert "clock synchronized, within 1.19 ms" in text
