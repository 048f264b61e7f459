"""Lost events in every output (issue 19 point 10): which probe lost how many of what, when, and
whether the saves' files and ranks could be affected: the JSON (`losses`, and a note), the
terminal report, the HTML report and the TUI's banner, on real captures with a `loss` table."""
from __future__ import annotations

import json
import sys
from html import escape as html_escape
from pathlib import Path

import pytest
from unit_helpers import START_NS, meta, proc, run_slotscope, save_writes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

from slotscope.analyzer.analysis import analyze  # noqa: E402
from slotscope.analyzer.job import Job, iso_utc  # noqa: E402

pytestmark = pytest.mark.unit

S = 1_000_000_000


def lost(ts_s: float, counter: str, n: int, probe: str = "syscalls") -> dict:
    return {"ts": int(ts_s * S), "interval_ns": S, "probe": probe, "counter": counter, "lost": n}


def utc(mono_s: float) -> str:
    return iso_utc(START_NS + int(mono_s * S) - 1000)      # unit_helpers.meta's clock pair


@pytest.fixture
def torch_import(build_capture):
    """7,070 syscall rows lost 3-8 s into the recording (four ranks importing torch), the save
    at 20-25 s, and no call the agent could not name (meta.json's totals)."""
    rows = [r for rank in range(4) for r in save_writes(20 + rank * 0.01, 100 + rank, f"/mnt/ckpt/r{rank}.pt")]
    return build_capture("torch", syscalls=rows, procs=[proc(100 + r, rank=r) for r in range(4)],
                         loss=[lost(4 + i, "sys_ring_full", 1414) for i in range(5)],
                         meta_override=meta(totals={"unnamed_fd_rows": 0}))


def test_losses_before_the_save_in_json_text_and_html(torch_import, tmp_path):
    res = run_slotscope("analyze", "--json", "--html", str(tmp_path / "r.html"), torch_import)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    [loss] = result["losses"]
    assert {k: loss[k] for k in ("host", "capture", "probe", "counter", "what", "lost", "during", "could_affect")} == {
        "host": "node-a", "capture": torch_import, "probe": "syscalls", "counter": "sys_ring_full",
        "what": "syscall rows", "lost": 7070, "during": [], "could_affect": []}
    assert (loss["start"], loss["end"]) == (utc(3), utc(8))
    assert "before save 1" in loss["effect"] and "files and ranks are not affected" in loss["effect"]
    [note] = [n for n in result["notes"] if "lost" in n]
    assert note.startswith("7,070 syscall rows lost (syscalls: sys_ring_full) ")
    assert note.endswith(loss["effect"])

    text = " ".join(run_slotscope("analyze", torch_import).stdout.split())
    assert "note: 7,070 syscall rows lost (syscalls: sys_ring_full)" in text
    assert "before save 1; no call went unrecorded for want of its file's name" in text

    html = (tmp_path / "r.html").read_text()
    row = html[html.index('<table class="losses">'):]
    row = row[:row.index("</table>")]
    for cell in ("node-a", "syscalls", "sys_ring_full", "syscall rows", "7,070", loss["effect"]):
        cell = html_escape(cell)
        assert f"<td>{cell}</td>" in row or f'<td class="n">{cell}</td>' in row, cell


def test_losses_during_the_save_may_affect_its_ranks_files_rpcs_and_slots(tmp_path):
    man = synth.save(tmp_path / "storm", ranks=4, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096,
                     lost_events=7070)
    result = analyze(Job.open([man["path"]]), "0")
    by_counter = {x["counter"]: x for x in result["losses"]}
    assert set(by_counter) == {"sys_ring_full", "rpc_ring_full"}
    sys_rows, rpcs = by_counter["sys_ring_full"], by_counter["rpc_ring_full"]
    assert (sys_rows["lost"], sys_rows["probe"], sys_rows["during"]) == (3535, "syscalls", ["save 1"])
    assert sys_rows["could_affect"] == ["ranks", "files"]
    assert sys_rows["effect"] == "during save 1, whose per-rank figures and file list may be incomplete"
    assert (rpcs["probe"], rpcs["could_affect"]) == ("sunrpc", ["rpcs", "slots"])   # an RPC's record carries its slot's rows
    assert sum(x["lost"] for x in result["losses"]) == result["captures"][0]["lost_events"] == 7070


def test_a_lost_process_event_before_the_save_and_a_writer_without_a_rank(build_capture):
    rows = save_writes(20, 100, "/mnt/ckpt/r0.pt") + save_writes(20, 101, "/mnt/ckpt/r1.pt")
    path = build_capture("unranked", syscalls=rows, procs=[proc(100, rank=0), proc(101)],
                         loss=[lost(5, "proc_ring_full", 2)])
    [loss] = analyze(Job.open([path]), "0")["losses"]
    assert loss["could_affect"] == ["ranks"] and loss["during"] == []
    assert loss["effect"] == "before save 1; 1 writing process without a rank: their per-rank figures may be incomplete"


def test_the_tui_banner_says_what_was_lost(torch_import):
    from test_tui_app import banner, make_app, run, settle

    async def scenario():
        app = make_app(torch_import)
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(app, pilot)
            flat = " ".join(banner(app).split())
            assert "7070 events lost" in flat or "7,070 events lost" in flat
            assert "7,070 syscall rows lost (syscalls: sys_ring_full)" in flat
            assert "files and ranks are not affected" in flat
    run(scenario())
