"""The saves of a recording: bursts of file events apart by save_gap_s, named from their files,
each analysed on its own, and compared (analyzer/saves.py, analyzer/checkpoints.py)."""
import json

import numpy as np
import pytest
from unit_helpers import assert_one_line_error, run_slotscope, three_saves

from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.checkpoints import describe
from slotscope.analyzer.job import Job
from slotscope.analyzer.ranks import rank_table
from slotscope.analyzer.saves import burst_numbers, predicted_part, trend
from slotscope.analyzer.whatif import save_span

pytestmark = pytest.mark.unit

S = 1_000_000_000


def test_bursts_split_at_the_gap_but_not_inside_a_blocked_call():
    enter = np.array([0, 1, 2, 20, 21, 40]) * S
    exit_ = np.array([1, 2, 3, 21, 35, 41]) * S      # the call at 21 s blocks until 35 s
    assert burst_numbers(enter, exit_, 10 * S).tolist() == [0, 0, 0, 1, 1, 1]
    assert burst_numbers(enter, exit_, 4 * S).tolist() == [0, 0, 0, 1, 1, 2]


def test_dcp_layout_is_named_with_its_ranks_shards_and_metadata():
    files = [f"/mnt/ckpt/step_300/__{r}_{i}.distcp" for r in range(8) for i in range(4)]
    assert describe(files + ["/mnt/ckpt/step_300/.metadata"], "/mnt/ckpt/step_300") == {
        "formats": ["dcp"], "text": "DCP checkpoint step_300/: 8 ranks x 4 shards + .metadata"}
    assert describe(files, "/mnt/ckpt/step_300")["text"].endswith(
        "(no .metadata: the save did not finish, or rank 0 was not traced)")


def test_other_layouts_by_suffix_and_same_names_in_many_directories():
    st = describe([f"/c/step_1/model_rank{r}.safetensors" for r in range(4)], "/c/step_1")
    assert st == {"formats": ["safetensors"],
                  "text": "safetensors checkpoint step_1/: 4 files (model_rank0.safetensors, "
                          "model_rank1.safetensors, ...)"}
    mixed = describe(["/c/a.pt", "/c/notes.txt"], "/c")
    assert mixed["formats"] == ["torch"] and mixed["text"].endswith("1 other file")
    assert describe([f"/c/rank{r}/shard0.bin" for r in range(8)], "/c")["text"] == "c/: 8 files"


def _save(number, seconds, verdict="healthy", **measures):
    return {"number": number, "duration_s": seconds, "verdict": verdict, "bytes": 100, "write_execute_ns": 1e6,
            "slot_wait_ns": None, "flush_ns": 1e8, **measures}


def test_trend_names_what_changed_with_the_slow_save():
    saves = [_save(1, 2.0), _save(2, 2.1), _save(3, 5.0, "slot_saturation", write_execute_ns=4e6)]
    t = trend(saves)
    assert t["slowest"] == 3 and t["fastest"] == 1 and abs(t["ratio"] - 2.5) < 1e-9
    assert [c["measure"] for c in t["changed"]] == ["write_execute_ns"]
    assert t["text"].startswith("save 3 took 2.5x as long as save 1 (5.00 s against 2.00 s): "
                                "verdict slot_saturation against healthy; mean WRITE RPC time 4.0 ms against 1.0 ms")
    steady = trend([_save(1, 2.0), _save(2, 2.2)])
    assert steady["changed"] == [] and "none slower than another" in steady["text"]
    warm = trend([_save(1, 6.0, flush_ns=3e8), _save(2, 2.0), _save(3, 2.1)])     # the first pays for set-up
    assert warm["text"].startswith("save 1 took 3.0x as long as save 2 (6.00 s against 2.00 s): "
                                   "time in close/fsync 0.30 s against 0.10 s")
    assert trend([_save(1, 2.0)]) is None


