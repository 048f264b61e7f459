"""The shipped sample: a real capture of an NFS checkpoint storm, recorded by the agent in the VM."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def test_demo_sample_names_every_rank_and_its_bytes():
    res = subprocess.run([sys.executable, "-m", "slotscope.cli", "demo", "--sample"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "kernel 6.1" in res.stdout


def test_sample_analysis_is_the_storm_it_claims():
    from slotscope.cli.demo import sample_path
    res = subprocess.run([sys.executable, "-m", "slotscope.cli", "analyze", "--json", sample_path()],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    ranks = {r["rank"]: r for r in out["ranks"]}
    assert sorted(ranks) == list(range(8))
    for r in ranks.values():
        # 0.5 MiB per rank in 4 KiB O_SYNC writes
        assert r["bytes_written"] == 512 * 1024
        assert r["syscalls"]["write"]["count"] == 128
    meta = out["captures"][0]
    assert meta["lost_events"] == 0 and meta["kernel"].startswith("6.1")


def test_analyze_gives_arrow_the_system_allocator(capsys):
    """bench/analyze.py measures the analysis with the allocator the command chooses
    (analyzer/allocator.py); this keeps the two the same."""
    import pyarrow as pa

    from slotscope.cli.main import main
    from slotscope.cli.demo import sample_path
    before = pa.default_memory_pool()
    try:
        assert main(["analyze", "--json", sample_path()]) == 0
        assert pa.default_memory_pool().backend_name == "system"
    finally:
        pa.set_memory_pool(before)
    assert json.loads(capsys.readouterr().out)["verdict"] == "slot_saturation"


def test_sample_without_its_syscall_table_still_finds_the_small_writes(tmp_path):
    """The sample's WRITEs have their writers from the owners table (lock context), not from the
    syscalls: without any syscall rows (not traced, or every segment unreadable) the small
    synchronous WRITEs are still charged to the 8 ranks, and the finding spans the save window."""
    from slotscope.analyzer.analysis import analyze
    from slotscope.analyzer.job import Job
    from slotscope.cli.demo import sample_path
    cap = tmp_path / "cap"
    shutil.copytree(sample_path(), cap)
    shutil.rmtree(cap / "syscall")
    result = analyze(Job.open([str(cap)]), "0")
    [f] = [f for f in result["findings"] if f["kind"] == "small_sync_writes"]
    assert f["severity"] == "warning" and f["ranks"] == list(range(8))
    assert (f["evidence"]["ranks_affected"], f["evidence"]["ranks"]) == (8, 8)
    assert "from 8 of 8 ranks" in f["summary"]
    assert (f["start"], f["end"]) == (result["window"]["start"], result["window"]["end"])


# What the saturating NFS save of tests/vm/make-sample writes, each table with rows: the RPCs, the
# slot table's samples, the transport's slots, the writers' owners (lock context), the NFS I/O,
# the link's counters, the syscalls and the ranks' processes.
STORM_TABLES = ("rpc", "slots", "xprt", "owners", "nfs_io", "netdev", "syscall", "procs")


def test_the_sample_has_every_table_of_a_saturating_save_and_its_link_speed():
    from slotscope.capture.format import CHECKSUMS
    from slotscope.capture.reader import Capture
    from slotscope.cli.demo import sample_path
    cap = Capture.open(sample_path())
    for table in STORM_TABLES:
        t = cap.read(table)
        assert t is not None and t.num_rows > 0, table
    # recorded by today's agent: every segment has its checksum line, and every one matched
    assert cap.verified
    for table in cap.tables():
        folder = Path(sample_path()) / table
        lines = (folder / CHECKSUMS).read_text().split("\n")
        assert {line.split()[0] for line in lines if line} == {p.name for p in folder.glob("*.arrow")}, table
    assert cap.problems == []
    # the link's speed, the same in every netdev row and in meta.json's NICs
    speeds = cap.read("netdev")["speed_bps"].to_pylist()
    nics = {n["speed_mbps"] * 1_000_000 for n in cap.meta["nics"] if n["speed_mbps"]}
    assert set(speeds) == nics == {10_000_000_000}
