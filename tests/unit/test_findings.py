"""Each cause the analyzer names, on a synthetic save that has it (tests/synth.py): the verdict,
the severity, the ranks, and the evidence numbers against what the model implies, computed
from the save's manifest rather than from the capture."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from unit_helpers import assert_one_line_error, run_slotscope

from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job, iso_utc
from slotscope.analyzer.thresholds import Thresholds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

pytestmark = pytest.mark.unit

S = 1_000_000_000
SERIOUS = ("critical", "warning")


def run(tmp_path, name="cap", thresholds=None, **model):
    man = synth.save(tmp_path / name, **model)
    return man, analyze(Job.open([man["path"]]), "0", thresholds)


def finding(result, kind):
    [f] = [f for f in result["findings"] if f["kind"] == kind]
    return f


def kinds(result, severities=SERIOUS):
    return {f["kind"] for f in result["findings"] if f["severity"] in severities}


def covered(intervals, k, t0, t1):
    """How long, within [t0, t1], at least k of the intervals overlap (ns)."""
    edges = sorted([(max(a, t0), 1) for a, b in intervals] + [(min(b, t1), -1) for a, b in intervals])
    total = level = 0
    prev = t0
    for t, step in edges:
        if level >= k:
            total += t - prev
        level += step
        prev = t
    return total


# ---- slot_saturation ------------------------------------------------------------------------

# 16 ranks of 4 KiB O_SYNC writes over 4 slots at 20 ms: the 2-slot storm of the shipped sample,
# with ranks arriving 25 ms apart (so the table is not full for the whole save).
STORM = dict(ranks=16, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096, stagger_ms=25)


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    return run(tmp_path_factory.mktemp("storm"), **STORM)


def expected_storm(man):
    """What the model implies: the table is full while at least `slots` ranks are saving
    (each holds or waits for one slot all along); a WRITE holds its slot one RTT, so the
    rest of the time the ranks spent in write() was slot wait."""
    t0, t1 = man["save_utc_ns"]
    busy = [(r["start"], r["end"]) for r in man["ranks"]]
    writes = sum(r["bytes"] // man["write_bytes"] for r in man["ranks"])
    in_write = sum(r["write_end"] - r["write_start"] for r in man["ranks"])
    return {"saturated_fraction": covered(busy, man["slots"], t0, t1) / (t1 - t0),
            "slot_wait_share": 1 - writes * man["rtt_ns"] / in_write,
            "ceiling_Bps": man["slots"] * man["write_bytes"] / (man["rtt_ns"] / S),
            "throughput_Bps": sum(r["bytes"] for r in man["ranks"]) / ((t1 - t0) / S)}


def test_slot_saturation_names_the_storm_with_the_bandwidth_paradox(storm):
    man, result = storm
    want = expected_storm(man)
    assert result["verdict"] == "slot_saturation"
    f = finding(result, "slot_saturation")
    ev = f["evidence"]
    assert f["severity"] == "critical"                        # full over half the save
    assert f["ranks"] == list(range(16))
    assert f["servers"] == ["10.0.0.1:2049"] and "write" in f["syscalls"]
    assert ev["max_slots"] == ev["peak_in_use"] == 4
    assert ev["backlog_peak"] == 16 - 4
    assert ev["write_rpcs"] == 16 * 64 and ev["mean_write_bytes"] == 4096
    assert ev["saturated_fraction"] == pytest.approx(want["saturated_fraction"], abs=0.02)
    assert want["saturated_fraction"] < 0.99                 # not trivially 100%: see the override test
    assert ev["slot_wait_share"] == pytest.approx(want["slot_wait_share"], abs=0.03)
    assert ev["slot_wait_share"] == pytest.approx(1 - 4 / 16, abs=0.05)     # closed loop: 1 - slots/ranks
    # Little's law: slots x WRITE size / RTT, and the save ran at it
    assert ev["littles_law_ceiling_Bps"] == pytest.approx(want["ceiling_Bps"], rel=0.10)
    assert ev["throughput_Bps"] == pytest.approx(want["throughput_Bps"], rel=0.01)
    assert ev["throughput_vs_ceiling"] > 0.9
    assert ev["mean_rtt_ms"] == pytest.approx(20.0, rel=0.01)
    # ... while the 10 Gb/s link idled
    assert ev["link_speed_bps"] == 10e9 and ev["link_mean_util"] < 0.01
    assert "Bandwidth paradox" in f["summary"] and "of 10.0 Gb/s" in f["summary"]
    assert "tcp_max_slot_table_entries, now 4" in f["fix"]
    [t] = result["transports"]
    assert t["saturated_fraction"] == pytest.approx(ev["saturated_fraction"], abs=1e-3)


def test_saturation_with_unknown_link_speed_still_fires(tmp_path, storm):
    man, result = run(tmp_path, **STORM, link_bps=None)
    f = finding(result, "slot_saturation")
    ev = f["evidence"]
    assert result["verdict"] == "slot_saturation" and f["severity"] == "critical"
    assert ev["link_iface"] == "eth0"
    assert ev["link_speed_bps"] is None and ev["link_mean_util"] is None and ev["link_peak_util"] is None
    assert "speed unknown" in f["summary"]
    # what went out: every request's bytes (payload + header) over the save
    t0, t1 = man["save_utc_ns"]
    sent = sum(man["rpcs"].values()) * synth.HEADER + sum(r["bytes"] for r in man["ranks"])
    assert ev["link_mean_tx_bps"] == pytest.approx(sent * 8 / ((t1 - t0) / S), rel=0.15)
    # the rest of the evidence does not depend on the link
    known = finding(storm[1], "slot_saturation")["evidence"]
    for key in ("saturated_fraction", "slot_wait_share", "littles_law_ceiling_Bps", "backlog_peak"):
        assert ev[key] == known[key]


def test_saturation_without_netdev_rows(tmp_path):
    _, result = run(tmp_path, **STORM, netdev=False)
    f = finding(result, "slot_saturation")
    assert f["severity"] == "critical"
    assert all(f["evidence"][k] is None for k in ("link_iface", "link_speed_bps", "link_mean_util",
                                                   "link_mean_tx_bps"))
    assert "Bandwidth paradox" in f["summary"] and "link" not in f["summary"]
    assert result["transports"][0]["link"] is None


def test_saturated_share_threshold_override_removes_it(storm):
    man, result = storm
    frac = finding(result, "slot_saturation")["evidence"]["saturated_fraction"]
    assert frac < 0.99
    job = Job.open([man["path"]])
    quiet = analyze(job, "0", Thresholds().override(["saturated_share=0.99"]))
    assert "slot_saturation" not in kinds(quiet, SERIOUS + ("info",))
    assert quiet["verdict"] == "small_sync_writes"
    assert quiet["thresholds"]["saturated_share"] == 0.99
    # between the warning and the critical share: a warning
    warn = analyze(job, "0", Thresholds().override([f"saturated_share={frac - 0.1:.3f}",
                                                     f"saturated_share_critical={frac + 0.005:.3f}"]))
    assert finding(warn, "slot_saturation")["severity"] == "warning"
    # slot wait below its threshold: not saturation either
    share = finding(result, "slot_saturation")["evidence"]["slot_wait_share"]
    assert "slot_saturation" not in kinds(analyze(job, "0", Thresholds().override(
        [f"slot_wait_share={share + 0.05:.3f}"])))


def test_threshold_override_on_the_command_line(storm):
    man, _ = storm
    res = run_slotscope("analyze", "--json", "--threshold", "saturated_share=0.99", man["path"])
    assert res.returncode == 0, res.stderr
    assert "slot_saturation" not in {f["kind"] for f in json.loads(res.stdout)["findings"]}


@pytest.mark.parametrize("arg,phrase", [("bogus=1", "unknown threshold 'bogus=1'"),
                                        ("saturated_share", "unknown threshold"),
                                        ("saturated_share=lots", "wants a number")])
def test_bad_threshold_is_a_one_line_error(storm, arg, phrase):
    man, _ = storm
    assert_one_line_error(run_slotscope("analyze", "--threshold", arg, man["path"]), phrase)


# ---- server_unresponsive ----------------------------------------------------------------------

# The VM rig's freeze: 25 s without replies, timeo=2 s and retrans=1, so the client logs.
FREEZE = dict(ranks=8, slots=16, rtt_ms=20.0, file_bytes=64 * 4096, freeze=(1.0, 26.0), timeo_ds=20, retrans=1)


def test_server_freeze_is_server_unresponsive(tmp_path):
    man, result = run(tmp_path, **FREEZE)
    assert result["verdict"] == "server_unresponsive"
    f = finding(result, "server_unresponsive")
    ev = f["evidence"]
    rtt = man["rtt_ns"] / S
    f0, f1 = man["freeze_utc_ns"]
    assert f["severity"] == "critical"
    assert f["servers"] == ["10.0.0.1:2049"]
    assert f["ranks"] == list(range(8))
    # no reply from the last one before the freeze (up to an RTT earlier: the ranks' WRITEs go out
    # in step) to the first one after it (an RTT after it ends)
    assert ev["longest_silence_s"] == pytest.approx((f1 - f0) / S + rtt, abs=rtt + 0.002)
    [quiet] = ev["silences"]
    assert quiet["rpcs_waiting"] == 8                          # one WRITE per rank, all in flight
    # every RPC in flight waits out the freeze, timing out every timeo (2 s)
    per_rpc = (f1 - f0) / S / 2
    assert 8 * int(per_rpc - 1) <= ev["timeouts"] <= 8 * int(per_rpc + 1)
    assert ev["retransmits"] == ev["timeouts"] == man["timeouts"]
    assert ev["outstanding_at_stop"] == 0
    # the kernel said so, at the first major timeout (2 x timeo after a request), and then OK
    assert (ev["kernel_not_responding"], ev["kernel_ok"]) == (1, 1)
    [(t_down, down), (t_ok, ok)] = man["kmsg"]
    assert "not responding" in down and ok.endswith("OK")
    assert f0 + 4 * S - rtt * S <= t_down <= f0 + 4 * S
    assert ev["first_not_responding"] == iso_utc(t_down)
    assert f1 < t_ok <= f1 + 2 * rtt * S
    assert "(this mount: timeo=20 ds, retrans=1" in f["fix"]
    assert "hung_tasks" not in kinds(result)                   # 25 s is under hung_s (30 s)


# ---- flush_commit_stall -------------------------------------------------------------------------

# Large buffered writes, no slot limit, a fast link: only the server's COMMIT is slow (3 s).
FLUSH = dict(ranks=8, write_bytes=1 << 20, file_bytes=64 << 20, slots=65536, rtt_ms=1.0, commit_ms=3000)


@pytest.mark.parametrize("mode,call", [("fsync", "fsync"), ("buffered", "close")])
def test_slow_commit_is_a_flush_commit_stall(tmp_path, mode, call):
    man, result = run(tmp_path, mode=mode, **FLUSH)
    assert result["verdict"] == "flush_commit_stall"
    f = finding(result, "flush_commit_stall")
    ev = f["evidence"]
    assert f["severity"] == "warning"
    assert f["ranks"] == list(range(8))
    assert f["syscalls"] == (["close"] if mode == "buffered" else ["close", "fsync"])
    # the flush: every rank's dirty data over the 10 Gb/s wire, then a 3 s COMMIT
    wire_s = sum(r["bytes"] for r in man["ranks"]) * 8 / 10e9
    assert ev["median_flush_s"] == pytest.approx(3.0 + wire_s, rel=0.05)
    assert ev["median_flush_share"] > 0.95
    assert ev["link_mean_util"] < 0.5
    assert ev["calls"][call]["count"] == 8
    assert ev["commit_rpcs"] == 8
    assert ev["commit_mean_rtt_ms"] == pytest.approx(3000, rel=0.01)
    assert 3000 <= ev["commit_mean_ms"] <= 3000 + 1000 * wire_s + 5
    assert ev["median_bytes_per_rank"] == 64 << 20
    assert "stable storage is slow" in f["fix"]
    if mode == "fsync":
        assert ev["bytes_per_fsync"] == 64 << 20
    # the flusher's WRITEs are charged to the rank that wrote the file (by its inode)
    assert [r["write_rpcs"] for r in result["ranks"]] == [64] * 8
    assert [r["write_rpc_bytes"] for r in result["ranks"]] == [64 << 20] * 8


def test_commit_waiting_for_a_slot_does_not_blame_the_servers_storage(tmp_path):
    """A buffered flush through 4 slots: COMMITs wait behind the WRITEs for a slot (seconds of
    execute) but the server answers each in one RTT; the fix must not call its storage slow."""
    _, result = run(tmp_path, mode="buffered", ranks=8, write_bytes=1 << 20, file_bytes=64 << 20, slots=4)
    assert result["verdict"] == "slot_saturation"
    ev = finding(result, "flush_commit_stall")["evidence"]
    assert ev["commit_mean_ms"] > 500
    assert ev["commit_mean_rtt_ms"] == pytest.approx(20, rel=0.05)
    assert "storage" not in finding(result, "flush_commit_stall")["fix"]


# ---- small_sync_writes ----------------------------------------------------------------------

def test_small_sync_writes_without_a_slot_limit(tmp_path):
    man, result = run(tmp_path, ranks=8, slots=65536, rtt_ms=1.0, write_bytes=4096, file_bytes=128 * 4096)
    assert result["verdict"] == "small_sync_writes"
    assert kinds(result) == {"small_sync_writes"}
    f = finding(result, "small_sync_writes")
    ev = f["evidence"]
    assert f["severity"] == "warning" and f["ranks"] == list(range(8)) and f["syscalls"] == ["write"]
    assert ev["small_sync_rpcs"] == ev["write_rpcs"] == 8 * 128
    assert ev["share"] == 1.0 and ev["mean_write_bytes"] == 4096
    assert ev["stable"] == {"FILE_SYNC": 8 * 128}
    assert ev["size_histogram"] == {"4.0 KiB": 8 * 128}
    assert (ev["ranks_affected"], ev["ranks"]) == (8, 8)
    assert sorted(p["rank"] for p in ev["per_rank"]) == list(range(8))


def test_large_stable_writes_are_not_small(tmp_path):
    _, result = run(tmp_path, ranks=8, slots=65536, rtt_ms=1.0, write_bytes=64 << 10, file_bytes=4 << 20)
    assert "small_sync_writes" not in kinds(result, SERIOUS + ("info",))


# ---- metadata_storm -------------------------------------------------------------------------

def test_metadata_storm(tmp_path):
    man, result = run(tmp_path, ranks=8, metadata_ops_per_rank=400, mode="buffered", write_bytes=1 << 20,
                      file_bytes=8 << 20, slots=65536, rtt_ms=2.0)
    assert result["verdict"] == "metadata_storm"
    f = finding(result, "metadata_storm")
    ev = f["evidence"]
    assert f["severity"] == "warning"
    assert ev["source"] == "syscalls"
    assert ev["metadata_rpcs"] == {"LOOKUP": 1600, "GETATTR": 1600, "CREATE": 8}
    assert sum(ev["by_op"].values()) == ev["metadata_ops"] == 8 * 401     # 400 stats and an open per rank
    assert ev["metadata_s"] == pytest.approx(8 * 401 * man["rtt_ns"] / S, rel=0.1)
    assert ev["share_of_time"] >= 0.5
    assert set(f["syscalls"]) == {"newfstatat", "openat"}
    assert f["ranks"] == list(range(8))


# ---- straggler_rank ---------------------------------------------------------------------------

def test_straggler_rank(tmp_path):
    man, result = run(tmp_path, ranks=8, slots=16, rtt_ms=20.0, file_bytes=128 * 4096, slow_rank=(5, 4))
    assert result["verdict"] == "straggler_rank"
    f = finding(result, "straggler_rank")
    ev = f["evidence"]
    t0 = min(r["start"] for r in man["ranks"])
    ends = {r["rank"]: (r["end"] - t0) / S for r in man["ranks"]}
    assert f["severity"] == "warning" and f["ranks"] == [5]
    assert ev["median_end_s"] == pytest.approx(statistics.median(ends.values()), abs=0.002)
    assert ev["save_s"] == pytest.approx(ends[5], abs=0.002)
    assert ends[5] / statistics.median(ends.values()) == pytest.approx(4, rel=0.05)
    [s] = ev["stragglers"]
    assert (s["rank"], s["pids"], s["bytes_written"]) == (5, [1005], 4 * 128 * 4096)
    assert ev["critical_path"]["rank"] == 5 and "write" in ev["critical_path"]["blocked_in"]
    assert "4.0x the median" in ev["why"] and "balance the checkpoint shards" in f["fix"]


@pytest.mark.parametrize("ranks", [1, 2])
def test_no_straggler_among_fewer_than_three_ranks(tmp_path, ranks):
    _, result = run(tmp_path, ranks=ranks, slots=16, file_bytes=32 * 4096, slow_rank=(ranks - 1, 10))
    assert "straggler_rank" not in kinds(result, SERIOUS + ("info",))


# ---- hung_tasks ------------------------------------------------------------------------------

def test_rank_hung_on_an_rpc_while_the_server_answers_the_others(tmp_path):
    """Rank 1's last WRITE is never answered; it is killed after 40 s; the other ranks keep
    writing (and getting replies) throughout, so the server was not silent."""
    man, result = run(tmp_path, ranks=4, slots=16, rtt_ms=20.0, file_bytes=2250 * 4096, hung_rank=1,
                      slow_rank=(1, 0.05), hung_s=40)
    assert result["verdict"] == "hung_tasks"
    assert "server_unresponsive" not in kinds(result)
    f = finding(result, "hung_tasks")
    ev = f["evidence"]
    hung = man["ranks"][1]
    assert f["severity"] == "critical" and f["ranks"] == [1]
    assert ev["rpcs_never_completed"] == man["outstanding"] == 1
    assert ev["rpc_procs"] == {"WRITE": 1}
    # outstanding since the hung write() sent it (15 us into the call) until the stop
    assert ev["oldest_rpc_s"] == pytest.approx((man["stop_utc_ns"] - hung["end"]) / S + 40, abs=0.01)
    [b] = ev["blocked_syscalls"]
    assert (b["rank"], b["pid"], b["syscall"], b["seconds"]) == (1, 1001, "write", 40.0)
    assert f["syscalls"] == ["write"] and f["servers"] == ["10.0.0.1:2049"]


def test_rank_still_hung_when_recording_stops(tmp_path):
    """Recording stops while rank 1's write() still waits: no syscall row, only the agent's
    snapshots of calls in progress show it."""
    man, result = run(tmp_path, ranks=4, slots=16, rtt_ms=20.0, file_bytes=2250 * 4096, hung_rank=1,
                      slow_rank=(1, 0.05), hung_s=40, hung_returns=False)
    assert result["verdict"] == "hung_tasks"
    f = finding(result, "hung_tasks")
    since = man["ranks"][1]["blocked_since"]
    assert f["ranks"] == [1]
    [b] = f["evidence"]["blocked_syscalls"]
    assert (b["rank"], b["syscall"], b["still_blocked"]) == (1, "write", True)
    assert b["seconds"] == pytest.approx((man["stop_utc_ns"] - since) / S, abs=0.001)
    assert "1 still blocked when recording stopped" in f["summary"]
    assert result["ranks"][1]["syscalls"]["write"]["count"] == man["ranks"][1]["bytes"] // 4096


def test_rank_hung_in_close_is_named_by_the_silence(tmp_path):
    """Buffered: rank 2's COMMIT is never answered and its close() is still blocked at the stop,
    after every other rank finished. The silence names rank 2 (from the snapshots)."""
    man, result = run(tmp_path, ranks=8, mode="buffered", write_bytes=1 << 20, file_bytes=8 << 20,
                      slots=65536, rtt_ms=1.0, hung_rank=2, hung_returns=False)
    assert result["verdict"] == "server_unresponsive"
    quiet = finding(result, "server_unresponsive")
    assert 2 in quiet["ranks"]
    assert quiet["evidence"]["outstanding_at_stop"] == 1
    hung = finding(result, "hung_tasks")
    assert hung["ranks"] == [2] and hung["evidence"]["rpc_procs"] == {"COMMIT": 1}
    [b] = hung["evidence"]["blocked_syscalls"]
    assert (b["syscall"], b["still_blocked"]) == ("close", True)


def test_rank_hung_when_nothing_else_is_in_flight(tmp_path):
    """The same hang after the others finished: for 60 s the server answers nothing while the
    RPC waits, so it is also server_unresponsive, which the verdict names first (CAUSES order)."""
    man, result = run(tmp_path, ranks=8, slots=16, hung_rank=3)
    assert result["verdict"] == "server_unresponsive"
    hung = finding(result, "hung_tasks")
    assert hung["severity"] == "critical" and hung["ranks"] == [3]
    assert hung["evidence"]["rpcs_never_completed"] == 1
    quiet = finding(result, "server_unresponsive")
    assert quiet["severity"] == "critical"
    assert quiet["evidence"]["outstanding_at_stop"] == 1
    assert quiet["evidence"]["silences"][0]["rpcs_waiting"] == 1
    assert quiet["evidence"]["longest_silence_s"] == pytest.approx(61, abs=0.1)
    assert 3 in quiet["ranks"]
    # ... and rank 3 is the straggler the save waited for
    assert finding(result, "straggler_rank")["ranks"] == [3]


# ---- healthy --------------------------------------------------------------------------------

@pytest.mark.parametrize("file_bytes", [64 << 20, 1 << 30])
def test_healthy_save(tmp_path, file_bytes):
    """Buffered 1 MiB writes, no slot limit, 0.5 ms RTT: 64 MiB per rank flushes in well under a
    second; 1 GiB per rank takes 7 s but keeps the 10 Gb/s link over 90% busy."""
    _, result = run(tmp_path, ranks=8, mode="buffered", write_bytes=1 << 20, file_bytes=file_bytes,
                    slots=65536, rtt_ms=0.5)
    assert result["verdict"] == "healthy"
    assert kinds(result) == set()
    [t] = result["transports"]
    assert t["saturated_fraction"] == 0 and t["backlog_peak"] == 0
    if file_bytes == 1 << 30:
        assert t["link"]["mean_util"] > 0.9


def test_flush_with_unknown_link_speed_is_only_info(tmp_path):
    """Without the link's capacity a link-bound flush looks like a stall: the finding says so at
    severity info, and the verdict stays healthy. The same save with the speed known is a busy link."""
    _, result = run(tmp_path, ranks=8, mode="buffered", write_bytes=1 << 20, file_bytes=1 << 30,
                    slots=65536, rtt_ms=0.5, link_bps=None)
    assert result["verdict"] == "healthy"
    [flush] = [f for f in result["findings"] if f["kind"] == "flush_commit_stall"]
    assert flush["severity"] == "info" and "capacity is unknown" in flush["summary"]


def test_metadata_storm_before_a_buffered_flush(tmp_path):
    """100 stat() round trips per rank are 78% of every rank's save: a metadata storm, although the
    flush's 64 WRITEs, queued together on the wire, add up to more RPC execute time than the
    800 LOOKUP/GETATTRs (metadata is weighed by the time ranks wait in syscalls)."""
    _, result = run(tmp_path, ranks=8, metadata_ops_per_rank=100, mode="buffered", write_bytes=1 << 20,
                    file_bytes=8 << 20, slots=65536, rtt_ms=2.0)
    r = result["ranks"][0]
    in_metadata = sum(s["total_ns"] for n, s in r["syscalls"].items() if n in ("newfstatat", "openat"))
    assert in_metadata / (r["save_s"] * S) > 0.7
    assert result["verdict"] == "metadata_storm"
    [storm] = [f for f in result["findings"] if f["kind"] == "metadata_storm"]
    assert storm["evidence"]["source"] == "syscalls" and storm["evidence"]["share_of_time"] > 0.7
    assert set(storm["evidence"]["metadata_rpcs"]) >= {"LOOKUP", "GETATTR"}


# ---- kernel log only --------------------------------------------------------------------------

NOT_RESPONDING = """\
[ 4200.000100] nfs: server 10.0.0.7 not responding, still trying
[ 4201.000100] nfs: server 10.0.0.7 not responding, still trying
"""
HUNG = """\
[ 4321.123456] INFO: task python:4321 blocked for more than 120 seconds.
[ 4321.123470]       Not tainted 6.1.0-18-amd64 #1 Debian 6.1.76-1
[ 4321.123475] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[ 4321.123480] task:python          state:D stack:0     pid:4321  ppid:4300   flags:0x00004002
[ 4321.123484] Call Trace:
[ 4321.123486]  <TASK>
[ 4321.123490]  __schedule+0x34d/0x9e0
[ 4321.123495]  schedule+0x5a/0xd0
[ 4321.123498]  rpc_wait_bit_killable+0x11/0x70 [sunrpc]
[ 4321.123500]  __rpc_execute+0x119/0x330 [sunrpc]
[ 4321.123503]  nfs_file_fsync+0x77/0x1d0 [nfs]
[ 4321.123506]  do_fsync+0x38/0x70
[ 4321.123509]  </TASK>
"""


def analyze_log(tmp_path, text):
    log = tmp_path / "dmesg.txt"
    log.write_text(text)
    res = run_slotscope("analyze", "--json", "--kernel-log", str(log))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def test_kernel_log_alone_not_responding(tmp_path):
    result = analyze_log(tmp_path, NOT_RESPONDING)
    assert result["verdict"] == "server_unresponsive"
    f = finding(result, "server_unresponsive")
    assert f["severity"] == "critical" and f["servers"] == ["10.0.0.7"]
    assert f["evidence"]["kernel_not_responding"] == 2
    assert result["captures"] == [] and result["ranks"] == []


def test_kernel_log_alone_hung_task_in_nfs(tmp_path):
    result = analyze_log(tmp_path, HUNG)
    assert result["verdict"] == "hung_tasks"
    f = finding(result, "hung_tasks")
    assert f["severity"] == "critical"
    assert f["evidence"]["kernel_hung_in_nfs"] == 1
    [task] = f["evidence"]["kernel_hung_tasks"]
    assert (task["task"], task["pid"], task["blocked_s"]) == ("python", 4321, 120)
    assert "nfs_file_fsync" in task["functions"]


# ---- causes before symptoms (findings.EXPLAINS) ---------------------------------------------

def _f(kind, severity, start, end, ranks=(), servers=("10.0.0.1:2049",), ev=None):
    from slotscope.analyzer.findings import Finding
    return Finding(kind, severity, kind, start * S, end * S, ev or {}, "fix", list(ranks), [], list(servers))


@pytest.mark.parametrize("symptom, cause", [
    (_f("straggler_rank", "warning", 0, 10, ranks=[1]),
     _f("small_sync_writes", "info", 0, 10, ranks=[1], ev={"ranks_affected": 1, "ranks": 4})),
    (_f("flush_commit_stall", "warning", 2, 8, ranks=[0, 1]), _f("slot_saturation", "warning", 0, 10, ranks=[0, 1])),
    (_f("slot_saturation", "critical", 0, 10), _f("server_unresponsive", "warning", 3, 30)),
    (_f("hung_tasks", "critical", 5, 40), _f("server_unresponsive", "critical", 3, 30)),
])
def test_a_cause_comes_before_its_symptom(symptom, cause):
    from slotscope.analyzer.findings import CAUSES, SEVERITIES, explain, verdict
    before = min(symptom.severity, cause.severity, key=SEVERITIES.index)
    found = [symptom, cause]
    explain(found)
    found.sort(key=lambda f: (f.explained_by is not None, SEVERITIES.index(f.severity), CAUSES.index(f.kind)))
    assert symptom.explained_by == cause.kind and f"(explained by {cause.kind}: " in symptom.summary
    assert cause.explained_by is None and cause.severity == before     # the symptom's severity if higher
    assert verdict(found) == cause.kind and found[0] is cause


@pytest.mark.parametrize("symptom, other", [
    # every rank writes small and synchronous: that does not set the straggler apart
    (_f("straggler_rank", "warning", 0, 10, ranks=[1]),
     _f("small_sync_writes", "warning", 0, 10, ranks=[0, 1, 2, 3], ev={"ranks_affected": 4, "ranks": 4})),
    (_f("flush_commit_stall", "warning", 20, 30), _f("slot_saturation", "warning", 0, 10)),       # apart in time
    (_f("slot_saturation", "critical", 0, 10), _f("server_unresponsive", "warning", 0, 10, servers=["b:2049"])),
])
def test_no_explanation_where_the_cause_does_not_reach_the_symptom(symptom, other):
    from slotscope.analyzer.findings import explain
    explain([symptom, other])
    assert symptom.explained_by is None and "explained by" not in symptom.summary
