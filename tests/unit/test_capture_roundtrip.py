"""CaptureWriter -> capture directory -> Capture reader: what goes in comes out."""
from __future__ import annotations

import os
import stat
import types

import pyarrow as pa
import pytest

from slotscope.capture import writer as cw
from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import AGENT, SYSCALL, newest
from slotscope.capture.format import ARROW_MAGIC, CHECKSUMS, SCHEMA_KEY
from slotscope.capture.reader import Capture

from unit_helpers import loss_table, meta, proc, procs_table, sc, syscall_table

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    """The writer's time.monotonic, moved by hand: no sleeping."""
    c = FakeClock()
    monkeypatch.setattr(cw, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


@pytest.fixture
def umask():
    """Run with a known umask, restored afterwards."""
    saved = os.umask(0o022)
    yield lambda m: os.umask(m)
    os.umask(saved)


def _ls(folder) -> list[str]:
    """A folder's files, but for the segments' checksums (tests/unit/test_checksums.py)."""
    return sorted(name for name in os.listdir(folder) if name != CHECKSUMS)


def _agent_rows(n: int, start: int = 0) -> pa.Table:
    return pa.Table.from_pylist([{"ts": i, "cpu_user_ns": i * 10, "cpu_sys_ns": i, "rss_bytes": 1 << 20,
                                  "events": i, "rows": i, "capture_bytes": 0, "bpf_run_ns": 5,
                                  "bpf_run_cnt": 1} for i in range(start, start + n)], schema=AGENT)


def test_rows_of_several_tables_round_trip_through_segments(tmp_path, clock):
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta("node-a"))
    first = [sc(10, "write", 100, 4096, ts=1), sc(11, "fsync", 5000, ts=2)]
    second = [sc(10, "pwrite64", 7, 512, ts=3, path="/mnt/ckpt/ü ñ", offset=4096),
              sc(12, "close", 9, ts=4, ret=-5)]
    w.append("syscall", syscall_table(first))
    w.append("procs", procs_table([proc(10, rank=0), proc(11, rank=1)]))
    w.append("agent", _agent_rows(2))

    clock.t += cw.SEGMENT_SECONDS / 2
    w.tick()                                     # too early: nothing closes, nothing is on disk
    assert _ls(tmp_path / "cap" / "syscall") == []
    assert w.size_bytes() > 0                    # but it counts

    clock.t += cw.SEGMENT_SECONDS
    w.tick()                                     # a second after the first row: closed and renamed
    w.flush()                                    # (by the flusher's thread)
    for table in ("syscall", "procs", "agent"):
        assert _ls(tmp_path / "cap" / table) == ["000001.arrow"], table

    w.append("syscall", syscall_table(second))
    w.append("agent", _agent_rows(3, start=2))
    w.append("loss", loss_table([{"ts": 9, "interval_ns": 10**9, "probe": "syscalls",
                                  "counter": "sys_ring_full", "lost": 17}]))
    clock.t += 2 * cw.SEGMENT_SECONDS
    w.tick()
    w.flush()
    assert _ls(tmp_path / "cap" / "syscall") == ["000001.arrow", "000002.arrow"]
    w.close()

    cap = Capture.open(path)
    assert cap.meta["host"] == "node-a"
    assert cap.tables() == ["agent", "loss", "procs", "syscall"]
    got = cap.read("syscall")
    assert got.num_rows == 4
    want = syscall_table(first + second).to_pylist()
    assert got.to_pylist() == want
    assert cap.read("procs").column("rank").to_pylist() == [0, 1]
    assert cap.read("agent").column("ts").to_pylist() == [0, 1, 2, 3, 4]
    assert cap.read("loss").column("lost").to_pylist() == [17]
    assert cap.problems == []
    assert cap.read("rpc") is None          # a table never written


def test_a_segment_closes_when_it_is_full_not_only_when_its_second_is_over(tmp_path, clock, monkeypatch):
    """A write storm's rows do not pile up in memory for a second: the open segment is written
    once it holds SEGMENT_BYTES."""
    monkeypatch.setattr(cw, "SEGMENT_BYTES", 16 << 10)   # a batch of 200 rows: ~5 KiB compressed
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta())
    batches = [syscall_table([sc(10, "write", 100, 4096, ts=b * 1000 + i) for i in range(200)]) for b in range(20)]
    for batch in batches:
        w.append("syscall", batch)
        assert w.tables["syscall"].size() - w.tables["syscall"].closed_bytes < cw.SEGMENT_BYTES
    w.flush()
    segments = _ls(tmp_path / "cap" / "syscall")
    assert len(segments) >= 4                   # no tick: the clock did not move
    w.close()
    assert Capture.open(path).read("syscall").num_rows == 20 * 200


