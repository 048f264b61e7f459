"""How the findings read (issue 19 point 12): evidence as lines a person reads, one formatter
shared by the terminal report and the TUI, human labels and one number style in the HTML,
precision that suits the magnitude, what is known of a kernel-log-only finding's time, plurals,
distinguishable syscall colours, and the checklist's rerun row answered from the saves."""
from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import pytest
from unit_helpers import REPO, proc, run_slotscope, save_writes, sc, three_saves

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

from slotscope.analyzer.analysis import analyze  # noqa: E402
from slotscope.analyzer.job import Job  # noqa: E402
from slotscope.analyzer.report_html import render_html  # noqa: E402
from slotscope.analyzer.report_text import finding_lines, render_text  # noqa: E402

pytestmark = pytest.mark.unit

SAMPLE = str(REPO / "analyzer" / "sample")
S = 1_000_000_000
STORM = dict(ranks=4, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096)


@pytest.fixture(scope="module")
def sample():
    job = Job.open([SAMPLE])
    return job, analyze(job, "test")


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """A result of every detector: the sample's saturation and small writes, a server that froze
    with a rank hung, a straggler, a flush stall and a metadata storm."""
    tmp = tmp_path_factory.mktemp("scenarios")
    mans = [synth.save(tmp / "freeze", **STORM, freeze=(0.2, 8.0), timeo_ds=20, hung_rank=1, hung_s=40),
            synth.save(tmp / "straggler", ranks=4, slots=16, file_bytes=64 * 4096, slow_rank=(2, 4)),
            synth.save(tmp / "flush", ranks=4, mode="fsync", write_bytes=1 << 20, file_bytes=16 << 20,
                       slots=65536, rtt_ms=1.0, commit_ms=3000),
            synth.save(tmp / "metadata", ranks=2, slots=16, file_bytes=4096, metadata_ops_per_rank=600)]
    return [analyze(Job.open([m["path"]]), "test") for m in mans]


def test_evidence_reads_as_lines_in_the_report_and_the_tui(sample):
    _, result = sample
    [small] = [f for f in result["findings"] if f["kind"] == "small_sync_writes"]
    lines = [" ".join(line.split()) for line in finding_lines(small)]
    assert not [line for line in lines if re.search(r'[\[{]"|": ', line)], lines       # no JSON
    assert "WRITEs by stability: FILE_SYNC 1,024" in lines
    assert "per rank:" in lines
    assert "rank 0, host vm, small synchronous WRITEs 128, WRITEs 128, mean WRITE 4.0 KiB" in lines
    assert "ranks 0-7; syscalls write; server 10.0.0.1:2049" in lines

    from test_tui_app import run, sample_app, settle, text

    async def scenario():          # the TUI's findings screen shows the same lines
        app = sample_app()
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(app, pilot)
            await pilot.press("f")
            await pilot.pause()
            shown = " ".join(text(app, "#findings-text").split())
            assert "per rank: rank 0, host vm, small synchronous WRITEs 128" in shown and '{"' not in shown
    run(scenario())


def test_every_evidence_field_has_a_label(sample, scenarios):
    from slotscope.analyzer import evidence
    results = [sample[1], *scenarios]
    kinds = {f["kind"] for r in results for f in r["findings"]}
    assert kinds >= {"slot_saturation", "small_sync_writes", "server_unresponsive", "hung_tasks", "straggler_rank",
                     "flush_commit_stall", "metadata_storm"}, kinds

    tallies = {"stable", "size_histogram", "by_op", "metadata_rpcs", "rpc_procs", "calls", "blocked_in"}

    def fields(key, v):
        """The field names under evidence key `key`: a tally's own keys are names (FILE_SYNC,
        close), not fields."""
        yield key
        if isinstance(v, list):
            v = {i: x for i, x in enumerate(v)} if key not in tallies else {}
            for x in v.values():
                if isinstance(x, dict):
                    for k, y in x.items():
                        yield from fields(k, y)
        elif isinstance(v, dict):
            for k, y in v.items():
                if key in tallies:
                    if isinstance(y, dict):
                        for k2, y2 in y.items():
                            yield from fields(k2, y2)
                else:
                    yield from fields(k, y)

    unlabelled = set()
    for f in (f for r in results for f in r["findings"]):
        for k, v in f["evidence"].items():
            unlabelled |= set(fields(k, v)) - set(evidence.FIELDS)
        for line in finding_lines(f):
            assert not re.search(r'[\[{]"|": |\b[a-z]+_[a-z_]+ [-\d]', line), line      # raw keys or JSON
    assert unlabelled == set()


def test_html_evidence_has_labels_units_and_one_number_style(sample):
    job, result = sample
    page = render_html(job, result)
    cells = re.findall(r'<table class="evidence">.*?</table>', page, re.S)
    text = " ".join(re.sub(r"<[^>]+>", " ", c) for c in cells)
    assert "Little&#x27;s-law ceiling (slots x WRITE / hold)" in text and "245.4 KiB/s" in text
    assert "throughput while sending" in text and "237.8 KiB/s" in text and "94.6 ms" in text
    assert not re.search(r"\d{4}", text.replace(",", "")) or not re.search(r"(?<![\d,.])\d{4,}", text), text


