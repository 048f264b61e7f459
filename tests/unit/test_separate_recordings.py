"""Captures of one host that do not overlap in time are two recordings, not one job (issue 19
point 9): merged silently they read as one long save. The analysis says so in one note and in
`separate_recordings`, and points at analysing each alone; captures of many hosts (a job of
many nodes) still merge without a word."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from unit_helpers import run_slotscope

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

from slotscope.analyzer.analysis import analyze  # noqa: E402
from slotscope.analyzer.job import Job  # noqa: E402

pytestmark = pytest.mark.unit

S = 1_000_000_000
STORM = dict(ranks=4, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096)


def later(man: dict, gap_s: float) -> dict:
    """Where a capture of the same host starts `gap_s` after `man` stopped (its own clock pair)."""
    return {"realtime_start_ns": man["stop_utc_ns"] + int(gap_s * S),
            "mono_start_ns": man["stop_utc_ns"] - man["utc_offset_ns"] + int(gap_s * S)}


@pytest.fixture(scope="module")
def two_saves(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apart")
    a = synth.save(tmp / "a", host="node-a", **STORM)
    b = synth.save(tmp / "b", host="node-a", **STORM, **later(a, 40))
    return a, b


def test_one_hosts_captures_apart_in_time_are_said_to_be_two_recordings(two_saves):
    a, b = two_saves
    res = run_slotscope("analyze", "--json", a["path"], b["path"])
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["separate_recordings"] == [{"host": "node-a", "recordings": [[a["path"]], [b["path"]]],
                                              "gaps_s": [40.0]}]
    [note] = [n for n in result["notes"] if "do not overlap" in n]
    assert f"node-a's captures {a['path']} and {b['path']} do not overlap in time (40.0 s apart)" in note
    assert f"slotscope analyze {a['path']}; slotscope analyze {b['path']}" in note
    # the terminal report says it right under the verdict
    text = run_slotscope("analyze", a["path"], b["path"]).stdout
    head = " ".join(" ".join(text.split("\n\n")[0].splitlines()[2:]).split())
    assert head.startswith("note: node-a's captures") and "do not overlap in time" in head


def test_many_hosts_or_overlapping_captures_are_one_job(tmp_path, two_saves):
    a, _ = two_saves
    other = synth.save(tmp_path / "n2", host="node-b", **{**STORM, "first_rank": 4}, **later(a, 40))
    assert Job.open([a["path"], other["path"]]).separate_recordings() == []      # two nodes, whatever the times
    beside = synth.save(tmp_path / "beside", host="node-a", **{**STORM, "first_rank": 4},
                        realtime_start_ns=a["start_utc_ns"] + S, mono_start_ns=a["start_utc_ns"] - a["utc_offset_ns"] + S)
    result = analyze(Job.open([a["path"], beside["path"]]), "0")
    assert result["separate_recordings"] == [] and not [n for n in result["notes"] if "overlap" in n]


def test_a_window_on_one_of_them_is_one_recording(two_saves):
    a, b = two_saves
    res = run_slotscope("analyze", "--json", "--until", "2", a["path"], b["path"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["separate_recordings"] == []
