"""The link counters the agent samples, parsed from /proc/net/dev, and how sampled rows reach the
capture (a table per kind and drain)."""
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


def test_sampled_rows_reach_the_capture_as_one_table_per_kind_and_drain():
    from slotscope.agent.samplers import SamplerThread
    from slotscope.capture.tables import KMSG, NETDEV
    thread = SamplerThread({})
    try:
        row = {"ts": 1, "iface": "eth0", "server": "10.0.0.1", "speed_bps": None, "tx_bytes": 5, "rx_bytes": 6,
               "tx_packets": 1, "rx_packets": 2}
        for ts in (1, 2, 3):
            thread.out.put(("netdev", [dict(row, ts=ts)]))
        thread.out.put(("kmsg", [{"ts": 9, "level": 3, "message": "nfs: server 10.0.0.1 not responding"}]))
        got = dict(thread.drain())
        assert got["netdev"].schema == NETDEV and got["netdev"]["ts"].to_pylist() == [1, 2, 3]
        assert got["kmsg"].schema == KMSG and got["kmsg"].num_rows == 1
        assert thread.drain() == []
    finally:
        thread.stop()


def test_each_sample_reads_the_counters_afresh():
    """The sampler keeps /proc/net/dev open and re-reads it from the start: a packet sent
    between two samples shows in the second. Also reads past its first chunk."""
    import socket

    from slotscope.agent.samplers import NetdevSampler, pread_all
    sampler = NetdevSampler()
    try:
        sampler.watch.changed()                   # as if routed: keep the route set below
        sampler.routes = {"127.0.0.1": ("lo", None)}
        first = sampler.sample()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x" * 1000, ("127.0.0.1", 9))
        sampler._last = 0.0                       # the next sample is due now
        second = sampler.sample()
        assert [r["iface"] for r in first] == ["lo"] == [r["iface"] for r in second]
        assert second[0]["tx_bytes"] >= first[0]["tx_bytes"] + 1000
        assert second[0]["tx_packets"] > first[0]["tx_packets"]
        whole = pread_all(sampler._net_dev)
        assert pread_all(sampler._net_dev, chunk=7).split(b"\n")[:2] == whole.split(b"\n")[:2]
    finally:
        sampler.close()


def test_a_failed_route_lookup_is_tried_again_without_a_change(monkeypatch):
    """Routes are looked up again when something changes; a lookup that failed (a netlink
    error, no route yet) is also tried again after RETRY s, as no change may announce it."""
    from slotscope.agent import samplers
    monkeypatch.setattr(samplers, "nfs_servers", lambda: ["127.0.0.1"])
    sampler = samplers.NetdevSampler()
    real_route, calls = sampler.ipr.route, []

    def route(*args, **kw):
        calls.append(args)
        if len(calls) == 1:
            raise OSError("netlink: transient failure")
        return real_route(*args, **kw)
    monkeypatch.setattr(sampler.ipr, "route", route)
    try:
        assert sampler.sample() == [] and len(calls) == 1     # the first look fails
        sampler._last = 0.0
        assert sampler.sample() == [] and len(calls) == 1     # too soon, and nothing changed
        sampler._last, sampler._retry_at = 0.0, 0.0           # RETRY s later
        rows = sampler.sample()
        assert len(calls) == 2 and [r["iface"] for r in rows] == ["lo"]
        sampler._last = 0.0
        sampler.sample()
        assert len(calls) == 2                                # routed: no more lookups
    finally:
        sampler.close()
