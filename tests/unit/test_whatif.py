"""The what-if model (analyzer/whatif.py) against the synthetic save (tests/synth.py), where a
change's true effect is the AFTER save simulated with it: the prediction made from BEFORE
alone holds AFTER's save in its range, says which way it goes, calls the server-, link-,
session- and client-bound cases "little gain", and refuses, saying why, where the capture
lacks an input. Then the fixes of `analyze` and `slotscope compare` on a before/after pair."""
import json
import sys
from pathlib import Path

import pytest
from unit_helpers import run_slotscope

from slotscope.analyzer import whatif
from slotscope.analyzer.analysis import analyze, context
from slotscope.analyzer.job import Job
from slotscope.analyzer.thresholds import Thresholds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

pytestmark = pytest.mark.unit

S = 1e9
BASE = {"ranks": 8, "file_bytes": 512 * 1024, "write_bytes": 4096, "slots": 4, "rtt_ms": 20.0}
SERVER_BOUND = {"server_threads": 1, "server_ms": 5.0, "rtt_ms": 6.0, "slow_rank": (0, 2.0)}
LINK_BOUND = {"link_bps": 100e6, "write_bytes": 1 << 20, "file_bytes": 8 << 20}


def _predict(tmp_path, before: dict, change: whatif.Change) -> dict:
    synth.save(tmp_path / "before", **{**BASE, **before})
    measured, why = whatif.measure(context(Job.open([str(tmp_path / "before")]), Thresholds()))
    [p] = whatif.predict(measured, why, change)
    return p.as_json()


def _truth(tmp_path, after: dict) -> tuple[float, dict]:
    """AFTER's save in seconds, from the simulation's own manifest (not the analyzer)."""
    m = synth.save(tmp_path / "after", **{**BASE, **after})
    start, end = m["save_utc_ns"]
    return (end - start) / S, m


@pytest.mark.parametrize("before, after, change, limit", [
    ({}, {"slots": 16}, whatif.Change(slots=16), "ranks"),
    ({}, {"nconnect": 4}, whatif.Change(nconnect=4), "ranks"),
    ({"session_slots": 4}, {"session_slots": 32}, whatif.Change(session_slots=32), "ranks"),
    ({}, {"write_bytes": 65536}, whatif.Change(write_size=65536), "transport slots"),
    ({}, {"mode": "buffered"}, whatif.Change(buffered=True), "transport slots"),
], ids=["slots 4->16", "nconnect 1->4 (NFSv3)", "session slots 4->32", "4 KiB->64 KiB writes", "buffered"])
def test_a_change_that_helps_is_predicted_within_range(tmp_path, before, after, change, limit):
    p = _predict(tmp_path, before, change)
    actual, _ = _truth(tmp_path, {**before, **after})
    lo, hi = p["range"]
    assert p["why"] is None and p["model"] == whatif.MODEL
    assert lo <= actual <= hi, (p["predicted_s"], p["range"], actual)
    assert abs(p["predicted_s"] - actual) / actual < 0.15
    assert actual < p["measured_s"] / 1.5 and not p["little_gain"]        # faster, and said so
    assert p["limit"].startswith(limit)
    assert p["dominant"] and {r["rank"] for r in p["ranks"]} == set(range(8))


@pytest.mark.parametrize("before, after, change, limit", [
    (SERVER_BOUND, {"slots": 16}, whatif.Change(slots=16), "server"),
    (LINK_BOUND, {"slots": 16}, whatif.Change(slots=16), "link"),
    ({"session_slots": 4}, {"nconnect": 4}, whatif.Change(nconnect=4), "session slots"),
    ({"session_slots": 4}, {"slots": 16}, whatif.Change(slots=16), "session slots"),
    ({"cpu_us": 40_000}, {"slots": 16}, whatif.Change(slots=16), "client"),
], ids=["one server thread", "100 Mb/s link", "nconnect on NFSv4.1 (session table shared)",
                               "transport slots on NFSv4.1 (the session table limits)", "busy ranks"])
def test_where_the_limit_is_elsewhere_little_gain_is_predicted(tmp_path, before, after, change, limit):
    p = _predict(tmp_path, before, change)
    actual, _ = _truth(tmp_path, {**before, **after})
    lo, hi = p["range"]
    assert p["little_gain"] and p["limit"].startswith(limit)
    assert lo <= actual <= hi, (p["predicted_s"], p["range"], actual)
    assert actual > whatif.LITTLE_GAIN * p["measured_s"]       # and indeed it bought little


