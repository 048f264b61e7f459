"""watch's memory and disk: the flight recorder's bounds, --max-disk's pruning on real files,
and the metrics served from real rows and the kernel's sweeps (more in test_watch_aggregates)."""
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from slotscope.agent.flight import STICKY_SHARE, FlightRecorder, packed, packed_records, rows_of
from slotscope.agent.layouts import NFS_EVENT
from slotscope.agent.rpc_rows import nfs_table
from slotscope.agent.incidents import incident_name, incidents, open_out, prune
from slotscope.agent.metrics import Metrics, parse_address
from slotscope.capture.tables import PROCS, SYSCALL
from slotscope.capture.writer import CaptureWriteError
from unit_helpers import scrape

pytestmark = pytest.mark.unit


def _rows(n: int, value: int = 0) -> pa.Table:
    return pa.table({"x": pa.array([value] * n, pa.int64())})


def test_flight_recorder_keeps_the_last_seconds():
    fr = FlightRecorder("/nowhere", keep_s=10, max_bytes=1 << 30)
    for t in range(30):
        fr.append("syscall", _rows(1, t), now=float(t))
    kept = [rows_of(item)["x"][0].as_py() for _, item in fr.contents()]
    assert kept == list(range(19, 30))      # appended at 19..29: within 10 s of 29
    assert fr.evicted_bytes == 0


def test_flight_recorder_bounded_by_bytes_oldest_first():
    """Rows are kept compressed, and counted so: 1000 rows of one value take far less."""
    chunk = packed(_rows(1000)).nbytes
    assert chunk < _rows(1000).nbytes // 10
    fr = FlightRecorder("/nowhere", keep_s=1e6, max_bytes=5 * chunk)
    for t in range(12):
        fr.append("syscall", _rows(1000, t), now=float(t))
    kept = [rows_of(item) for _, item in fr.contents()]
    assert [rows["x"][0].as_py() for rows in kept] == [7, 8, 9, 10, 11] and fr.size_bytes() == 5 * chunk
    assert all(rows.equals(_rows(1000, t)) for rows, t in zip(kept, range(7, 12)))
    assert fr.evicted_bytes == 7 * chunk


def test_process_rows_outlive_the_window():
    """The procs rows say whose the rows are: kept past --keep, bounded by their byte share."""
    fr = FlightRecorder("/nowhere", keep_s=5, max_bytes=1 << 20)
    procs = pa.Table.from_pylist([{"ts": 0, "tgid": 42, "comm": "trainer"}], schema=PROCS)
    fr.append("procs", procs, now=0.0)
    for t in range(100):
        fr.append("syscall", _rows(1), now=float(t))
    assert [name for name, _ in fr.contents()].count("procs") == 1
    for t in range(10_000):
        fr.append("procs", procs, now=100.0 + t)
    held = sum(rows.nbytes for name, rows in fr.contents() if name == "procs")     # kept as they are
    assert held <= (1 << 20) // STICKY_SHARE


def test_listeners_see_every_append():
    fr = FlightRecorder("/nowhere", keep_s=1, max_bytes=1 << 20)
    seen = []
    fr.listeners.append(lambda name, rows: seen.append((name, rows.num_rows)))
    fr.append("syscall", _rows(3), now=0.0)
    fr.append("syscall", _rows(0), now=0.0)
    fr.append("loss", _rows(1).to_batches()[0], now=0.0)
    assert seen == [("syscall", 3), ("loss", 1)]


def test_records_held_are_built_when_taken():
    """A stateless stream's records wait as read, counted by their bytes; an incident takes
    them as the rows the drain would have built, in the order held; no listener sees them."""
    fr = FlightRecorder("/nowhere", keep_s=10, max_bytes=1 << 20)
    seen = []
    fr.listeners.append(lambda name, rows: seen.append(name))
    batches = []
    for t in range(4):
        ev = np.zeros(3, NFS_EVENT.dtype)
        ev["ts"], ev["kind"], ev["fileid"], ev["offset"] = t, 1, 77, np.arange(3) * 4096 + t
        batches.append(ev)
        fr.hold("nfs_io", packed_records(nfs_table, [ev]), now=float(t * 6))
        fr.append("syscall", _rows(1, t), now=float(t * 6))
    assert seen == ["syscall"] * 4
    held = packed_records(nfs_table, [batches[3]]).nbytes + packed(_rows(1, 3)).nbytes
    assert 0 < fr.size_bytes() <= 2 * held + 16    # at 0 and 6 s: past keep_s at 18
    taken = [(name, rows_of(item)) for name, item in fr.contents()]
    assert [name for name, _ in taken] == ["nfs_io", "syscall", "nfs_io", "syscall"]
    assert taken[0][1].equals(nfs_table(batches[2])) and taken[2][1].equals(nfs_table(batches[3]))
    assert taken[0][1]["kind"].to_pylist() == ["write_start"] * 3


def _incident(out, name: str, size: int) -> None:
    os.makedirs(out / name / "syscall")
    with open(out / name / "syscall" / "000001.arrow", "wb") as f:
        f.write(os.urandom(size))       # real blocks on disk


