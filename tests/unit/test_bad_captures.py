"""Bad captures: each is a clear CaptureError or a line in Capture.problems, never a traceback.
The corpus of tests/badcaptures.py (damaged copies of the shipped sample) goes through every
command, each in a process of its own with a time and memory limit; the tests below it check
what salvage keeps, to the row."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import LOSS
from slotscope.capture.reader import Capture
from unit_helpers import assert_one_line_error, meta, run_slotscope, sc, syscall_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import badcaptures  # noqa: E402

pytestmark = pytest.mark.unit

BATCHES, BATCH_ROWS = 4, 25


def _loss_batch(start: int) -> pa.Table:
    """Loss rows whose `lost` is 1 each, so the capture's lost_events counts the rows read."""
    return pa.Table.from_pylist([{"ts": i, "interval_ns": 10**9, "probe": "syscalls",
                                  "counter": "sys_ring_full", "lost": 1}
                                 for i in range(start, start + BATCH_ROWS)], schema=LOSS)


@pytest.fixture
def multi_batch_capture(tmp_path):
    """A capture whose loss table is one segment of several record batches, and a good syscall table."""
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta())
    for b in range(BATCHES):
        w.append("loss", _loss_batch(b * BATCH_ROWS))
    w.append("syscall", syscall_table([sc(10, "write", 100, 4096)]))
    w.close()
    seg = os.path.join(path, "loss", "000001.arrow")
    assert pa.ipc.open_file(pa.memory_map(seg)).num_record_batches == BATCHES
    return path, seg


def _cut(seg: str, keep: int) -> None:
    with open(seg, "rb") as f:
        data = f.read()
    with open(seg, "wb") as f:
        f.write(data[:keep])


# ---- the corpus: damaged copies of the sample through every command ----

@pytest.fixture(scope="module")
def runner():
    r = badcaptures.Runner()
    yield r
    r.close()


