"""The agent gives back the memory its allocators keep after a burst (agent/memory.py)."""
import gc

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slotscope.agent.memory import give_back

pytestmark = pytest.mark.unit


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_what_a_burst_of_tables_freed_goes_back_to_the_kernel():
    """80 MB of Arrow buffers of 200 KB (a drain's columns), freed: the pool keeps their pages
    until give_back()."""
    base = pa.array(np.arange(25_000))
    before = rss_mib()
    held = [pc.add(base, i) for i in range(400)]
    grown = rss_mib() - before
    del held
    gc.collect()
    freed = rss_mib()
    give_back()
    assert freed - rss_mib() > grown / 2, f"{grown:.0f} MiB allocated, {freed - rss_mib():.0f} given back"
