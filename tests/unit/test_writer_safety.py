"""The capture writer runs as root: it must not be talked into writing through links or into
someone else's directory, and a full disk must leave the finished segments readable."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from slotscope.capture import writer as cw
from slotscope.capture.writer import CaptureWriteError, CaptureWriter

from slotscope.capture.reader import Capture
from unit_helpers import meta, sc, syscall_table

pytestmark = pytest.mark.unit

IS_ROOT = os.geteuid() == 0


def test_refuses_a_symlink_to_a_directory(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(CaptureWriteError, match="symbolic link"):
        CaptureWriter(str(tmp_path / "link"))
    assert os.listdir(real) == []


def test_refuses_a_dangling_symlink(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "not-yet")
    with pytest.raises(CaptureWriteError, match="symbolic link"):
        CaptureWriter(str(tmp_path / "link"))
    assert not (tmp_path / "not-yet").exists()


def test_refuses_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(CaptureWriteError, match="not a directory"):
        CaptureWriter(str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "keep me"


def test_non_empty_directory_needs_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CaptureWriteError, match="not empty.*--force"):
        CaptureWriter(str(out))
    w = CaptureWriter(str(out), force=True)
    w.write_meta(meta())
    w.append("syscall", syscall_table([sc(1)]))
    w.close()
    assert (out / "notes.txt").read_text() == "mine"
    assert Capture.open(str(out)).read("syscall").num_rows == 1


def test_empty_existing_directory_is_fine_without_force(tmp_path):
    (tmp_path / "out").mkdir()
    w = CaptureWriter(str(tmp_path / "out"))
    w.close()


@pytest.mark.skipif(not IS_ROOT, reason="needs root to make a directory owned by another uid")
def test_refuses_a_directory_owned_by_another_uid(tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    os.chown(out, 65534, 65534)
    with pytest.raises(CaptureWriteError, match="owned by uid 65534"):
        CaptureWriter(str(out), force=True)
    assert os.listdir(out) == []


@pytest.fixture
def writer(tmp_path):
    w = CaptureWriter(str(tmp_path / "cap"))
    yield w
    w.close()


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_create_refuses_a_planted_symlink(tmp_path, dangling):
    """Files are created with O_EXCL|O_NOFOLLOW: a link at the name fails the creation."""
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_bytes(b"precious")
    d = cw.CaptureDir(str(tmp_path / "cap"))
    try:
        os.symlink(victim, tmp_path / "cap" / ".000001.arrow.partial")
        with pytest.raises(FileExistsError):
            d.create(".000001.arrow.partial")
    finally:
        d.close()
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_planted_symlink_at_the_partial_name_is_not_followed(tmp_path, writer, dangling, monkeypatch):
    """A link planted where the first segment will be written: the writer fails, it never
    writes through the link."""
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_bytes(b"precious")
    table_dir = tmp_path / "cap" / "syscall"
    table_dir.mkdir()
    (table_dir / ".000001.arrow.partial").symlink_to(victim)
    writer.append("syscall", syscall_table([sc(1)]))
    monkeypatch.setattr(cw, "SEGMENT_SECONDS", 0.0)
    with pytest.raises(CaptureWriteError, match="writing syscall to"):
        writer.tick()                          # the segment is handed to the flusher as it closes
        writer.flush()
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_bytes() == b"precious"
    assert (table_dir / ".000001.arrow.partial").is_symlink()


def test_planted_symlink_as_table_directory_is_not_followed(tmp_path, writer):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cap" / "syscall").symlink_to(elsewhere)
    with pytest.raises(CaptureWriteError, match="writing syscall"):
        writer.append("syscall", syscall_table([sc(1)]))
    assert os.listdir(elsewhere) == []


def test_planted_symlink_at_meta_json_is_replaced_not_followed(tmp_path, writer):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "cap" / "meta.json").symlink_to(victim)
    (tmp_path / "cap" / ".meta.json.tmp").symlink_to(victim)
    writer.write_meta(meta())
    assert victim.read_text() == "precious"
    st = os.lstat(tmp_path / "cap" / "meta.json")
    assert stat.S_ISREG(st.st_mode)
    assert Capture.open(str(tmp_path / "cap")).meta["host"] == "node-a"


@pytest.fixture
def tiny_tmpfs(tmp_path):
    if not IS_ROOT:
        pytest.skip("needs root to mount a 64 KiB tmpfs")
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    point = tmp_path / "tiny"
    point.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(point)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield point
    finally:
        if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_disk_full_keeps_finished_segments(tiny_tmpfs, monkeypatch):
    monkeypatch.setattr(cw, "SEGMENT_SECONDS", 0.0)      # every tick closes the open segment
    path = str(tiny_tmpfs / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta())
    finished_rows = []
    with pytest.raises(CaptureWriteError) as exc:
        for i in range(10_000):
            rows = [sc(i, ts=i * 100 + j, path="/mnt/ckpt/" + "d/" * 40 + str(j)) for j in range(20)]
            w.append("syscall", syscall_table(rows))
            w.tick()                    # hands the segment to the flusher
            finished_rows += rows
    w.close()
    msg = str(exc.value)
    assert "disk full" in msg
    assert path in msg
    kept = len([n for n in os.listdir(os.path.join(path, "syscall")) if not n.startswith(".")])
    assert kept > 0, "the tmpfs filled before a single segment was finished: make the rows smaller"
    assert f"{kept} finished segments kept" in msg
    assert w.failed == msg

    cap = Capture.open(path)
    t = cap.read("syscall")
    assert cap.problems == []
    # The segments after the one that failed (handed over before its failure was known) are
    # not written: what is kept is every row up to it, whole segments of 20, no gap.
    assert 0 < t.num_rows <= len(finished_rows) and t.num_rows % 20 == 0
    assert t.column("ts_enter").to_pylist() == [r["ts_enter"] for r in finished_rows[:t.num_rows]]
