"""The analyzer on real captures from the VM rig (slow tier): each cause the rig can produce
gives its verdict and names the right ranks, and a healthy save gives no warning. The
scenarios are the session fixtures of conftest.py (shared with test_nfs_probes.py)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vm

SERIOUS = ("critical", "warning")


def analyze(out, *extra):
    """`slotscope analyze --json` on the scenario's capture, as a user runs it; the terminal
    report must come out too."""
    cmd = [sys.executable, "-m", "slotscope.cli", "analyze", str(out / "capture")]
    res = subprocess.run(cmd + ["--json", *extra], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    text = subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=300)
    assert text.returncode == 0 and text.stdout.startswith("verdict: "), text.stderr
    return json.loads(res.stdout)


def ranks_of(out):
    return sorted(r["rank"] for r in json.loads((out / "scenario.json").read_text())["ranks"])


def finding(result, kind):
    found = [f for f in result["findings"] if f["kind"] == kind]
    assert found, f"no {kind} finding: {[(f['kind'], f['severity']) for f in result['findings']]}"
    return found[0]


def serious(result):
    return {f["kind"] for f in result["findings"] if f["severity"] in SERIOUS}


def test_saturated_slot_table(saturated):
    """NFSv3, 4 transport slots, 8 ranks of 4 KiB O_SYNC writes: slot_saturation, critical, for
    every rank, with the bandwidth paradox in numbers: the table at its limit, throughput at
    the Little's-law ceiling, the 10 Gb/s link nearly idle."""
    result = analyze(saturated)
    assert result["verdict"] == "slot_saturation"
    f = finding(result, "slot_saturation")
    ev = f["evidence"]
    assert f["severity"] == "critical" and f["ranks"] == ranks_of(saturated)
    assert ev["peak_in_use"] == ev["max_slots"] == 4 and ev["backlog_peak"] > 0
    assert ev["saturated_fraction"] > 0.5 and ev["slot_wait_share"] > 0.3
    assert 0.5 < ev["throughput_vs_ceiling"] < 1.2
    assert ev["link_speed_bps"] == 10_000_000_000 and ev["link_mean_util"] < 0.01
    assert "tcp_max_slot_table_entries" in f["fix"] and "nconnect" in f["fix"]
    [t] = result["transports"]
    assert t["saturated_fraction"] == pytest.approx(ev["saturated_fraction"], abs=1e-3) and t["peak_in_use"] == 4


def test_saturated_session_slots(saturated_v42):
    """The same storm on NFSv4.2 with 4 session slots: the session slot table is named as what
    is full, and its fix is the session slot count, not the transport's."""
    result = analyze(saturated_v42)
    assert result["verdict"] == "slot_saturation"
    f = finding(result, "slot_saturation")
    assert f["summary"].startswith("NFSv4.1 session slot table") and f["ranks"] == ranks_of(saturated_v42)
    assert f["evidence"]["session_slots"] == 4 and "max_session_slots" in f["fix"]


def test_server_freeze(frozen):
    """The server drops all traffic for 25 s: server_unresponsive, critical, from the silence
    itself (long before the mount's 'not responding') and the kernel's own lines."""
    result = analyze(frozen)
    assert result["verdict"] == "server_unresponsive"
    f = finding(result, "server_unresponsive")
    ev = f["evidence"]
    assert f["severity"] == "critical" and f["ranks"] == ranks_of(frozen)
    assert 15 < ev["longest_silence_s"] < 45      # 25 s, plus the wait for the next retransmission
    assert ev["kernel_not_responding"] >= 1 and ev["timeouts"] > 0
    assert f["servers"] == ["10.0.0.1:2049"]


def test_flush_stall(flush_stall):
    """1 MiB buffered writes flushed by fsync() over a slow path: the ranks' save is their
    fsync, the link is all but idle against its speed."""
    result = analyze(flush_stall)
    assert result["verdict"] == "flush_commit_stall", serious(result)
    f = finding(result, "flush_commit_stall")
    assert f["ranks"] == ranks_of(flush_stall) and "fsync" in f["syscalls"]
    assert f["evidence"]["median_flush_share"] > 0.5


def test_small_sync_writes(small_sync):
    """4 KiB O_SYNC writes with no slot limit: small synchronous WRITEs from every rank, and no
    slot-table finding (the dynamic table grows)."""
    result = analyze(small_sync)
    assert result["verdict"] == "small_sync_writes", serious(result)
    f = finding(result, "small_sync_writes")
    assert f["ranks"] == ranks_of(small_sync)
    assert f["evidence"]["stable"] == {"FILE_SYNC": f["evidence"]["write_rpcs"]}
    assert "slot_saturation" not in serious(result)


def test_straggler(straggler):
    """Rank 2 writes 16 times what the others do: it is the straggler, and the why says so."""
    result = analyze(straggler)
    assert result["verdict"] == "straggler_rank", serious(result)
    f = finding(result, "straggler_rank")
    assert f["ranks"] == [2]
    assert "16.0x the median" in f["evidence"]["why"]


def test_healthy_save(unconstrained):
    """Large buffered writes, no slot limit, a fast link: no warning or critical finding."""
    result = analyze(unconstrained)
    assert result["verdict"] == "healthy", result["findings"]
    assert not serious(result)
    assert sorted(r["rank"] for r in result["ranks"]) == ranks_of(unconstrained)


def test_a_straggler_is_explained_by_its_small_sync_writes(mixed):
    """Rank 1 writes 4 KiB O_SYNC while the others write 64 KiB and fsync once: it ends ~10x
    later than the median. The cause is named, not the symptom: the verdict is small_sync_writes
    (it was straggler_rank before causes came before symptoms), and the straggler finding says
    what explains it."""
    result = analyze(mixed)
    assert result["verdict"] == "small_sync_writes"
    cause, symptom = finding(result, "small_sync_writes"), finding(result, "straggler_rank")
    assert cause["ranks"] == symptom["ranks"] == [1] and cause["explained_by"] is None
    assert symptom["explained_by"] == "small_sync_writes" and "explained by small_sync_writes" in symptom["summary"]
    assert result["findings"].index(cause) < result["findings"].index(symptom)
