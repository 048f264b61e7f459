"""The analysis at its edges, on captures built in the test (tests/synth.py and the real
writer): nothing to assess, one rank, no NIC counters or no link speed, lost events, two
hosts on one UTC timeline, --since/--until/--rank, the JSON contract, the 100-column report."""
from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from unit_helpers import assert_one_line_error, meta, run_slotscope

from slotscope.capture.writer import CaptureWriter
from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job
from slotscope.analyzer.report_text import WIDTH, render_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

pytestmark = pytest.mark.unit

S = 1_000_000_000
STORM = dict(ranks=8, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096)


def job_of(*mans):
    return Job.open([m["path"] for m in mans])


def kinds(result):
    return {f["kind"] for f in result["findings"]}


# ---- nothing to assess ------------------------------------------------------------------------

@pytest.fixture
def empty(tmp_path):
    path = str(tmp_path / "empty")
    w = CaptureWriter(path)
    w.write_meta(meta("node-a"))
    w.close()
    return path


def test_empty_capture_has_no_verdict(empty):
    result = analyze(Job.open([empty]), "0")
    assert result["verdict"] is None
    assert result["findings"] == [] and result["ranks"] == [] and result["transports"] == []
    assert any(n.startswith("nothing to assess") for n in result["notes"])
    assert result["captures"][0]["lost_events"] == 0
    assert render_text(result).splitlines()[0] == "verdict: nothing to assess"


@pytest.mark.parametrize("extra", [[], ["--json"], ["--since", "5", "--until", "9"], ["--rank", "3"]])
def test_empty_capture_on_the_command_line(empty, extra):
    res = run_slotscope("analyze", *extra, empty)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and res.stderr == ""
    if "--json" in extra:
        assert json.loads(res.stdout)["verdict"] is None
    else:
        assert res.stdout.startswith("verdict: nothing to assess\n")
        assert "nothing to assess" in res.stdout.splitlines()[1]


def test_window_with_nothing_in_it(tmp_path):
    """An error since issue 19 point 2 (it was a null verdict with exit status 0, which a script
    gating on the status took for a clean save)."""
    man = synth.save(tmp_path / "cap", **STORM)
    res = run_slotscope("analyze", "--json", "--since", "500", man["path"])
    assert_one_line_error(res, "nothing was recorded in the window")


# ---- one rank, no netdev, unknown speed, lost events ----------------------------------------

def test_one_rank(tmp_path):
    man = synth.save(tmp_path / "cap", **{**STORM, "ranks": 1})
    result = analyze(job_of(man), "0")
    [r] = result["ranks"]
    assert (r["rank"], r["pids"], r["bytes_written"], r["write_rpcs"]) == (0, [1000], 64 * 4096, 64)
    assert "straggler_rank" not in kinds(result)
    assert "slot_saturation" not in kinds(result)          # one writer cannot fill 4 slots
    assert result["verdict"] == "small_sync_writes"         # 64 small FILE_SYNC WRITEs, from all (one) ranks
    [t] = result["transports"]
    assert t["peak_in_use"] == 1 and t["saturated_fraction"] == 0
    assert "checkpoint write duration" in {c["question"] for c in result["checklist"]}


def test_no_netdev_rows(tmp_path):
    man = synth.save(tmp_path / "cap", **STORM, netdev=False)
    result = analyze(job_of(man), "0")
    [t] = result["transports"]
    assert t["link"] is None
    assert not any(c["question"].startswith("link utilisation") for c in result["checklist"])
    assert result["verdict"] == "slot_saturation"
    text = render_text(result)
    row = text.split("per transport\n")[1].splitlines()[1]
    assert row.rstrip().endswith("-")


def test_unknown_link_speed(tmp_path):
    man = synth.save(tmp_path / "cap", **STORM, link_bps=None)
    result = analyze(job_of(man), "0")
    link = result["transports"][0]["link"]
    assert link["iface"] == "eth0" and link["speed_bps"] is None
    assert link["peak_util"] is None and link["mean_util"] is None and link["mean_tx_bps"] > 0
    [c] = [c for c in result["checklist"] if c["question"].startswith("link utilisation")]
    assert c["answer"] is None and "capacity unknown" in c["value"]
    assert "eth0 speed unknown" in render_text(result)