def test_local_then_copy_predicts_the_blocking_time_and_the_copy(tmp_path):
    p = _predict(tmp_path, {}, whatif.Change(local_then_copy=True, local_mbps=500))
    _, m = _truth(tmp_path, {"mode": "local_copy", "local_mbps": 500})
    # a rank's start in the manifest is its first traced call, the copier's (the local write is not
    # traced): the copy runs from the first rank's return from its local write to the last copier's end
    copy = (max(r["end"] for r in m["ranks"]) - min(r["blocking_end"] for r in m["ranks"])) / S
    local = 8 * 512 * 1024 / 500e6           # eight ranks' files at the disk's 500 MB/s
    assert max(r["predicted_s"] for r in p["ranks"]) == pytest.approx(local, rel=0.1)
    assert p["predicted_s"] < p["measured_s"] / 10
    assert p["copy_range"][0] <= copy <= p["copy_range"][1], (p["copy_s"], p["copy_range"], copy)


@pytest.mark.parametrize("before, words", [
    ({"sysctls": False}, "no slot limit seen"),
    ({"nfs_probes": False}, "no RPC rows"),
    ({"link_bps": None}, "link's speed is unknown"),
], ids=["no slot limit", "no NFS probes (a kernel log only)", "unknown link speed"])
def test_cannot_predict_says_why(tmp_path, before, words):
    p = _predict(tmp_path, before, whatif.Change(slots=16))
    assert p["status"] == "cannot_predict" and words in p["why"]
    assert whatif.line(p).startswith("slots=16: cannot predict: ")


def test_each_fix_carries_its_prediction_in_json_text_and_html(tmp_path):
    synth.save(tmp_path / "cap", **BASE)
    result = analyze(Job.open([str(tmp_path / "cap")]), "test")
    sat = next(f for f in result["findings"] if f["kind"] == "slot_saturation")
    changes = [f["change"] for f in sat["fixes"]]
    assert changes == ["slots=128", "nconnect=8", "buffered writes"]
    for fix in sat["fixes"]:
        assert {"change", "predicted_s", "range", "model"} <= set(fix)
        # a variant of the model may say it buys nothing (measured, give or take its rounding)
        assert fix["range"][0] <= fix["predicted_s"] < fix["measured_s"]
        assert fix["predicted_s"] <= fix["range"][1] <= fix["measured_s"] * (1 + whatif.RANGE_FLOOR)
    assert all(f["fixes"] == [] for f in result["findings"] if f["kind"] not in whatif.PREDICTED)
    text = run_slotscope("analyze", str(tmp_path / "cap")).stdout
    assert "predicted: nconnect=8: save 5.17 s -> " in text
    run_slotscope("analyze", str(tmp_path / "cap"), "--html", str(tmp_path / "r.html"))
    assert '<li data-change="nconnect=8">nconnect=8: save 5.17 s -&gt; ' in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("before, first", [
    (SERVER_BOUND, "more slots or connections buy little here (predicted below): each RPC's time grows with the "
                   "RPCs in flight, so the server (its disk, its nfsd threads) or the path to it is the limit"),
    ({}, "raise the transport slot table"),
], ids=["one server thread", "slots the limit"])
def test_a_full_slot_table_whose_fixes_buy_little_says_where_the_limit_is(tmp_path, before, first):
    """The finding names the full slot table; where the model predicts that more slots and
    connections buy little, its fix says first where the time goes."""
    synth.save(tmp_path / "cap", **{**BASE, **before})
    result = analyze(Job.open([str(tmp_path / "cap")]), "test")
    sat = next(f for f in result["findings"] if f["kind"] == "slot_saturation")
    assert sat["fix"].startswith(first), sat["fix"]


def test_a_recording_of_several_saves_predicts_its_slowest(tmp_path):
    synth.save(tmp_path / "one", **BASE)
    synth.save(tmp_path / "two", **{**BASE, "file_bytes": 1 << 20}, mono_start_ns=5_100 * 10**9,
               realtime_start_ns=synth.START_NS + 100 * 10**9)
    result = analyze(Job.open([str(tmp_path / "one"), str(tmp_path / "two")]), "test")
    assert [s["number"] for s in result["saves"]] == [1, 2]
    slowest = result["saves"][1]
    # over the whole recording the slot table is full a tenth of the time: the small writes remain
    small = next(f for f in result["findings"] if f["kind"] == "small_sync_writes")
    assert [p["save"] for p in small["fixes"]] == [2]
    assert small["fixes"][0]["measured_s"] == pytest.approx(slowest["duration_s"], rel=0.01)
    assert whatif.line(small["fixes"][0]).startswith(f"buffered writes: save 2 {slowest['duration_s']:.1f} s -> ")