def test_a_short_save_keeps_its_digits(build_capture):
    """A 0.18 s save read 'ranks 0.0-0.0 s, median 0.0 s'."""
    rows = []
    for rank in range(3):
        t = 10 * S + rank * 1_000_000
        rows += [sc(100 + rank, "openat", 1000, ts=t, ino=rank + 1, ret=3),
                 sc(100 + rank, "write", 170_000_000 + rank * 5_000_000, 4096, ts=t + 2000, ino=rank + 1),
                 sc(100 + rank, "close", 1000, ts=t + (180 + rank) * 1_000_000, ino=rank + 1, ret=0)]
    path = build_capture("short", syscalls=rows, procs=[proc(100 + r, rank=r) for r in range(3)])
    result = analyze(Job.open([path]), "test")
    [row] = [c for c in result["checklist"] if c["question"] == "checkpoint write duration"]
    assert row["answer"] == "0.184 s"
    assert row["value"] == "ranks 0.180-0.182 s, median 0.181 s"


def test_a_kernel_log_only_finding_says_what_is_known_of_its_time(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text("[ 4200.000100] nfs: server 10.0.0.7 not responding, still trying\n"
                   "[ 4201.500100] nfs: server 10.0.0.7 not responding, still trying\n"
                   "[ 4321.123456] INFO: task python:4321 blocked for more than 120 seconds.\n"
                   "[ 4321.123490]  rpc_wait_bit_killable+0x11/0x70 [sunrpc]\n"
                   "[ 4321.123503]  nfs_file_fsync+0x77/0x1d0 [nfs]\n")
    text = run_slotscope("analyze", "--kernel-log", str(log)).stdout
    heads = [line for line in text.splitlines() if line.startswith("[")]
    assert "[critical] server_unresponsive  at kernel uptime 4,200 .. 4,202 s" in heads
    assert "[critical] hung_tasks" in heads            # nothing known of its time: nothing printed
    assert not [h for h in heads if "?" in h]
    flat = " ".join(text.split())
    assert "the kernel reported 1 hung task in NFS/RPC code" in flat       # not "1 hung tasks"
    assert "server 10.0.0.7;" in flat or "server 10.0.0.7\n" in text or "; server 10.0.0.7" in flat


def test_one_rank_is_one_rank(build_capture):
    path = build_capture("one", syscalls=save_writes(10, 100, "/mnt/ckpt/r0.pt"), procs=[proc(100, rank=0)])
    head = render_text(analyze(Job.open([path]), "test")).splitlines()[1]
    assert head.endswith(", 1 rank"), head


def _lab(colour: str) -> tuple[float, float, float]:
    """sRGB '#rrggbb' in CIE L*a*b* (D65), where a distance of about 10 is plainly seen."""
    rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in rgb]
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b, \
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    fx, fy, fz = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz]
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def _distance(a: str, b: str) -> float:
    return sum((x - y) ** 2 for x, y in zip(_lab(a), _lab(b))) ** 0.5


def test_each_syscall_has_a_colour_of_its_own():
    """write and writev (torch.save's) were drawn in the same blue, mkdir and newfstatat in one purple."""
    from slotscope.analyzer.plots import SYSCALL_COLOURS
    from slotscope.capture.syscalls import FLUSH_SYSCALLS, METADATA_SYSCALLS, OPEN_SYSCALLS, WRITE_SYSCALLS
    assert set(SYSCALL_COLOURS) == set(WRITE_SYSCALLS + FLUSH_SYSCALLS + OPEN_SYSCALLS + METADATA_SYSCALLS)
    assert _distance(SYSCALL_COLOURS["write"], SYSCALL_COLOURS["writev"]) > 30
    close = [(a, b) for a, b in itertools.combinations(SYSCALL_COLOURS, 2)
             if _distance(SYSCALL_COLOURS[a], SYSCALL_COLOURS[b]) < 15]
    assert close == []


def test_the_rerun_row_answers_from_the_saves(tmp_path, build_capture):
    a = synth.save(tmp_path / "a", host="node-a", **STORM)
    b = synth.save(tmp_path / "b", host="node-a", **STORM, realtime_start_ns=a["stop_utc_ns"] + 40 * S,
                   mono_start_ns=a["stop_utc_ns"] - a["utc_offset_ns"] + 40 * S)
    res = run_slotscope("analyze", "--json", a["path"], b["path"])
    [row] = [c for c in json.loads(res.stdout)["checklist"] if "rerun" in c["question"]]
    assert row["answer"] == "yes"
    assert row["value"] == "each save of the recording is a rerun: small_sync_writes in saves 1-2"
    healthy = analyze(Job.open([build_capture(syscalls=three_saves())]), "test")
    [row] = [c for c in healthy["checklist"] if "rerun" in c["question"]]
    assert (row["answer"], row["value"]) == ("no", "each save of the recording is a rerun: healthy in saves 1-3")
    # one save cannot tell: no row, rather than one that is always '-'
    one = analyze(Job.open([a["path"]]), "test")
    assert [c["question"] for c in one["checklist"] if "rerun" in c["question"]] == []