def test_lost_events_are_reported_per_capture(tmp_path):
    a = synth.save(tmp_path / "a", host="node-a", **STORM, lost_events=7)
    b = synth.save(tmp_path / "b", host="node-b", **{**STORM, "first_rank": 8}, lost_events=0)
    c = synth.save(tmp_path / "c", host="node-c", **{**STORM, "first_rank": 16}, lost_events=1001)
    result = analyze(job_of(a, b, c), "0")
    assert [(x["host"], x["lost_events"]) for x in result["captures"]] == [
        ("node-a", 7), ("node-b", 0), ("node-c", 1001)]
    flat = " ".join(render_text(result).split())              # capture lines wrap
    for path, n in ((a["path"], 7), (b["path"], 0), (c["path"], 1001)):
        assert f"{n:,} events lost" in flat[flat.index(f"capture {path}:"):].split(" capture ")[0]
    res = run_slotscope("analyze", "--json", a["path"])
    assert json.loads(res.stdout)["captures"][0]["lost_events"] == 7


# ---- two hosts, one timeline ---------------------------------------------------------------

def test_two_hosts_with_unrelated_monotonic_clocks(tmp_path):
    """node-a booted 10 days ago, node-b 100 s ago; their clock pairs put both saves at the same
    UTC time (node-b 50 ms later). Rank 11 on node-b writes 4x as much: the only straggler. By
    raw monotonic time every rank of node-a would end 'later' than rank 11."""
    a = synth.save(tmp_path / "a", host="node-a", ranks=8, slots=16, file_bytes=64 * 4096,
                   mono_start_ns=900_000 * S, realtime_start_ns=synth.START_NS)
    b = synth.save(tmp_path / "b", host="node-b", ranks=8, first_rank=8, world_size=16, slots=16,
                   file_bytes=64 * 4096, slow_rank=(11, 4), mono_start_ns=100 * S,
                   realtime_start_ns=synth.START_NS + 50_000_000)
    everyone = a["ranks"] + b["ranks"]
    raw_end = {r["rank"]: r["end"] - m["utc_offset_ns"] for m in (a, b) for r in m["ranks"]}
    assert max(raw_end, key=raw_end.get) < 8                     # the naive answer: a rank of node-a
    assert min(raw_end.values()) < raw_end[11] < max(raw_end.values())

    result = analyze(job_of(a, b), "0")
    assert [(r["rank"], r["host"]) for r in result["ranks"]] == (
        [(i, "node-a") for i in range(8)] + [(i, "node-b") for i in range(8, 16)])
    assert result["verdict"] == "straggler_rank"
    [f] = [f for f in result["findings"] if f["kind"] == "straggler_rank"]
    assert f["ranks"] == [11]
    [s] = f["evidence"]["stragglers"]
    assert (s["rank"], s["host"], s["pids"]) == (11, "node-b", [1011])
    t0 = min(r["start"] for r in everyone)
    assert s["end_s"] == pytest.approx((b["ranks"][3]["end"] - t0) / S, abs=0.002)
    normal = sorted((r["end"] - t0) / S for r in everyone)[8]
    assert f["evidence"]["median_end_s"] == pytest.approx(normal, abs=0.06)
    assert result["window"]["start"] == datetime.fromtimestamp(synth.START_NS / S + 1, timezone.utc).isoformat(
        timespec="milliseconds")
    assert [(t["host"], t["server"]) for t in result["transports"]] == [("node-a", "10.0.0.1:2049"),
                                                                       ("node-b", "10.0.0.1:2049")]


# ---- --since / --until / --rank ---------------------------------------------------------------