def test_whatif_command_prints_the_model_its_inputs_and_each_rank(tmp_path):
    synth.save(tmp_path / "cap", **BASE)
    out = run_slotscope("whatif", str(tmp_path / "cap"), "--slots", "16").stdout
    assert out.startswith("what if: slots=16\nmodel: Little's law")
    assert "slot limit 4: 4 per connection x nconnect 1; link 10 Gb/s" in out
    assert "per rank: rank 0 5.14 -> " in out
    doc = json.loads(run_slotscope("whatif", str(tmp_path / "cap"), "--nconnect", "2", "--json").stdout)
    [save] = doc["saves"]
    assert save["inputs"][0]["slot_limit"] == 4 and save["predictions"][0]["change"] == "nconnect=2"
    assert run_slotscope("whatif", str(tmp_path / "cap")).returncode == 2     # no change given


def test_compare_a_before_after_pair(tmp_path):
    synth.save(tmp_path / "before", **BASE)
    actual, _ = _truth(tmp_path, {"slots": 16})
    doc = json.loads(run_slotscope("compare", str(tmp_path / "before"), str(tmp_path / "after"), "--json",
                                   "--html", str(tmp_path / "c.html")).stdout)
    assert {"host": "node-a", "what": "sysctl sunrpc.tcp_max_slot_table_entries", "before": "4",
            "after": "16"} in doc["changed"]
    assert doc["verdicts"] == {"before": "slot_saturation", "after": "small_sync_writes"}
    assert {"kind": "slot_saturation", "severity": "critical", "gone": True} in doc["symptoms"]
    assert {"kind": "small_sync_writes", "severity": "warning", "gone": False} in doc["symptoms"]
    p = doc["prediction"]
    assert p["change"] == "slots=16" and p["within_range"] and abs(p["error"]) < 0.15
    assert p["actual_s"] == pytest.approx(actual, rel=0.01)
    assert [r["after_s"] < r["before_s"] / 1.5 for r in doc["ranks"]] == [True] * 8
    [row] = doc["checklist"]
    assert row["question"] == "does it come back in a clean rerun" and row["answer"] == "no"
    page = (tmp_path / "c.html").read_text()
    assert "<h2>BEFORE&#x27;s prediction for this change</h2>" in page
    text = run_slotscope("compare", "--before", str(tmp_path / "before"), "--after", str(tmp_path / "after")).stdout
    assert "does it come back in a clean rerun  no" in text


def test_compare_checks_the_prediction_whatif_makes(tmp_path):
    """Each rank stats the directory before its first file event (as the rig's saves do): the
    save's window starts after those calls, the recording does not, and whatif and compare
    must still predict from the same part of BEFORE."""
    before, after = {**BASE, "metadata_ops_per_rank": 2}, {**BASE, "metadata_ops_per_rank": 2, "slots": 16}
    synth.save(tmp_path / "before", **before)
    synth.save(tmp_path / "after", **after)
    p = json.loads(run_slotscope("compare", str(tmp_path / "before"), str(tmp_path / "after"), "--json").stdout)
    [[w]] = [s["predictions"] for s in json.loads(run_slotscope("whatif", str(tmp_path / "before"), "--slots", "16",
                                                                "--json").stdout)["saves"]]
    assert (w["predicted_s"], w["range"]) == (p["prediction"]["predicted_s"], p["prediction"]["range"])


def test_compare_finds_the_change_in_the_capture_when_meta_has_none(tmp_path):
    """4 KiB O_SYNC writes, then buffered ones: nothing in meta.json changed, the WRITEs did."""
    synth.save(tmp_path / "before", **BASE)
    actual, _ = _truth(tmp_path, {"mode": "buffered"})
    doc = json.loads(run_slotscope("compare", str(tmp_path / "before"), str(tmp_path / "after"), "--json").stdout)
    assert doc["changed"] == []
    assert doc["writes"]["before"]["stable_share"] == 1 and doc["writes"]["after"]["stable_share"] == 0
    p = doc["prediction"]
    assert p["change"] == "buffered writes" and p["within_range"]
    assert doc["checklist"][0]["answer"] == "yes"       # the flush still fills the four slots


def test_the_servers_slope_is_fitted_through_each_levels_median():
    """A queue of 210 ms a WRITE (512 KiB at 20 Mbit/s): alone 210 ms, behind a whole one 420,
    behind half of one 315. A third of the WRITEs at 2 in flight were sent behind half of one:
    the slope through the medians is the queue's 210 ms, the least-squares one 35 ms less."""
    import numpy as np
    x = np.array([1.0] * 10 + [2.0] * 30)
    y = np.array([0.210] * 10 + [0.420] * 20 + [0.315] * 10)
    a, b, se = whatif._fit(x, y)
    assert b == pytest.approx(0.210) and a == pytest.approx(0.0, abs=1e-9)
    assert np.polyfit(x, y, 1)[0] == pytest.approx(0.175)
    assert 0 < se < 0.05
