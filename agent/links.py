"""The network interfaces of the agent's own network namespace and their link speeds.

Asked over a socket (if_nameindex, ethtool's ioctl), not read from /sys/class/net: sysfs
shows the namespace of whoever mounted it, which is not the agent's when it runs in a
container's or another namespace's network (as under `nsenter --net`).
"""
from __future__ import annotations

import socket


def interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def speed_bps(iface: str) -> int | None:
    """The link speed from ethtool, None where the link has none (lo, most virtual links)."""
    from pyroute2.ethtool.ioctl import EthtoolError, IoctlEthtool
    try:
        tool = IoctlEthtool(iface)
        try:
            mbps = tool.get_link_settings().speed
        finally:
            tool.close()
    except (EthtoolError, OSError):
        return None
    return mbps * 1_000_000 if 0 < mbps < 0xFFFFFFFF else None   # ~0: SPEED_UNKNOWN
