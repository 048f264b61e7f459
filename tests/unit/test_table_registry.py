"""The capture's tables are one list, capture/tables.py TABLES: the agent writes exactly those,
the reader and export read every one of them, `record --force` leaves no segment of an earlier
capture, and a capture naming a table that is no longer written (the old `files`) still reads."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slotscope.agent.probes import GROUPS
from slotscope.agent.recorder import OWN_TABLES
from slotscope.agent.samplers import SamplerThread
from slotscope.agent.sampled import SAMPLED_TABLES
from slotscope.analyzer.export import export_parquet
from slotscope.capture.format import PARTIAL_RE, SCHEMA_KEY, SEGMENT_RE, schema_tag
from slotscope.capture.reader import Capture
from slotscope.capture.tables import ESSENTIAL, TABLES, TIME_COLUMNS, newest, schema
from slotscope.capture.writer import CaptureWriter
from unit_helpers import meta, run_slotscope

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def one_row(name: str) -> pa.Table:
    """A row of the table's schema: times 1 s after the capture's start, the other columns every
    row needs 0 or "x", the rest null."""
    row = {f.name: 0 if pa.types.is_integer(f.type) else "x" for f in schema(name) if f.name in ESSENTIAL[name]}
    row.update({col: 1_000_001_000 for col in TIME_COLUMNS[name]})
    return pa.Table.from_pylist([row], schema=schema(name))


def capture_with_every_table(path: str) -> str:
    w = CaptureWriter(path)
    w.write_meta(meta())
    for name in TABLES:
        w.append(name, one_row(name))
    w.close()
    return path


def test_the_agent_writes_exactly_the_registry_tables():
    """The probe groups' streams, the samplers and the recorder's own rows together fill every
    table of the registry, and nothing else: every table the agent's code appends to by name
    is one of them."""
    streams = [s.table for g in GROUPS for s in g.streams]
    produced = set(streams) | set(SamplerThread.TABLES) | set(OWN_TABLES) | set(SAMPLED_TABLES)
    assert len(streams) == len(set(streams)), "two streams write one table"
    assert produced == set(TABLES)
    named = {m for p in (REPO / "agent").glob("*.py") for m in re.findall(r'\.append\("(\w+)"', p.read_text())}
    assert named and named <= produced, named - produced


def test_every_table_has_its_time_columns_declared():
    for name, columns in TIME_COLUMNS.items():
        assert name in TABLES
        assert set(columns) <= set(schema(name).names), name
        assert set(ESSENTIAL[name]) <= set(schema(name).names), name
    assert set(TIME_COLUMNS) == set(TABLES) == set(ESSENTIAL)


def test_every_registry_table_round_trips(tmp_path):
    cap = Capture.open(capture_with_every_table(str(tmp_path / "cap")))
    assert cap.tables() == sorted(TABLES)
    for name in TABLES:
        t = cap.read(name)
        assert t.num_rows == 1, name
        assert t.schema.metadata[SCHEMA_KEY] == f"{name}/{newest(name)[0]}".encode()
    assert cap.problems == []


def test_export_keeps_every_table(tmp_path):
    """Each registry table becomes its own Parquet dataset, with its row (export read only the
    reader's own list before, and dropped blocked, owners and xprt)."""
    path = capture_with_every_table(str(tmp_path / "cap"))
    done = export_parquet([path], str(tmp_path / "pq"))
    assert set(done["tables"]) == set(TABLES) | {"captures"}
    for name in TABLES:
        [part] = (tmp_path / "pq" / name).glob("host=*/*.parquet")
        t = pq.read_table(part)
        assert t.num_rows == 1, name
        for col in TIME_COLUMNS[name]:
            assert t[f"{col}_utc"][0].as_py() is not None, (name, col)


def test_force_leaves_no_segment_of_an_earlier_capture(tmp_path):
    """Whatever tables the earlier capture had (every one of today's, the old `files`, one of a
    future version), --force removes all their segments, finished and partial; files that are
    not the capture's own stay."""
    path = capture_with_every_table(str(tmp_path / "cap"))
    for table in ("files", "future_table"):
        os.mkdir(os.path.join(path, table))
        for name in ("000001.arrow", ".000002.arrow.partial", "notes.txt"):
            with open(os.path.join(path, table, name), "w") as f:
                f.write("x")
    w = CaptureWriter(path, force=True)
    w.close()
    left = [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]
    assert [f for f in left if SEGMENT_RE.match(os.path.basename(f)) or PARTIAL_RE.match(os.path.basename(f))] == []
    assert sorted(os.path.relpath(f, path) for f in left) == [".lock", "files/notes.txt", "future_table/notes.txt"]
    assert w.replaced == 1 + 2 * len(TABLES) + 4      # meta.json, each table's segment and checksums


def test_a_capture_with_the_old_files_table_still_reads(tmp_path, build_capture):
    """Nothing writes a `files` table any more; a capture that has one (tagged files/1) still
    opens, analyses and dumps it."""
    from unit_helpers import proc, sc
    path = build_capture(syscalls=[sc(10, "write", 100, 4096)], procs=[proc(10, rank=0)])
    os.mkdir(os.path.join(path, "files"))
    old = pa.schema([("dev", pa.uint64()), ("ino", pa.uint64()), ("path", pa.string())],
                    metadata=schema_tag("files", 1))
    with pa.OSFile(os.path.join(path, "files", "000001.arrow"), "wb") as f:
        with pa.ipc.new_file(f, old) as writer:
            writer.write_table(pa.Table.from_pylist([{"dev": 42, "ino": 7, "path": "/mnt/ckpt/shard"}], old))
    assert Capture.open(path).read("files").num_rows == 1
    res = run_slotscope("analyze", "--json", path)
    assert res.returncode == 0 and '"bytes_written": 4096' in res.stdout, res.stderr
    res = run_slotscope("dump", path, "-t", "files", "-O", "csv")
    assert res.returncode == 0 and "/mnt/ckpt/shard" in res.stdout, res.stderr


def test_the_drain_is_one_loop_over_the_streams():
    """No branch per ring or table in the recorder's drain: it names none of them (they are the
    probe groups' Stream declarations), and each stream's rings are its group's own."""
    import ast
    from slotscope.agent.layouts import RINGS
    tree = ast.parse((REPO / "agent" / "recorder.py").read_text())
    [drain] = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "_drain"]
    named = {n.value for n in ast.walk(drain) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert named & (set(RINGS) | set(TABLES)) == set()
    for g in GROUPS:
        assert {r for s in g.streams for r in s.rings} == set(g.rings), g.name