def test_close_finishes_the_open_segment(tmp_path):
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta())
    w.append("syscall", syscall_table([sc(1)]))
    w.close()
    assert _ls(tmp_path / "cap" / "syscall") == ["000001.arrow"]
    assert Capture.open(path).read("syscall").num_rows == 1


def test_empty_append_opens_no_segment(tmp_path):
    w = CaptureWriter(str(tmp_path / "cap"))
    w.append("syscall", syscall_table([]))
    w.close()
    assert _ls(tmp_path / "cap" / "syscall") == []


def test_a_segment_reaches_the_disk_whole_and_a_leftover_dotfile_is_skipped(tmp_path, clock):
    """An open segment is in memory: the directory holds finished segments only, and a
    dotfile left by an agent killed while writing one is not read."""
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta())
    w.append("syscall", syscall_table([sc(1, ts=1)]))
    clock.t += cw.SEGMENT_SECONDS
    w.tick()
    w.flush()
    w.append("syscall", syscall_table([sc(2, ts=2), sc(3, ts=3)]))   # stays open
    assert _ls(tmp_path / "cap" / "syscall") == ["000001.arrow"]
    with open(os.path.join(path, "syscall", ".000009.arrow.partial"), "wb") as f:
        f.write(ARROW_MAGIC + b"half a segment")
    cap = Capture.open(path)
    assert cap.segments("syscall") == [os.path.join(path, "syscall", "000001.arrow")]
    assert cap.read("syscall").column("tgid").to_pylist() == [1]
    assert cap.problems == []
    assert cap.live is False      # meta() has a stop record
    w.close()
    assert Capture.open(path).read("syscall").column("tgid").to_pylist() == [1, 2, 3]


def test_capture_without_stop_record_is_live(build_capture):
    m = meta()
    del m["stop"]
    assert Capture.open(build_capture(meta_override=m)).live is True


def test_default_modes_are_owner_only(tmp_path, umask):
    umask(0o000)          # even with no umask to help, nothing is group or world readable
    path = tmp_path / "cap"
    w = CaptureWriter(str(path))
    w.write_meta(meta())
    w.append("syscall", syscall_table([sc(1)]))
    w.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path / "syscall").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path / "meta.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path / "syscall" / "000001.arrow").st_mode) == 0o600


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_group_readable_modes(tmp_path, umask, mask):
    """--group-readable asks for 0640/0750: a restrictive umask (root's is often 077) must not undo it."""
    umask(mask)
    path = tmp_path / "cap"
    w = CaptureWriter(str(path), group_readable=True)
    w.write_meta(meta())
    w.append("syscall", syscall_table([sc(1)]))
    w.close()
    modes = {
        "capture dir": stat.S_IMODE(os.stat(path).st_mode),
        "table dir": stat.S_IMODE(os.stat(path / "syscall").st_mode),
        "meta.json": stat.S_IMODE(os.stat(path / "meta.json").st_mode),
        "segment": stat.S_IMODE(os.stat(path / "syscall" / "000001.arrow").st_mode),
    }
    assert modes == {"capture dir": 0o750, "table dir": 0o750, "meta.json": 0o640, "segment": 0o640}


def test_segments_carry_the_schema_tag(build_capture):
    path = build_capture(syscalls=[sc(1)], procs=[proc(1, rank=0)])
    for table in ("syscall", "procs"):
        with pa.OSFile(os.path.join(path, table, "000001.arrow")) as f:
            schema = pa.ipc.open_file(f).schema
        assert schema.metadata[SCHEMA_KEY] == f"{table}/{newest(table)[0]}".encode()


