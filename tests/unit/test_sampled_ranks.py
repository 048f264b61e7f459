"""A sampled capture's rank table, saves, checklist and TUI (analyzer/sampled_activity.py),
against the BPF capture of the same save: tests/synth.py records one model of a save both
ways (the same ranks, calls and RPCs), so what the samples say is checked against what BPF
traced, not against the samples themselves."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

pytestmark = pytest.mark.unit

INTERVAL_S = 0.1
# rank 2 writes 4x as much through O_SYNC writes: it ends last (a straggler)
STRAGGLER = dict(ranks=4, file_bytes=16 << 20, write_bytes=1 << 20, mode="osync", slots=64, rtt_ms=20,
                 slow_rank=(2, 4))
# rank 3's write never returns: the server stops answering it
HUNG = dict(ranks=4, slots=16, rtt_ms=20.0, file_bytes=64 * 4096, hung_rank=3, hung_s=60, hung_returns=False)
# 16 ranks of 4 KiB O_SYNC writes through 4 slots (test_findings' storm), and one without a limit
STORM = dict(ranks=16, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096, stagger_ms=25)
HEALTHY = dict(ranks=8, mode="buffered", write_bytes=1 << 20, file_bytes=64 << 20, slots=65536, rtt_ms=0.5)


def both(tmp_path, model: dict) -> tuple[dict, dict]:
    """(sampled, BPF) analyses of one model's save."""
    out = []
    for name, every in (("sampled", INTERVAL_S), ("bpf", None)):
        (tmp_path / name).mkdir()
        man = synth.save(tmp_path / name / "cap", sampled_s=every, **model)
        out.append(analyze(Job.open([man["path"]]), "0"))
    return out[0], out[1]


def by_rank(result: dict) -> dict:
    return {r["rank"]: r for r in result["ranks"]}


def test_ranks_bytes_and_times_agree_with_bpf(tmp_path):
    sampled, bpf = both(tmp_path, STRAGGLER)
    s, b = by_rank(sampled), by_rank(bpf)
    assert s.keys() == b.keys() == {0, 1, 2, 3}
    for rank in b:
        assert s[rank]["pids"] == b[rank]["pids"] and s[rank]["from_samples"] and not b[rank]["from_samples"]
        assert s[rank]["bytes_written"] == b[rank]["bytes_written"]      # every write returned before a sample
        assert s[rank]["save_s"] == pytest.approx(b[rank]["save_s"], abs=2 * INTERVAL_S)
        assert s[rank]["write_rpcs"] is None and s[rank]["syscalls"] == {}     # not counted by samples
    assert s[2]["save_s"] > 3 * s[0]["save_s"]


def test_a_straggler_is_named_from_samples_with_its_confidence(tmp_path):
    sampled, bpf = both(tmp_path, STRAGGLER)
    for result in (sampled, bpf):
        [f] = [f for f in result["findings"] if f["kind"] == "straggler_rank"]
        assert f["ranks"] == [2]
    [f] = [f for f in sampled["findings"] if f["kind"] == "straggler_rank"]
    assert f["confidence"].startswith("medium") and "each call the late rank made" in f["bpf_would_add"]


def test_a_rank_still_waiting_at_the_stop(tmp_path):
    sampled, bpf = both(tmp_path, HUNG)
    s, b = by_rank(sampled)[3]["blocked_at_stop"], by_rank(bpf)[3]["blocked_at_stop"]
    assert (s["syscall"], s["path"], s["pid"]) == (b["syscall"], b["path"], b["pid"])
    # its 64 writes look like one call to samples: from its first write on, not the last one's entry
    assert b["seconds"] <= s["seconds"] <= b["seconds"] + 2
    assert all(by_rank(sampled)[r]["blocked_at_stop"] is None for r in (0, 1, 2))
    assert {f["kind"] for f in sampled["findings"]} >= {"server_unresponsive", "straggler_rank"}


def test_the_save_from_samples(tmp_path):
    sampled, bpf = both(tmp_path, STRAGGLER)
    [s], [b] = sampled["saves"], bpf["saves"]
    assert s["bytes"] == b["bytes"]
    assert s["duration_s"] == pytest.approx(b["duration_s"], abs=2 * INTERVAL_S)
    assert s["directory"] == b["directory"] and s["format"] == b["format"] == "torch"
    assert 0 < s["files"] <= b["files"]          # the files samples caught a rank writing
    assert s["slowest_rank"]["rank"] == b["slowest_rank"]["rank"] == 2


@pytest.mark.parametrize("model,answer", [(STORM, "yes"), (HEALTHY, "no")])
def test_the_checklist_answers_slot_saturation_from_mountstats(tmp_path, model, answer):
    sampled, bpf = both(tmp_path, model)
    [q] = [q for q in sampled["checklist"] if q["question"].startswith("slot table saturated")]
    [qb] = [q for q in bpf["checklist"] if q["question"].startswith("slot table saturated")]
    assert q["answer"] == qb["answer"] == answer and q["value"].startswith("mountstats:")


def test_the_slots_over_time_from_mountstats(tmp_path):
    """The report's slot plot and top's slots panel draw a sampled capture's transport from
    mountstats: the mean in use at each send stays at the 4 slots, the waiting above them."""
    from slotscope.analyzer.plot_data import TimeContext, occupancy
    from slotscope.analyzer.series import transport_series
    man = synth.save(tmp_path / "cap", sampled_s=INTERVAL_S, **STORM)
    job = Job.open([man["path"]])
    result = analyze(job, "0")
    [panel], more = occupancy(TimeContext.of(job, result), result)
    assert more <= 0 and "_counted" in panel.transport
    assert 3 <= panel.in_use.peak <= 4 < panel.waiting.peak
    [series] = transport_series(job, int(10e9), 20)
    assert series.from_mountstats and series.limit == 4 and 3 <= series.peak_in_use <= 4 < series.waiting_peak


def test_ranks_started_after_the_agent_keep_their_first_bytes(tmp_path):
    """Ranks first sampled after their first writes (started after the agent, as the VM rig's are:
    a sampled frozen run lost 48 KiB of 512 KiB a rank so): their first counters are growth,
    not a baseline, since the sampler's ticks (mountstats') began before them."""
    sampled, bpf = both(tmp_path, {**STRAGGLER, "started_late": True})
    assert {r["rank"]: r["bytes_written"] for r in sampled["ranks"]} == {r["rank"]: r["bytes_written"] for r in bpf["ranks"]}
