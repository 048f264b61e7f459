"""`slotscope export`: the shipped sample (and a copy of it under another host name) as a
hive-partitioned Parquet dataset, checked against the capture itself; the README's query run
with DuckDB against an independent computation; the output directory's safety rules."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
from datetime import datetime, timedelta, timezone

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slotscope.cli.main import main
from slotscope.capture.reader import Capture, CaptureError
from slotscope.analyzer.export import ExportError, export_parquet
from unit_helpers import REPO, START_NS, meta, sc

pytestmark = pytest.mark.unit

SAMPLE = str(REPO / "analyzer" / "sample")
HOSTS = ("vm", "node-b")


@pytest.fixture
def two_hosts(tmp_path) -> list[str]:
    """The sample, and a copy of it that says it was recorded on node-b."""
    copy = tmp_path / "node-b-capture"
    shutil.copytree(SAMPLE, copy)
    m = json.loads((copy / "meta.json").read_text())
    m["host"] = "node-b"
    (copy / "meta.json").write_text(json.dumps(m))
    return [SAMPLE, str(copy)]


@pytest.fixture
def exported(tmp_path, two_hosts):
    out = str(tmp_path / "fleet")
    return out, export_parquet(two_hosts, out)


def _readme_block(marker: str) -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- {marker} -->\s*```sql\n(.*?)```\s*<!-- /{marker} -->", text, re.S)
    assert m, f"README.md has no <!-- {marker} --> sql block"
    return m.group(1)


def test_layout_is_one_hive_dataset_per_table_partitioned_by_host(exported):
    out, result = exported
    sample = Capture.open(SAMPLE)
    tables = [t for t in sample.tables() if sample.read(t) is not None]
    files = {os.path.relpath(p, out) for p in glob.glob(f"{out}/**/*", recursive=True) if os.path.isfile(p)}
    assert {re.sub(r"part-[^/]+\.parquet$", "part", f) for f in files} == \
        {f"{t}/host={h}/part" for t in tables + ["captures"] for h in HOSTS}
    assert len(files) == 2 * (len(tables) + 1) and set(result["files"]) == files
    for t in tables:
        n = sample.read(t).num_rows
        assert result["tables"][t] == {h: n for h in HOSTS}
        for h in HOSTS:
            [f] = glob.glob(f"{out}/{t}/host={h}/*.parquet")
            assert pq.read_metadata(f).num_rows == n
            assert "host" not in pq.read_schema(f).names     # the partition, not a column
        # and as a hive dataset, the way the README registers it
        got = duckdb.sql(f"SELECT host, count(*) FROM read_parquet('{out}/{t}/*/*.parquet', "
                         f"hive_partitioning=true) GROUP BY host").fetchall()
        assert dict(got) == {h: n for h in HOSTS}
    assert result["tables"]["captures"] == {h: 1 for h in HOSTS}


def test_utc_columns_line_up_hosts(exported):
    out, _ = exported
    m = json.loads(open(f"{SAMPLE}/meta.json").read())
    first = Capture.open(SAMPLE).read("slots").slice(0, 1).to_pylist()[0]
    t = pq.read_table(glob.glob(f"{out}/slots/host=vm/*.parquet")[0])
    assert t.schema.field("ts_utc").type == pa.timestamp("us", tz="UTC")
    assert t.column_names.index("ts_utc") == t.column_names.index("ts") + 1
    utc_ns = m["start"]["realtime_ns"] + first["ts"] - m["start"]["monotonic_ns"]
    assert first["ts"] == 76475862306 and utc_ns == 1796446552509923405     # the known row
    row = t.slice(0, 1).to_pylist()[0]
    assert row["ts"] == first["ts"]
    assert row["ts_utc"] == datetime(2026, 12, 5, 4, 55, 52, 509923, tzinfo=timezone.utc)
    # every time column of every table got its twin
    for table, cols in (("rpc", ("ts_begin", "ts_end", "ts_reserve_start", "ts_reserved",
                                 "ts_transmit_start", "ts_first_tx", "ts_last_tx")),
                        ("syscall", ("ts_enter", "ts_exit")), ("nfs_io", ("ts",)), ("procs", ("ts",)),
                        ("netdev", ("ts",)), ("agent", ("ts",))):
        names = pq.read_schema(glob.glob(f"{out}/{table}/host=node-b/*.parquet")[0]).names
        assert {f"{c}_utc" for c in cols} <= set(names), table


def test_not_seen_timestamps_stay_null_and_syscall_names_are_plain_strings(tmp_path, build_capture):
    cap = build_capture(syscalls=[sc(10, "write", 100, 4096, ts=2_000), sc(11, "fsync", ts=3_000, ts_exit=0)])
    out = str(tmp_path / "out")
    export_parquet([cap], out)
    [f] = glob.glob(f"{out}/syscall/host=node-a/*.parquet")
    assert pq.read_schema(f).field("syscall").type == pa.string()
    rows = pq.read_table(f).to_pylist()
    # start pair (monotonic 1_000, realtime START_NS): ts 2_000 is START_NS + 1_000 ns, in µs
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert rows[0]["ts_enter_utc"] == epoch + timedelta(microseconds=(START_NS + 1_000) // 1000)
    assert rows[1]["ts_exit_utc"] is None and rows[1]["ts_enter_utc"] is not None
    assert duckdb.sql(f"SELECT syscall FROM '{f}' ORDER BY ts_enter").fetchall() == [("write",), ("fsync",)]


def test_captures_dataset_has_one_row_per_capture_with_its_settings(exported):
    out, _ = exported
    rows = duckdb.sql(f"SELECT * FROM read_parquet('{out}/captures/*/*.parquet', hive_partitioning=true) "
                      f"ORDER BY host").fetchall()
    cols = [d[0] for d in duckdb.sql(f"SELECT * FROM read_parquet('{out}/captures/*/*.parquet', "
                                     f"hive_partitioning=true) LIMIT 0").description]
    by_host = {r["host"]: r for r in (dict(zip(cols, row)) for row in rows)}
    assert set(by_host) == set(HOSTS)
    vm = by_host["vm"]
    assert vm["kernel"] == "6.1.0-57-amd64" and vm["slotscope_version"] == "0.1.0"
    assert vm["path"] == os.path.abspath(SAMPLE)
    assert vm["tcp_max_slot_table_entries"] == 2
    assert json.loads(vm["sunrpc"])["tcp_max_slot_table_entries"] == "2"
    assert json.loads(vm["nfs_mounts"])[0]["vers"] == "3"
    assert vm["start_utc"] == datetime(2026, 12, 5, 4, 55, 45, 167144, tzinfo=timezone.utc)
    assert vm["stop_utc"] == datetime(2026, 12, 5, 4, 56, 10, 538200, tzinfo=timezone.utc)
    assert vm["capture_id"] != by_host["node-b"]["capture_id"]


def _saturation_by_numpy(paths: list[str]) -> dict:
    """The finding computed straight from the captures: each sample holds until its client's next."""
    out = {}
    for path in paths:
        cap = Capture.open(path)
        s = cap.read("slots")
        ts, cid = s["ts"].to_numpy(), s["client_id"].to_numpy()
        backlog, session, in_use = (s[c].to_numpy() for c in ("backlog", "session_wait", "in_use"))
        server = np.array(s["server"].to_pylist())
        for c in np.unique(cid):
            idx = np.flatnonzero(cid == c)
            idx = idx[np.argsort(ts[idx], kind="stable")]
            held = np.diff(ts[idx])
            full = ((backlog[idx] > 0) | (session[idx] > 0))[:-1]
            key = (cap.meta["host"], str(server[idx][0]))
            acc = out.setdefault(key, {"observed": 0, "full": 0, "peak_in_use": 0, "peak_backlog": 0})
            acc["observed"] += int(held.sum())
            acc["full"] += int(held[full].sum())
            acc["peak_in_use"] = max(acc["peak_in_use"], int(in_use[idx].max()))
            acc["peak_backlog"] = max(acc["peak_backlog"], int(backlog[idx].max()))
    return out