def test_reader_unifies_an_older_and_a_newer_segment(tmp_path, build_capture):
    """A newer agent of the same major version adds a column: older rows read it as null."""
    path = build_capture(syscalls=[sc(1, ts=1), sc(2, ts=2)])
    newer = SYSCALL.append(pa.field("cgroup_id", pa.uint64())).with_metadata({SCHEMA_KEY: b"syscall/1"})
    rows = [dict(sc(3, ts=3), cgroup_id=99)]
    with pa.OSFile(os.path.join(path, "syscall", "000002.arrow"), "wb") as f:
        with pa.ipc.new_file(f, newer) as writer:
            writer.write_table(pa.Table.from_pylist(rows, schema=newer))
    cap = Capture.open(path)
    t = cap.read("syscall")
    assert t.num_rows == 3
    assert "cgroup_id" in t.column_names
    assert t.column("cgroup_id").to_pylist() == [None, None, 99]
    assert t.column("tgid").to_pylist() == [1, 2, 3]
    assert cap.problems == []


def test_segments_are_read_in_number_order(tmp_path, build_capture):
    """Segment 10 after 9, not after 1 (names are zero-padded, order is numeric)."""
    path = build_capture(syscalls=[sc(1)])
    src = os.path.join(path, "syscall", "000001.arrow")
    for n, tgid in ((10, 10), (9, 9)):
        with pa.OSFile(os.path.join(path, "syscall", f"{n:06d}.arrow"), "wb") as f:
            schema = pa.ipc.open_file(pa.memory_map(src)).schema
            with pa.ipc.new_file(f, schema) as writer:
                writer.write_table(syscall_table([sc(tgid)]).cast(schema))
    assert Capture.open(path).read("syscall").column("tgid").to_pylist() == [1, 9, 10]


def test_force_over_an_earlier_capture_replaces_it_whole(tmp_path, build_capture):
    """--force over an earlier capture replaces it: none of its rows mix into the new one,
    and files that are not the capture's own are left alone."""
    path = build_capture(syscalls=[sc(1, ts=1), sc(3, ts=3)])
    with open(os.path.join(path, "notes.txt"), "w") as f:
        f.write("mine")
    w = CaptureWriter(path, force=True)
    w.write_meta(meta())
    w.append("syscall", syscall_table([sc(2, ts=2)]))
    w.close()
    assert w.replaced >= 2
    assert Capture.open(path).read("syscall").column("tgid").to_pylist() == [2]
    with open(os.path.join(path, "notes.txt")) as f:
        assert f.read() == "mine"


def test_force_over_a_killed_recording_does_not_fail_on_its_leftovers(tmp_path, clock):
    """An earlier agent was SIGKILLed while writing a segment: it stays as .000002.arrow.partial. A new
    recording with --force into that directory must not fail when it reaches segment 2."""
    path = str(tmp_path / "cap")
    old = CaptureWriter(path)
    old.write_meta(meta())
    old.append("syscall", syscall_table([sc(1, ts=1)]))
    clock.t += cw.SEGMENT_SECONDS
    old.tick()
    old.flusher.wait()      # segment 1 on disk: a killed agent's flusher writes nothing after the kill
    # killed while writing its second segment
    with open(os.path.join(path, "syscall", ".000002.arrow.partial"), "wb") as f:
        f.write(ARROW_MAGIC)
    os.close(old.dir.lock_fd)                                    # the kill released its lock

    new = CaptureWriter(path, force=True)
    new.write_meta(meta())
    for i in range(3):                                           # three segments
        new.append("syscall", syscall_table([sc(10 + i, ts=10 + i)]))
        clock.t += cw.SEGMENT_SECONDS
        new.tick()
    new.close()
    tgids = Capture.open(path).read("syscall").column("tgid").to_pylist()
    assert {10, 11, 12} <= set(tgids)


def test_appends_with_different_dictionaries_in_one_segment(tmp_path):
    """The `syscall` column is dictionary-encoded. An Arrow IPC file allows one dictionary per
    field, so two appends into the same open segment whose dictionaries differ (any producer
    but the decoder's fixed one) must still be written, not fail with a raw ArrowInvalid."""
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta())
    w.append("syscall", syscall_table([sc(1, "write", ts=1)]))
    w.append("syscall", syscall_table([sc(2, "fsync", ts=2), sc(3, "close", ts=3)]))
    w.close()
    t = Capture.open(path).read("syscall")
    assert t.column("syscall").cast(pa.string()).to_pylist() == ["write", "fsync", "close"]
