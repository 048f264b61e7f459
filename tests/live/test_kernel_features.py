"""Feature probes of the running kernel, against the real bpf(2)."""
import os

import pytest

from slotscope.agent import kernel

pytestmark = pytest.mark.live


def test_ring_buffers_are_found_and_an_unknown_map_type_is_not():
    fds = len(os.listdir("/proc/self/fd"))
    assert kernel.bpf_ringbuf_supported() is True     # this kernel is 5.8+
    assert kernel._map_creatable(4096) is False        # no such map type: what a 5.4 kernel says of ring buffers
    assert len(os.listdir("/proc/self/fd")) == fds     # the probe map is closed again
