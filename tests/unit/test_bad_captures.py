"""Bad captures: each is a clear CaptureError or a line in Capture.problems, through the API
and through `slotscope analyze` / `slotscope dump`, never a traceback."""
from __future__ import annotations

import json
import os
import re

import pyarrow as pa
import pytest

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import LOSS, SYSCALL
from slotscope.capture.format import SCHEMA_KEY
from slotscope.capture.reader import Capture, CaptureError
from unit_helpers import assert_one_line_error, meta, proc, run_slotscope, sc, syscall_table

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


# ---- captures that cannot be read at all: CaptureError, exit status 1 ----

def _no_dir(tmp_path):
    return str(tmp_path / "does-not-exist")


def _empty_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    return str(tmp_path / "empty")


def _no_meta(tmp_path):
    (tmp_path / "nometa" / "syscall").mkdir(parents=True)
    return str(tmp_path / "nometa")


def _meta_not_json(tmp_path):
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "meta.json").write_text('{"format": "slotscope-capture", "schema_ver')
    return str(tmp_path / "badjson")


def _meta_not_ours(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "meta.json").write_text(json.dumps({"name": "some other tool"}))
    return str(tmp_path / "other")


def _a_file(tmp_path):
    (tmp_path / "file.arrow").write_bytes(b"ARROW1\0\0")
    return str(tmp_path / "file.arrow")


def _future_capture(tmp_path):
    (tmp_path / "future").mkdir()
    (tmp_path / "future" / "meta.json").write_text(json.dumps(meta(schema_version=99)))
    return str(tmp_path / "future")


FATAL_OPEN = [
    (_no_dir, "no such capture directory"),
    (_empty_dir, "empty directory"),
    (_no_meta, "no meta.json"),
    (_meta_not_json, "meta.json: unreadable"),
    (_meta_not_ours, "not a slotscope capture"),
    (_a_file, "not a capture directory"),
    (_future_capture, "version 99 is newer than this slotscope reads"),
]
FATAL_IDS = [f.__name__.strip("_") for f, _ in FATAL_OPEN]


@pytest.mark.parametrize("make,phrase", FATAL_OPEN, ids=FATAL_IDS)
def test_unopenable_capture_is_a_capture_error(tmp_path, make, phrase):
    path = make(tmp_path)
    with pytest.raises(CaptureError) as exc:
        Capture.open(path)
    msg = str(exc.value)
    assert phrase in msg
    assert path in msg
    assert "\n" not in msg


@pytest.mark.parametrize("make,phrase", FATAL_OPEN, ids=FATAL_IDS)
@pytest.mark.parametrize("command", ["analyze", "dump"])
def test_unopenable_capture_cli_one_line(tmp_path, make, phrase, command):
    path = make(tmp_path)
    args = ["analyze", path] if command == "analyze" else ["dump", path, "-t", "syscall"]
    assert_one_line_error(run_slotscope(*args), phrase)


def test_future_capture_says_upgrade(tmp_path):
    with pytest.raises(CaptureError, match="upgrade slotscope"):
        Capture.open(_future_capture(tmp_path))


def _newer_table_major(path: str) -> None:
    schema = SYSCALL.with_metadata({SCHEMA_KEY: b"syscall/2"})
    with pa.OSFile(os.path.join(path, "syscall", "000002.arrow"), "wb") as f:
        with pa.ipc.new_file(f, schema) as w:
            w.write_table(syscall_table([sc(11)]).cast(schema))


def test_segment_with_newer_table_major_is_refused(build_capture):
    path = build_capture(syscalls=[sc(10)])
    _newer_table_major(path)
    cap = Capture.open(path)
    with pytest.raises(CaptureError) as exc:
        cap.read("syscall")
    msg = str(exc.value)
    assert "syscall/000002.arrow" in msg
    assert "version 2 is newer than this slotscope reads (1)" in msg
    assert "upgrade slotscope" in msg


@pytest.mark.parametrize("command", ["analyze", "dump"])
def test_segment_with_newer_table_major_cli(build_capture, command):
    path = build_capture(syscalls=[sc(10)], procs=[proc(10, rank=0)])
    _newer_table_major(path)
    args = ["analyze", path] if command == "analyze" else ["dump", path, "-t", "syscall"]
    assert_one_line_error(run_slotscope(*args), "table 'syscall' version 2 is newer", "upgrade slotscope")


def test_segment_of_another_table_is_skipped(build_capture):
    """A procs segment dropped into the syscall folder is not read as syscall rows."""
    path = build_capture(syscalls=[sc(10)], procs=[proc(10, rank=0)])
    os.rename(os.path.join(path, "procs", "000001.arrow"), os.path.join(path, "syscall", "000002.arrow"))
    cap = Capture.open(path)
    assert cap.read("syscall").column("tgid").to_pylist() == [10]
    assert cap.problems == ["syscall/000002.arrow: not a slotscope 'syscall' segment (schema tag 'procs/1'), skipped"]


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
    assert_one_line_error(res, "no rows in table 'nosuchtable'", "syscall")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_meta_says_permission_denied(build_capture):
    path = build_capture(syscalls=[sc(10)])
    os.chmod(os.path.join(path, "meta.json"), 0)
    with pytest.raises(CaptureError, match="permission denied.*--group-readable"):
        Capture.open(path)
    assert_one_line_error(run_slotscope("analyze", path), "permission denied")