@pytest.fixture(scope="module")
def long_storm(tmp_path_factory):
    """8 ranks x 256 4 KiB O_SYNC writes through 4 slots at 20 ms: 200 WRITEs/s for ~10 s."""
    return synth.save(tmp_path_factory.mktemp("long") / "cap", **{**STORM, "file_bytes": 256 * 4096})


def analyze_cli(*args):
    res = run_slotscope("analyze", "--json", *args)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def iso(ns):
    return datetime.fromtimestamp(ns // S, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_since_until_narrow_the_window(long_storm):
    man = long_storm
    full = analyze_cli(man["path"])
    since, until = man["start_utc_ns"] + 4 * S, man["start_utc_ns"] + 7 * S
    part = analyze_cli("--since", "4", "--until", "7", man["path"])
    w = part["window"]
    start = datetime.fromisoformat(w["start"]).timestamp() * S
    end = datetime.fromisoformat(w["end"]).timestamp() * S
    slowest = 0.1 * S                                    # a write() here takes ~80 ms
    assert since - slowest <= start <= since and until <= end <= until + slowest
    assert w["seconds"] == pytest.approx(3, abs=0.2) and full["window"]["seconds"] > 9
    # WRITEs overlapping the window: 4 slots / 20 ms = 200 per second
    assert part["rpc"]["by_proc"]["WRITE"]["count"] == pytest.approx(600, abs=20)
    assert full["rpc"]["by_proc"]["WRITE"]["count"] == 8 * 256
    assert sum(r["bytes_written"] for r in part["ranks"]) == pytest.approx(600 * 4096, rel=0.05)
    assert part["verdict"] == "slot_saturation"
    # the same window in ISO 8601 UTC
    assert analyze_cli("--since", iso(since), "--until", iso(until), man["path"]) == part
    assert analyze_cli("--since", iso(since).rstrip("Z"), "--until", "7s", man["path"]) == part
    # only one bound
    tail = analyze_cli("--since", "9", man["path"])
    assert datetime.fromisoformat(tail["window"]["start"]).timestamp() * S >= since + 5 * S - slowest
    assert tail["window"]["end"] == full["window"]["end"]
    head = analyze_cli("--until", "2", man["path"])
    assert head["window"]["start"] == full["window"]["start"]
    assert head["rpc"]["by_proc"]["WRITE"]["count"] < 220


@pytest.mark.parametrize("bad", ["yesterday", "2023-13-45T00:00:00Z"])
def test_bad_since_is_a_one_line_error(long_storm, bad):
    assert_one_line_error(run_slotscope("analyze", "--since", bad, long_storm["path"]), "bad time")


def test_rank_filter(long_storm):
    result = analyze_cli("--rank", "2", "--rank", "5", long_storm["path"])
    assert [r["rank"] for r in result["ranks"]] == [2, 5]
    assert result["findings"] and all(not f["ranks"] or {2, 5} & set(f["ranks"]) for f in result["findings"])
    assert result["verdict"] == "slot_saturation"
    # a rank the capture does not hold is an error since issue 19 point 2 (it was an empty, healthy analysis)
    assert_one_line_error(run_slotscope("analyze", "--json", "--rank", "99", long_storm["path"]), "no rank 99")


# ---- the JSON contract and the terminal report --------------------------------------------------

SCENARIOS = {
    "saturation": dict(STORM),
    "freeze": dict(ranks=8, slots=16, file_bytes=64 * 4096, freeze=(1.0, 26.0), timeo_ds=20, retrans=1),
    "hung": dict(ranks=8, slots=16, hung_rank=3, lost_events=12),
    "flush": dict(ranks=8, mode="fsync", write_bytes=1 << 20, file_bytes=16 << 20, slots=65536, rtt_ms=1,
                  commit_ms=1500, link_bps=None),
    "metadata": dict(ranks=4, metadata_ops_per_rank=300, mode="buffered", write_bytes=1 << 20,
                     file_bytes=4 << 20, slots=65536, rtt_ms=2, netdev=False),
    "healthy": dict(ranks=8, mode="buffered", write_bytes=1 << 20, file_bytes=16 << 20, slots=65536, rtt_ms=0.5),
}
VERDICTS = {"slot_saturation", "server_unresponsive", "flush_commit_stall", "small_sync_writes", "metadata_storm",
            "straggler_rank", "hung_tasks", "healthy", None}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(request, tmp_path_factory):
    man = synth.save(tmp_path_factory.mktemp(request.param) / "cap", **SCENARIOS[request.param])
    return request.param, man, analyze(job_of(man), "0")


def check_contract(result):
    assert {"slotscope_version", "schema", "captures", "verdict", "findings", "ranks", "transports",
            "rpc"} <= set(result)
    assert isinstance(result["slotscope_version"], str) and result["schema"] == 1
    assert result["verdict"] in VERDICTS
    for c in result["captures"]:
        assert {"path", "host", "kernel", "start", "end", "lost_events"} <= set(c)
        assert isinstance(c["lost_events"], int)
    for f in result["findings"]:
        assert {"kind", "severity", "summary", "start", "end", "evidence", "ranks", "syscalls", "servers",
                "fix"} <= set(f)
        assert f["kind"] in VERDICTS and f["severity"] in ("critical", "warning", "info")
        assert isinstance(f["evidence"], dict) and all(isinstance(r, int) for r in f["ranks"])
        assert all(isinstance(s, str) for s in f["syscalls"] + f["servers"]) and f["fix"] and f["summary"]
    for r in result["ranks"]:
        assert {"rank", "host", "pids", "comm", "bytes_written", "write_rpcs", "syscalls", "blocked_ns",
                "slot_wait_ns"} <= set(r)
        for s in r["syscalls"].values():
            assert set(s) == {"count", "total_ns", "max_ns"}
    for t in result["transports"]:
        assert {"server", "max_slots", "peak_in_use", "saturated_fraction", "backlog_peak", "link"} <= set(t)
        assert t["link"] is None or {"iface", "speed_bps", "peak_util"} <= set(t["link"])
    for p in result["rpc"]["by_proc"].values():
        if p["count"]:
            assert {"count", "bytes", "backlog_ns", "rtt_ns", "execute_ns", "p50_ns", "p99_ns"} <= set(p)


def test_json_is_plain_and_follows_the_contract(scenario):
    name, _, result = scenario
    assert json.loads(json.dumps(result)) == result
    check_contract(result)
    assert result["verdict"] == {"saturation": "slot_saturation", "freeze": "server_unresponsive",
                                 "hung": "server_unresponsive", "flush": "flush_commit_stall",
                                 "metadata": "metadata_storm", "healthy": "healthy"}[name]


def test_cli_json_is_the_analysis(scenario):
    _, man, result = scenario
    out = analyze_cli(man["path"])
    check_contract(out)
    assert out == {**result, "slotscope_version": out["slotscope_version"]}


def test_report_fits_100_columns(scenario):
    _, man, result = scenario
    text = render_text(result)
    wide = [line for line in text.splitlines() if len(line) > WIDTH and not line.startswith("problem:")]
    assert wide == []
    assert text.splitlines()[0].startswith(f"verdict: {result['verdict']}")


def test_report_of_many_hosts_and_a_damaged_capture_fits_100_columns(tmp_path):
    caps = [synth.save(tmp_path / f"very-long-directory-name-of-a-capture-{i}", host=f"gpu-node-{i:04d}.cluster",
                       **{**STORM, "first_rank": 8 * i, "world_size": 24}, lost_events=10**9 * i)
            for i in range(3)]
    seg = Path(caps[1]["path"]) / "syscall" / "000001.arrow"
    seg.write_bytes(seg.read_bytes()[:-200])                       # lost its footer
    res = run_slotscope("analyze", *[c["path"] for c in caps])
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any(line.startswith("problem:") for line in lines)
    assert [line for line in lines if len(line) > WIDTH and not line.startswith("problem:")] == []