def test_max_disk_removes_the_oldest_first(tmp_path):
    out = tmp_path / "out"
    open_out(str(out))
    assert oct(os.stat(out).st_mode & 0o777) == "0o700"
    names = [incident_name(1_796_000_000_000_000_000 + i * 3_600 * 10**9, "blocked_s") for i in range(4)]
    for name in names:
        _incident(out, name, 1 << 20)
    (out / "notes.txt").write_text("not an incident")
    os.makedirs(out / "incident-elsewhere")      # not of our naming: never counted or removed
    sizes = dict(incidents(str(out)))
    assert list(sizes) == names and all(s >= 1 << 20 for s in sizes.values())
    removed = prune(str(out), max_bytes=int(2.5 * (1 << 20)) + 2 * 8192, keep=names[-1])
    assert removed == names[:2]
    assert sorted(os.listdir(out)) == sorted(names[2:] + ["notes.txt", "incident-elsewhere"])


def test_max_disk_keeps_the_newest_even_alone_over_the_cap(tmp_path):
    out = tmp_path / "out"
    open_out(str(out))
    old, new = (incident_name(1_796_000_000_000_000_000 + i * 10**9, "slow_save") for i in range(2))
    _incident(out, old, 1 << 20)
    _incident(out, new, 3 << 20)
    assert prune(str(out), max_bytes=1 << 20, keep=new) == [old]
    assert os.listdir(out) == [new]


