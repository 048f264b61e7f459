"""The link counters the agent samples, parsed from /proc/net/dev."""
import pytest

from slotscope.agent.samplers import net_dev_counters

pytestmark = pytest.mark.unit

# A 6.1 kernel's /proc/net/dev: two header lines, then one line per interface.
NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    5060      58    0    0    0     0          0         0     5060      58    0    0    0     0       0          0
  eth0: 18446744073709551000 123456 1 2 3 4 5 6 9876543210 654321 0 0 0 0 0 0
veth-cli:  100 2 0 0 0 0 0 0 300 4 0 0 0 0 0 0
"""


def test_each_interface_gets_its_receive_and_transmit_bytes_and_packets():
    assert net_dev_counters(NET_DEV) == {
        "lo": (5060, 58, 5060, 58),
        "eth0": (18446744073709551000, 123456, 9876543210, 654321),    # 64-bit counters
        "veth-cli": (100, 2, 300, 4),                                    # no space after the colon
    }


def test_the_headers_and_a_short_line_are_not_interfaces():
    assert net_dev_counters(NET_DEV.splitlines()[0] + "\n" + NET_DEV.splitlines()[1] + "\n  bad: 1 2\n") == {}
