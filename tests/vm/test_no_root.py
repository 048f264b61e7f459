"""An ordinary user's agent in the VM rig (issue 22): on the saturated, frozen-server,
flush-stall and healthy scenarios the agent and the ranks run as uid 1000 (run-scenario
--agent-user), the agent falls back from BPF to sampling /proc and mountstats with one line
saying so, and the analyzer's verdict on its capture is the one it gives on the BPF agent's
capture of the same scenario, with the same ranks named, each rank's bytes and the save's
bytes and duration. The scenarios are conftest.py's session fixtures; the BPF side is the run
test_verdicts.py checks."""
import json
import stat

import pyarrow.compute as pc
import pytest

from slotscope.capture.reader import Capture
from test_verdicts import analyze, finding, ranks_of

pytestmark = pytest.mark.vm
HALF_S_NS = 500_000_000


def on_61(*scenarios):
    """Both sides on the rig's default kernel (the BPF scenarios also run on 6.12 elsewhere)."""
    return pytest.mark.parametrize(scenarios, [("6.1",) * len(scenarios)], indirect=True)


def as_user(out):
    """The sampled run's own checks: who ran it, what the agent said, what it wrote."""
    record = json.loads((out / "scenario.json").read_text())
    assert {r["uid"] for r in record["ranks"]} == {1000}
    log = (out / "agent.log").read_text()
    assert "sampling /proc" in log, log[-2000:]
    meta = json.loads((out / "capture" / "meta.json").read_text())
    assert meta["sampled"]["interval_ns"] == 100_000_000
    assert set(meta["probes"]["attached"]) <= {"netdev", "kmsg"}     # its samplers; no BPF probe group
    assert stat.S_IMODE((out / "capture" / "meta.json").stat().st_mode) == 0o600


def end_rates(out):
    """Each process's bytes a second over its last half second of writes, from a BPF capture:
    what a sampled agent misses of a rank after its last sample is an interval or two of it.
    (Its mean rate over the save is no measure of that where the save stood still: frozen's
    ranks wrote 24 KiB after their last sample on the instruction clock: two intervals are 3.3 KiB
    at their mean rate, 40 KiB at this.)"""
    sc = Capture.open(str(out / "capture")).read("syscall")
    sc = sc.filter(pc.greater(sc["bytes"], 0))
    rates = {}
    for tgid in set(sc["tgid"].to_pylist()):
        mine = sc.filter(pc.equal(sc["tgid"], tgid))
        recent = mine.filter(pc.greater(mine["ts_exit"], pc.max(mine["ts_exit"]).as_py() - HALF_S_NS))
        rates[tgid] = pc.sum(recent["bytes"]).as_py() / 0.5
    return rates


def same_ranks_and_save(with_bpf, without, bpf_out):
    """The sampled capture's rank table and save (from /proc/PID/io and the samples) against
    the BPF capture's of the same scenario (another run of it): the same ranks; each rank's
    bytes the same but for what it wrote after its last sample, which counts for its parent
    (at most two intervals' worth at the ranks' rate as they ended, or 2%: 8 KiB of 256 KiB
    happened in a saturated run); one save of the same bytes but for those, as long within 10%
    or 0.5 s. The ranks' rate, not the rank's: on the guest's one CPU the ranks end in another
    order from run to run, and the last runs alone at all of it (unconstrained's rank 3 wrote
    1.97 MB after its last sample, 1.68 MB at its own rate in the BPF run)."""
    def writers(result):
        return {r["rank"]: r for r in result["ranks"] if r["bytes_written"] and r["rank"] is not None}
    b, s = writers(with_bpf), writers(without)
    assert sorted(s) == sorted(b), (sorted(s), sorted(b))
    interval_s, rates = without["sampled"]["interval_s"], end_rates(bpf_out)
    rate = {rank: max(rates.get(p, 0) for p in r["pids"]) for rank, r in b.items()}
    unseen = {rank: max(0.02 * r["bytes_written"], 2 * interval_s * sum(rate.values())) for rank, r in b.items()}
    # the save's: each rank's at its own rate, summed (the ranks' rate is shared among them)
    save_unseen = sum(max(0.02 * r["bytes_written"], 2 * interval_s * rate[rank]) for rank, r in b.items())
    for rank, r in s.items():
        assert r["from_samples"] and 0 <= b[rank]["bytes_written"] - r["bytes_written"] <= unseen[rank], (r, b[rank])
    [save], [bpf_save] = without["saves"], with_bpf["saves"]
    assert 0 <= bpf_save["bytes"] - save["bytes"] <= max(0.02 * bpf_save["bytes"], save_unseen), (save, bpf_save)
    assert abs(save["duration_s"] - bpf_save["duration_s"]) <= max(0.5, 0.1 * bpf_save["duration_s"]), (save, bpf_save)


def same_verdict(bpf, sampled, verdict):
    """Both captures' verdict; for a cause, the ranks it names and the sampled finding's
    confidence and what a BPF recording would add; the ranks' bytes and the save."""
    as_user(sampled)
    with_bpf, without = analyze(bpf), analyze(sampled)
    assert with_bpf["verdict"] == without["verdict"] == verdict, (with_bpf["verdict"], without["findings"])
    same_ranks_and_save(with_bpf, without, bpf)
    if verdict == "healthy":
        return without
    f = finding(without, verdict)
    assert f["ranks"] == finding(with_bpf, verdict)["ranks"] == ranks_of(sampled)
    assert f["confidence"] and f["bpf_would_add"]
    return without


@on_61("saturated", "saturated_sampled")
def test_saturated_without_root(saturated, saturated_sampled):
    result = same_verdict(saturated, saturated_sampled, "slot_saturation")
    ev = finding(result, "slot_saturation")["evidence"]
    assert ev["max_slots"] == 4


@on_61("frozen", "frozen_sampled")
def test_frozen_server_without_root(frozen, frozen_sampled):
    same_verdict(frozen, frozen_sampled, "server_unresponsive")


@on_61("flush_stall", "flush_stall_sampled")
def test_flush_stall_without_root(flush_stall, flush_stall_sampled):
    same_verdict(flush_stall, flush_stall_sampled, "flush_commit_stall")


@on_61("unconstrained", "unconstrained_sampled")
def test_healthy_without_root(unconstrained, unconstrained_sampled):
    result = same_verdict(unconstrained, unconstrained_sampled, "healthy")
    # no finding to name them: the ranks are in where the samples found them (a 1 s save, after
    # another scenario in the boot: its ranks were gone before the recorder asked who they were)
    ranks = [w["rank"] for w in result["sampled"]["waits"]]
    assert None not in ranks and sorted(ranks) == ranks_of(unconstrained_sampled), result["sampled"]["waits"]