def test_max_disk_follows_no_link(tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim"
    open_out(str(out))
    victim.mkdir()
    (victim / "precious").write_bytes(b"x" * (1 << 20))
    name = incident_name(1_796_000_000_000_000_000, "blocked_s")
    _incident(out, name, 1 << 20)
    os.symlink(victim, out / "incident-20000101T000000Z-blocked_s")     # the oldest name, a link
    assert prune(str(out), max_bytes=0) == [name]
    assert (victim / "precious").exists()


def test_out_of_another_user_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory away")
    os.chown(out, 65534, 65534)
    with pytest.raises(CaptureWriteError, match="owned by uid 65534"):
        open_out(str(out))


def test_incident_names_sort_by_time():
    a = incident_name(1_796_455_963_637_044_046, "blocked_s")
    assert a == "incident-20261205T073243Z-blocked_s"
    assert sorted([incident_name(2_000_000_000 * 10**9, "x"), a]) == [a, incident_name(2_000_000_000 * 10**9, "x")]


def _syscalls(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SYSCALL.remove(SYSCALL.get_field_index("syscall")).insert(
        SYSCALL.get_field_index("syscall"), pa.field("syscall", pa.string())))


def test_metrics_from_rows_and_sweeps(tmp_path):
    """The calls on fds come from the kernel's aggregates (a Sweep); the calls that name a path
    from their rows, whose calls on fds the kernel has counted already (not twice)."""
    from slotscope.agent.aggregates import Sweep
    dev = os.stat(tmp_path).st_dev
    path = str(tmp_path / "f")
    proc_dev = os.stat("/proc").st_dev
    m = Metrics(per_process=True, process_cap=1)
    mount = m.mount_of(dev, path)
    m.observe("procs", pa.Table.from_pylist([{"ts": 0, "tgid": 5, "comm": "rank0", "rank": 0}], schema=PROCS))
    counts = lambda *at: [at.count(i) for i in range(19)]  # noqa: E731
    m.sweep(Sweep(calls={("write", mount): (counts(0, 14), 3_000_050_000, 4196),
                         ("fsync", mount): (counts(1), 200_000, 0)},
                  processes={5: (4096, 250_000), 6: (100, 3_000_000_000)}))
    m.observe("syscall", _syscalls([
        {"syscall": "write", "latency_ns": 50_000, "bytes": 4096, "tgid": 5, "dev": dev, "path": path},
        {"syscall": "openat", "latency_ns": 2_000_000, "bytes": None, "tgid": 5, "dev": dev, "path": path},
        {"syscall": "openat", "latency_ns": 2_200_000, "bytes": None, "tgid": 5, "dev": dev, "path": path},
        # a device's first row without a path: its mount is found from the next
        {"syscall": "statx", "latency_ns": 300_000_000, "bytes": None, "tgid": 6, "dev": proc_dev, "path": None},
        {"syscall": "statx", "latency_ns": 1_000, "bytes": None, "tgid": 6, "dev": proc_dev, "path": "/proc/self"},
    ]))
    m.observe("loss", pa.table({"counter": ["sys_ring"], "lost": pa.array([7], pa.uint64())}))
    m.incident("blocked_s")
    lines = scrape(m)
    write = f'mount="{mount}",syscall="write"'
    assert float(lines[f'slotscope_syscall_duration_seconds_bucket{{le="0.0001",{write}}}']) == 1
    assert float(lines[f'slotscope_syscall_duration_seconds_bucket{{le="2.5",{write}}}']) == 1
    assert float(lines[f'slotscope_syscall_duration_seconds_bucket{{le="5",{write}}}']) == 2
    assert float(lines[f'slotscope_syscall_duration_seconds_count{{{write}}}']) == 2     # the row's not again
    assert float(lines[f'slotscope_syscall_duration_seconds_sum{{{write}}}']) == pytest.approx(3.00005)
    assert float(lines[f'slotscope_syscall_duration_seconds_count{{mount="{mount}",syscall="openat"}}']) == 2
    assert float(lines[f'slotscope_syscall_duration_seconds_bucket{{le="0.0025",mount="{mount}",syscall="openat"}}']) \
        == 2
    assert float(lines[f'slotscope_syscall_duration_seconds_sum{{mount="{mount}",syscall="openat"}}']) == \
        pytest.approx(0.0042)
    statx = 'mount="/proc",syscall="statx"'
    assert float(lines[f'slotscope_syscall_duration_seconds_bucket{{le="0.0001",{statx}}}']) == 1
    assert float(lines[f'slotscope_syscall_duration_seconds_bucket{{le="0.5",{statx}}}']) == 2
    assert float(lines[f'slotscope_written_bytes_total{{mount="{mount}"}}']) == 4196
    # the cap: one process of its own, the other summed as "other"; its open's time from the row
    assert float(lines['slotscope_process_written_bytes_total{comm="rank0",pid="5",rank="0"}']) == 4096
    assert float(lines['slotscope_process_written_bytes_total{comm="",pid="other",rank=""}']) == 100
    assert float(lines['slotscope_process_blocked_seconds_total{comm="rank0",pid="5",rank="0"}']) \
        == pytest.approx(0.00445)
    assert float(lines['slotscope_process_blocked_seconds_total{comm="",pid="other",rank=""}']) \
        == pytest.approx(3.300001)
    assert float(lines['slotscope_lost_events_total{counter="sys_ring"}']) == 7
    assert float(lines['slotscope_incidents_total{trigger="blocked_s"}']) == 1
    assert float(lines["slotscope_agent_resident_memory_bytes"]) > 1 << 20
    assert mount == "/" or path.startswith(mount)


def test_metrics_leave_arrow_s_query_engine_unloaded():
    """Grouping with Arrow (Table.group_by) loads its query engine and with it the dataset
    and filesystem modules, S3's too: ~13 MiB of a daemon meant to stay small."""
    code = """
import sys, pyarrow as pa
from slotscope.agent.metrics import Metrics
m = Metrics(per_process=True)
m.observe("loss", pa.table({"counter": ["sys_ring", "sys_ring"], "lost": pa.array([7, 2], pa.uint64())}))
m.observe("syscall", pa.table({"syscall": ["openat", "statx"], "latency_ns": [1, 2], "tgid": [5, 5],
                               "dev": [0, 0], "path": ["/", None]}))
print(m._lost["sys_ring"], sorted(n for n in sys.modules if n.startswith("pyarrow._")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lost, modules = out.split(" ", 1)
    assert lost == "9"
    assert "_acero" not in modules and "_dataset" not in modules and "_fs" not in modules, modules


@pytest.mark.parametrize("text", ["9465", "host:", "host:0", "host:99999", "host:port"])
def test_bad_metrics_address(text):
    with pytest.raises(ValueError, match="want ADDR:PORT"):
        parse_address(text)


def test_metrics_address():
    assert parse_address("127.0.0.1:9465") == ("127.0.0.1", 9465)
    assert parse_address(":9465") == ("0.0.0.0", 9465)
    assert parse_address("[::1]:9465") == ("::1", 9465)


def test_the_endpoint_serves_before_the_probes_are_loaded(tmp_path):
    """watch serves its metrics from its start, while BCC compiles (a minute under the VM's TCG):
    a scrape then answers, with no event read yet. It raised AttributeError on every scrape of the
    VM's first watched boot until the capture had started."""
    from slotscope.agent.watch import Watcher, WatchOptions
    got = scrape(Watcher(WatchOptions(output=str(tmp_path / "out")), ["slotscope", "watch"]).metrics)
    assert got["slotscope_events_total"] == 0 and got["slotscope_flight_recorder_seconds"] == 0


def test_a_daemon_keeps_no_name_of_every_process_it_saw():
    """Every process the host starts reaches the metrics as a procs row: without the per-process
    series none is kept, with them the newest IDENTS_MAX, and a process's series keeps the labels
    it got even after its name is let go."""
    from slotscope.agent.aggregates import Sweep
    from slotscope.agent.metrics import IDENTS_MAX

    def procs(tgids):
        return pa.Table.from_pylist([{"ts": 0, "tgid": t, "comm": f"p{t}", "rank": None} for t in tgids], schema=PROCS)
    off = Metrics()
    off.observe("procs", procs(range(1000)))
    assert not off._idents
    on = Metrics(per_process=True, process_cap=1)
    on.observe("procs", procs([5]))
    on.sweep(Sweep(processes={5: (4096, 0)}))
    on.observe("procs", procs(range(10, 10 + 3 * IDENTS_MAX)))
    on.sweep(Sweep(processes={5: (4096, 0)}))      # what each sweep added
    assert len(on._idents) == IDENTS_MAX and 5 not in on._idents
    assert float(scrape(on)['slotscope_process_written_bytes_total{comm="p5",pid="5",rank=""}']) == 8192