def test_readme_query_finds_the_samples_saturated_slot_table(exported, two_hosts):
    out, _ = exported
    con = duckdb.connect()
    for stmt in _readme_block("duckdb-views").replace("DIR", out).split(";"):
        if stmt.strip():
            con.execute(stmt)
    cur = con.execute(_readme_block("saturation-query"))
    cols = [d[0] for d in cur.description]
    got = {(r["host"], r["server"]): r for r in (dict(zip(cols, row)) for row in cur.fetchall())}

    want = _saturation_by_numpy(two_hosts)
    assert set(got) == set(want) == {(h, "10.0.0.1:2049") for h in HOSTS}
    for key, w in want.items():
        g = got[key]
        assert g["slot_limit"] == 2
        assert (g["peak_in_use"], g["peak_backlog"]) == (w["peak_in_use"], w["peak_backlog"])
        assert g["seconds_observed"] == pytest.approx(w["observed"] / 1e9)
        assert g["seconds_full"] == pytest.approx(w["full"] / 1e9)
        assert g["full_fraction"] == pytest.approx(w["full"] / w["observed"])
    # the sample's 2-slot table: both slots taken, tasks queued behind them most of the time,
    # observed over all of its 17.8 s save
    vm = got["vm", "10.0.0.1:2049"]
    assert vm["peak_in_use"] == 2 and vm["peak_backlog"] >= 4
    assert vm["seconds_observed"] > 17.8 and vm["full_fraction"] > 0.8


