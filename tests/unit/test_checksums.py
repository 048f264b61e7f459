"""Segment checksums (capture format 1.1, issue 18 points 7 and 17): a byte flipped inside a
segment's values is found and the segment skipped with one line, where it would otherwise be
read as data; captures from before checksums read as they did, marked not verified."""
from __future__ import annotations

import os

import pytest

from slotscope.capture.format import CHECKSUMS
from slotscope.capture.meta import new_meta
from slotscope.capture.reader import Capture
from slotscope.capture.writer import CaptureWriter
from unit_helpers import meta, sc, syscall_table

pytestmark = pytest.mark.unit
TGID = 0x2A5A1234     # distinctive bytes, to find in a segment


def _capture(path, segments=2):
    w = CaptureWriter(str(path))
    w.write_meta({**meta(), **new_meta()})
    for i in range(segments):
        w.append("syscall", syscall_table([sc(TGID + i, ts=10 + i, count=4096)]))
        w.tables["syscall"].close_segment()
    w.close()
    return path


def _flip(seg):
    """One bit of the TGID value wherever the segment holds it (its tgid and tid columns): a
    value a reader without checksums takes as it is (test_..._before_checksums below)."""
    data, value = seg.read_bytes(), TGID.to_bytes(4, "little")
    seg.write_bytes(data.replace(value, (TGID ^ 0x04).to_bytes(4, "little")))
    assert data.count(value) >= 1


def test_a_flipped_value_is_found_and_its_segment_skipped(tmp_path):
    cap = _capture(tmp_path / "cap")
    seg = cap / "syscall" / "000001.arrow"
    _flip(seg)
    c = Capture.open(str(cap))
    assert c.verified
    assert c.read("syscall").column("tgid").to_pylist() == [TGID + 1]
    assert c.problems == ["syscall/000001.arrow: checksum mismatch (damaged on disk), skipped"]


def test_an_intact_capture_is_verified_and_read_whole(tmp_path):
    c = Capture.open(str(_capture(tmp_path / "cap")))
    assert c.verified and c.read("syscall").column("tgid").to_pylist() == [TGID, TGID + 1] and c.problems == []
    lines = (tmp_path / "cap" / "syscall" / CHECKSUMS).read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["000001.arrow", "000002.arrow"]


def test_a_capture_before_checksums_reads_as_before_not_verified(tmp_path):
    """...including the flipped value of the first test, read as data."""
    cap = _capture(tmp_path / "cap")
    os.unlink(cap / "syscall" / CHECKSUMS)
    meta_file = cap / "meta.json"
    meta_file.write_text(meta_file.read_text().replace('"format_minor": 1', '"format_minor": 0'))
    _flip(cap / "syscall" / "000001.arrow")
    c = Capture.open(str(cap))
    assert not c.verified
    assert c.read("syscall").column("tgid").to_pylist() == [TGID ^ 0x04, TGID + 1] and c.problems == []


def test_a_segment_without_its_line_is_read_unverified(tmp_path):
    """A crash between a segment's rename and its checksum line: the segment is read, not
    called damaged."""
    cap = _capture(tmp_path / "cap")
    sums = cap / "syscall" / CHECKSUMS
    sums.write_text(sums.read_text().splitlines()[0] + "\n")
    c = Capture.open(str(cap))
    assert c.read("syscall").column("tgid").to_pylist() == [TGID, TGID + 1] and c.problems == []
