"""A job of many nodes holds more one-second segments than a process may open files: reading
them must not keep a file descriptor per segment (a memory map keeps one)."""
from __future__ import annotations

import os
import resource

import pytest

from slotscope.capture.reader import Capture
from slotscope.capture.writer import CaptureWriter
from unit_helpers import meta, sc, syscall_table

pytestmark = pytest.mark.unit

SEGMENTS = 120


def test_a_capture_of_more_segments_than_free_descriptors_is_read_whole(tmp_path):
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta("node-a"))
    for i in range(SEGMENTS):                       # one small segment a second, as the agent writes them
        w.append("syscall", syscall_table([sc(100, ts=1_000 + i * 1_000_000_000)]))
        w.tables["syscall"].close_segment()
    w.close()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    free = SEGMENTS // 2                            # fewer descriptors left than there are segments
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + free, hard))
    try:
        cap = Capture.open(path)
        table = cap.read("syscall")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert cap.problems == []
    assert table.num_rows == SEGMENTS