def test_refuses_a_non_empty_dir_unless_forced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty.*--force"):
        export_parquet([SAMPLE], str(out))
    assert os.listdir(out) == ["keep.txt"]
    export_parquet([SAMPLE], str(out), force=True)
    assert (out / "keep.txt").read_text() == "mine" and glob.glob(f"{out}/slots/host=vm/*.parquet")


def test_refuses_a_symlinked_dir_and_symlinks_planted_inside(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ExportError, match="symlink"):
        export_parquet([SAMPLE], str(tmp_path / "link"))
    # with --force into a directory where someone planted a symlink as a table folder
    out = tmp_path / "out"
    out.mkdir()
    (out / "agent").symlink_to(target)
    with pytest.raises(ExportError, match="agent: a symlink"):
        export_parquet([SAMPLE], str(out), force=True)
    assert os.listdir(target) == []


def test_bad_captures_are_refused_before_anything_is_written(tmp_path, build_capture):
    out = tmp_path / "out"
    with pytest.raises(CaptureError, match="no such capture"):
        export_parquet([SAMPLE, str(tmp_path / "missing")], str(out))
    no_clock = build_capture("noclock", syscalls=[sc(10)], meta_override={**meta(), "start": None})
    with pytest.raises(CaptureError, match="no 'start' clock pair"):
        export_parquet([SAMPLE, no_clock], str(out))
    with pytest.raises(ExportError, match="same capture"):
        export_parquet([SAMPLE, SAMPLE], str(out))
    assert not out.exists()


def test_cli_prints_a_summary_and_one_line_errors(tmp_path, capsys, two_hosts):
    out = str(tmp_path / "out")
    assert main(["export", *two_hosts, "--parquet", out]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}: 2 capture(s) from 2 host(s) (node-b, vm)" in text
    assert re.search(r"^\s+slots\s+13164 rows$", text, re.M)

    assert main(["export", SAMPLE, "--parquet", out]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slotscope export: ") and "not empty" in err
    assert main(["export", str(tmp_path), "--parquet", str(tmp_path / "o2")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "meta.json" in err