@pytest.fixture(scope="module")
def corpus_root():
    """Outside pytest's tmp_path (0700 under /tmp/pytest-of-root): the permission cases read as
    nobody, who must reach the copies."""
    root = Path(tempfile.mkdtemp(prefix="slotscope-bad-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_corpus_names_at_least_90_cases():
    names = [c.name for c in badcaptures.CASES]
    assert len(set(names)) == len(names) >= 90


@pytest.mark.parametrize("case", badcaptures.CASES, ids=[c.name for c in badcaptures.CASES])
def test_bad_capture(case, runner, corpus_root):
    """analyze, analyze --json, dump, export --parquet and top each answer the case as it says
    (one error line, or the rest read and the damage reported, or read clean), within
    TIMEOUT_S and MEMORY_BYTES."""
    if case.as_nobody and os.geteuid() != 0:
        pytest.skip("reads as nobody (uid 65534), which needs root to become; root itself reads through any mode")
    wrong = [f"{command}: {problem}" for command, _, problem in badcaptures.run_case(case, runner, corpus_root)
             if problem]
    assert not wrong, "\n".join(wrong)


# ---- damage that leaves data readable: rows kept, a line in problems ----

def test_truncated_segment_keeps_its_whole_batches(multi_batch_capture):
    path, seg = multi_batch_capture
    _cut(seg, os.path.getsize(seg) // 2)
    cap = Capture.open(path)
    t = cap.read("loss")
    assert t is not None
    kept = t.num_rows
    assert 0 < kept < BATCHES * BATCH_ROWS
    assert kept % BATCH_ROWS == 0, "only whole batches are returned"
    assert t.column("ts").to_pylist() == list(range(kept)), "the kept rows are the first ones, intact"
    [problem] = cap.problems
    m = re.fullmatch(r"loss/000001\.arrow: truncated; read its (\d+) whole batches \((\d+) rows\), "
                     r"the rest is lost", problem)
    assert m, problem
    assert (int(m.group(1)), int(m.group(2))) == (kept // BATCH_ROWS, kept)
    # the other tables are unaffected
    assert cap.read("syscall").num_rows == 1


def test_segment_missing_only_its_footer_keeps_every_batch(multi_batch_capture):
    path, seg = multi_batch_capture
    _cut(seg, os.path.getsize(seg) - 12)
    cap = Capture.open(path)
    assert cap.read("loss").num_rows == BATCHES * BATCH_ROWS
    assert cap.problems == [f"loss/000001.arrow: truncated; read its {BATCHES} whole batches "
                            f"({BATCHES * BATCH_ROWS} rows), the rest is lost"]


def test_segment_cut_before_its_schema_is_skipped(multi_batch_capture):
    path, seg = multi_batch_capture
    _cut(seg, 12)
    cap = Capture.open(path)
    assert cap.read("loss") is None
    assert cap.problems == ["loss/000001.arrow: truncated before its schema, skipped"]


def test_file_that_is_not_arrow_is_skipped(build_capture):
    path = build_capture(syscalls=[sc(10)])
    with open(os.path.join(path, "syscall", "000002.arrow"), "wb") as f:
        f.write(b"PK\x03\x04 this is a zip file, not an Arrow segment" * 10)
    cap = Capture.open(path)
    assert cap.read("syscall").column("tgid").to_pylist() == [10]
    assert cap.problems == ["syscall/000002.arrow: not an Arrow file, skipped"]


def test_dump_of_truncated_segment_reports_the_loss(multi_batch_capture):
    path, seg = multi_batch_capture
    _cut(seg, os.path.getsize(seg) // 2)
    res = run_slotscope("dump", path, "-t", "loss")
    assert "Traceback" not in res.stderr
    assert res.returncode == 0, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert re.fullmatch(r"slotscope: loss/000001\.arrow: truncated; read its \d+ whole batches "
                        r"\(\d+ rows\), the rest is lost", line), line
    rows = res.stdout.strip().splitlines()
    assert rows[0].startswith('"ts",')
    assert 1 < len(rows) < 1 + BATCHES * BATCH_ROWS


def test_analyze_of_damaged_capture_lists_problems(multi_batch_capture):
    path, seg = multi_batch_capture
    with open(os.path.join(path, "syscall", "000002.arrow"), "wb") as f:
        f.write(b"garbage" * 20)
    _cut(seg, os.path.getsize(seg) // 2)
    res = run_slotscope("analyze", "--json", path)
    assert "Traceback" not in res.stderr
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    problems = sorted(result["problems"])
    assert len(problems) == 2, problems
    m = re.fullmatch(re.escape(f"{path}: loss/000001.arrow: truncated; read its ") +
                     r"(\d+) whole batches \((\d+) rows\), the rest is lost", problems[0])
    assert m, problems[0]
    assert problems[1] == f"{path}: syscall/000002.arrow: not an Arrow file, skipped"
    assert [r["bytes_written"] for r in result["ranks"]] == [4096]
    # the lost-event count is what the kept loss rows say (one lost event per row)
    assert result["captures"][0]["lost_events"] == int(m.group(2))

    text = run_slotscope("analyze", path)
    assert text.returncode == 0
    assert f"problem: {path}: syscall/000002.arrow: not an Arrow file, skipped" in text.stdout


def test_reading_again_does_not_repeat_problems(build_capture):
    """The TUI re-reads a live capture every refresh and the analyzer reads a table more than
    once: a damaged segment is one problem, not one more per read."""
    path = build_capture(syscalls=[sc(10)])
    with open(os.path.join(path, "syscall", "000002.arrow"), "wb") as f:
        f.write(b"garbage" * 20)
    cap = Capture.open(path)
    for _ in range(3):
        assert cap.read("syscall").num_rows == 1
    assert cap.problems == ["syscall/000002.arrow: not an Arrow file, skipped"]


def test_dump_of_unknown_table_is_one_line(build_capture):
    path = build_capture(syscalls=[sc(10)])
    res = run_slotscope("dump", path, "-t", "nosuchtable")
    assert_one_line_error(res, "unknown table 'nosuchtable'", "syscall")     # issue 19 point 11
