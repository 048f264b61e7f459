"""What the commands write where (issue 19 point 11): `dump -O json` is one JSON document and
`-O jsonl` JSON Lines; `analyze --html FILE` says where it wrote, on stderr under --json so that
stdout stays one JSON document."""
from __future__ import annotations

import json

import pytest
from unit_helpers import REPO, run_slotscope

pytestmark = pytest.mark.unit

SAMPLE = str(REPO / "analyzer" / "sample")


def test_dump_json_is_one_document_and_jsonl_one_row_a_line():
    doc = run_slotscope("dump", SAMPLE, "-t", "procs", "-O", "json")
    assert doc.returncode == 0, doc.stderr
    rows = json.loads(doc.stdout)
    assert isinstance(rows, list) and len(rows) >= 8 and all("tgid" in r for r in rows)
    lines = run_slotscope("dump", SAMPLE, "-t", "procs", "-O", "jsonl")
    assert lines.returncode == 0, lines.stderr
    assert [json.loads(line) for line in lines.stdout.splitlines()] == rows
    assert "jsonl (JSON Lines" in " ".join(run_slotscope("dump", "--help").stdout.split())


def test_dump_json_of_a_known_table_without_rows_is_no_document_error():
    res = run_slotscope("dump", SAMPLE, "-t", "blocked", "-O", "json")
    assert res.returncode == 0 and res.stdout == "" and "no rows in table 'blocked'" in res.stderr


def test_analyze_html_names_the_file_it_wrote(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run_slotscope("analyze", "--html", "report.html", SAMPLE)
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip().splitlines()[-1] == f"HTML report written to {tmp_path / 'report.html'}"
    res = run_slotscope("analyze", "--json", "--html", "again.html", SAMPLE)
    assert res.returncode == 0
    assert json.loads(res.stdout)["verdict"] == "slot_saturation"      # stdout: the JSON, whole
    assert res.stderr.splitlines() == [f"slotscope: HTML report written to {tmp_path / 'again.html'}"]
    assert (tmp_path / "again.html").stat().st_size > 10_000