def test_a_recording_of_three_saves_is_reported_save_by_save(build_capture):
    result = analyze(Job.open([build_capture(syscalls=three_saves())]), "test")
    saves = result["saves"]
    assert [s["number"] for s in saves] == [1, 2, 3]
    assert [round(s["duration_s"], 3) for s in saves] == [5.5, 5.5, 9.5]     # mkdir to the last close
    assert [s["bytes"] for s in saves] == [8 * 2**20, 8 * 2**20, 16 * 2**20]
    assert [s["what"] for s in saves] == [f"torch.save checkpoint step_{k}/: 2 files (r201.pt, r202.pt)"
                                          for k in (1, 2, 3)]
    assert saves[0]["directory"] == "/mnt/ckpt/step_1" and saves[0]["files"] == 2
    assert [s["format"] for s in saves] == ["torch"] * 3      # DESIGN.md's JSON contract
    assert result["save_trend"]["slowest"] == 3
    assert "bytes written 16.0 MiB against 8.0 MiB" in result["save_trend"]["text"]


def test_a_prediction_is_for_the_slowest_save_not_the_recordings_span(build_capture):
    """whatif's model predicts one save: of three, the slowest (the third, 9.5 s from its mkdir),
    not the 119 s from the first call to the last; a recording of one save is whole."""
    job = Job.open([build_capture(syscalls=three_saves())])
    assert save_span(rank_table(job)) == pytest.approx(119.0, abs=0.01)     # config.json read at 50 s
    part = predicted_part(job, 10.0)
    assert part is not job and save_span(rank_table(part)) == pytest.approx(9.5, abs=0.01)
    one = Job.open([build_capture("one", syscalls=[r for r in three_saves() if "step_1" in (r["path"] or "")])])
    assert predicted_part(one, 10.0) is one


def test_analyze_one_save_of_the_recording(build_capture):
    cap = build_capture(syscalls=three_saves())
    res = run_slotscope("analyze", "--json", "--save", "2", cap)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    [save] = result["saves"]
    assert save["number"] == 2
    assert save["what"] == "torch.save checkpoint step_2/: 2 files (r201.pt, r202.pt)"
    assert sum(r["bytes_written"] for r in result["ranks"]) == 8 * 2**20
    assert_one_line_error(run_slotscope("analyze", "--save", "4", cap), "--save 4", "holds 3 saves (1-3)")


def test_a_recording_healthy_as_a_whole_takes_the_verdict_of_its_saves():
    """A job's ranks end together at its end while one node was late in each save: the
    recording's verdict is the saves', the most severe first, with the saves it comes from and
    a note; the renderers' verdict line takes its severity from those saves."""
    from slotscope.analyzer.analysis import _verdict_of_the_saves
    from slotscope.analyzer.report_text import verdict_line

    def finding(kind, severity):
        return {"kind": kind, "severity": severity}
    saves = [_save(1, 12.2, "straggler_node", findings=[finding("straggler_node", "warning")]),
             _save(2, 9.0, "healthy", findings=[]),
             _save(3, 13.6, "straggler_node", findings=[finding("straggler_node", "warning")]),
             _save(4, 20.0, "slot_saturation", findings=[finding("slot_saturation", "critical")])]
    result = {"verdict": "healthy", "findings": [], "saves": saves, "notes": []}
    _verdict_of_the_saves(result)
    assert result["verdict"] == "slot_saturation" and result["verdict_saves"] == [4]
    assert verdict_line(result) == "verdict: slot_saturation (critical)"
    assert result["notes"][0].startswith("the recording as a whole is healthy, its saves are not: ")
    result = {"verdict": "healthy", "findings": [], "saves": saves[:3], "notes": []}
    _verdict_of_the_saves(result)
    assert result["verdict"] == "straggler_node" and result["verdict_saves"] == [1, 3]
    assert verdict_line(result) == "verdict: straggler_node (warning)"
    # a recording with a verdict of its own keeps it; healthy saves change nothing
    for verdict, kept in (("flush_commit_stall", saves), ("healthy", saves[1:2])):
        result = {"verdict": verdict, "findings": [], "saves": kept, "notes": []}
        _verdict_of_the_saves(result)
        assert result["verdict"] == verdict and "verdict_saves" not in result and not result["notes"]
