"""watch's rings are smaller than record's (their pages are all resident), and the kernel still
wakes the agent after as many events as in record, within watch's smaller ring."""
import os

import pytest

from slotscope.agent.probes import GROUPS, PAGE, Filters, ring_sizes
from slotscope.agent.ringbuf import record_size

pytestmark = pytest.mark.unit


def test_watch_rings_are_a_quarter_of_records_waking_as_often():
    for make in GROUPS:
        group = make()
        record, watch = ring_sizes(group, False), ring_sizes(group, True)
        for ring, (layout, pages, wake) in record.items():
            _, watch_pages, watch_wake = watch[ring]
            assert watch_pages * 4 == pages and watch_pages & (watch_pages - 1) == 0, ring   # a power of two
            assert watch_wake == wake, ring
            # all CPUs' events until their wakeups fill at most half of watch's ring
            assert wake * (os.cpu_count() or 1) <= watch_pages * PAGE // record_size(layout) // 2, ring


def test_the_ring_sizes_reach_the_c_side():
    group = next(make() for make in GROUPS if make().name == "sunrpc")
    _, pages, wake = ring_sizes(group, True)["rpc_ring"]
    flags = group.cflags(Filters(aggregate=True))
    assert f"-DRPC_RING_PAGES={pages}" in flags and f"-DRPC_RING_WAKE={wake}" in flags
    assert f"-DRPC_RING_PAGES={pages * 4}" in group.cflags(Filters())
