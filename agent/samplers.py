"""Samplers the drain loop polls: NIC counters toward each NFS server, and the kernel log.

Neither touches the NFS mount: a route lookup and link statistics come over
netlink (pyroute2), the log from /dev/kmsg.
"""
from __future__ import annotations

import errno
import os
import queue
import select
import socket
import threading
import time

import pyarrow as pa

from slotscope.capture.kmsg import KmsgFilter
from slotscope.capture.tables import schema

from .links import speed_bps
from .mounts import MountTable


def _monotonic_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def nfs_servers() -> list[str]:
    servers = []
    for m in MountTable.read().nfs_mounts():
        addr = m.option("addr")
        if addr and addr not in servers:
            servers.append(addr)
    return servers


def net_dev_counters(text: str) -> dict[str, tuple[int, int, int, int]]:
    """/proc/net/dev -> {interface: (rx_bytes, rx_packets, tx_bytes, tx_packets)}."""
    counters = {}
    for line in text.splitlines()[2:]:
        name, _, data = line.partition(":")
        f = data.split()
        if len(f) >= 10:
            counters[name.strip()] = (int(f[0]), int(f[1]), int(f[8]), int(f[9]))
    return counters


# rtnetlink multicast groups (linux/rtnetlink.h): links, IPv4 and IPv6 addresses and routes
_RTMGRP = 0x1 | 0x10 | 0x40 | 0x100 | 0x400


class RouteWatch:
    """Whether the way to the NFS servers may have changed since the last look: mounts
    come and go (/proc/self/mountinfo polls POLLPRI after a change in the mount
    namespace), and routes, addresses and links change (rtnetlink notifications).
    The route lookups this spares ran every 5 s, 4% of the agent's CPU under emulation."""

    def __init__(self):
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                                   socket.NETLINK_ROUTE)
        self._sock.bind((0, _RTMGRP))
        self._mounts = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._mounts, select.POLLPRI | select.POLLERR)
        self._first = True

    def changed(self) -> bool:
        changed, self._first = self._first or bool(self._poll.poll(0)), False
        while True:
            try:
                self._sock.recv(65536)
            except BlockingIOError:
                return changed
            except OSError:   # ENOBUFS: notifications were dropped, so something changed
                return True
            changed = True

    def close(self) -> None:
        self._sock.close()
        os.close(self._mounts)


class NetdevSampler:
    """Byte and packet counters of the interface each NFS server is routed through: the
    route from netlink (again whenever a mount, route, address or link changes), the
    counters from /proc/net/dev (the reader's own network namespace, as netlink's; a tenth
    of the cost of parsing a netlink link dump, which under emulation was a sizeable share
    of an idle agent's CPU)."""

    EVERY = 0.2       # s between samples
    RETRY = 5.0       # s before looking up again a route whose lookup failed (no change may announce it)

    def __init__(self):
        from pyroute2 import IPRoute  # netlink, no subprocess
        self.ipr = IPRoute()
        self.watch = RouteWatch()
        self.routes: dict[str, tuple[str, int | None]] = {}   # server -> (interface, speed)
        self._last = 0.0
        self._retry_at: float | None = None   # set while a server's route lookup failed
        # Kept open: a pread from 0 regenerates the file, a third of the cost of opening it.
        self._net_dev = os.open("/proc/net/dev", os.O_RDONLY | os.O_CLOEXEC)

    def _reroute(self, now: float) -> None:
        self.routes, self._retry_at = {}, None
        for server in nfs_servers():
            try:
                [route] = self.ipr.route("get", dst=server)[:1]
                index = route.get_attr("RTA_OIF")
                [link] = self.ipr.get_links(index)[:1]
            except Exception:  # an unroutable server or a netlink error must not stop recording
                self._retry_at = now + self.RETRY
                continue
            name = link.get_attr("IFLA_IFNAME")
            self.routes[server] = (name, speed_bps(name))

    def sample(self) -> list[dict]:
        """The NETDEV rows of one sample (none before EVERY s have passed)."""
        now = time.monotonic()
        if now - self._last < self.EVERY:
            return []
        self._last = now
        if self.watch.changed() or (self._retry_at is not None and now >= self._retry_at):
            self._reroute(now)
        if not self.routes:
            return []
        ts = _monotonic_ns()
        counters = net_dev_counters(pread_all(self._net_dev).decode(errors="replace"))
        rows = []
        for server, (name, speed) in self.routes.items():
            if name not in counters:
                continue
            rx_bytes, rx_packets, tx_bytes, tx_packets = counters[name]
            rows.append({"ts": ts, "iface": name, "server": server, "speed_bps": speed,
                         "tx_bytes": tx_bytes, "rx_bytes": rx_bytes,
                         "tx_packets": tx_packets, "rx_packets": rx_packets})
        return rows

    def close(self) -> None:
        self.ipr.close()
        self.watch.close()
        os.close(self._net_dev)


def pread_all(fd: int, chunk: int = 65536) -> bytes:
    """A /proc file kept open, read whole from its start (which regenerates it)."""
    parts = [os.pread(fd, chunk, 0)]
    while len(parts[-1]) == chunk:
        parts.append(os.pread(fd, chunk, chunk * len(parts)))
    return b"".join(parts)


class KmsgReader:
    """NFS/RPC lines of the kernel log from the moment recording starts. /dev/kmsg
    stamps records with the kernel's local clock in µs, which is CLOCK_MONOTONIC
    on machines that have not suspended."""

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)
        self.keep = KmsgFilter().keep

    def read(self) -> list[dict]:
        """KMSG rows of the lines logged since the last read."""
        rows = []
        while True:
            try:
                raw = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:   # overwritten before we read it: skip on
                    continue
                raise
            head, _, message = raw.decode("utf-8", "replace").partition(";")
            message = message.split("\n", 1)[0]
            fields = head.split(",")
            if len(fields) < 3 or not self.keep(message):
                continue
            rows.append({"ts": int(fields[2]) * 1000, "level": int(fields[0]) & 7, "message": message})
        return rows

    def close(self) -> None:
        os.close(self.fd)


class SamplerThread:
    """Runs the samplers on their own clock, so a slow drain (a storm, or emulation)
    leaves no gap in the link counters. Rows go to `out`; the drain thread, the capture's
    only writer, makes one table of each kind per drain (a table per sample, five a second,
    was a tenth of the agent's CPU under emulation)."""

    TABLES = ("netdev", "kmsg")     # what it samples into

    def __init__(self, samplers: dict):
        self.samplers = samplers
        self.out: queue.Queue[tuple[str, list[dict]]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slotscope-samplers")
        self._thread.start()

    def _run(self) -> None:
        next_kmsg = 0.0
        while not self._stop.wait(NetdevSampler.EVERY):
            try:
                got = [("netdev", self.samplers["netdev"].sample())] if "netdev" in self.samplers else []
                if "kmsg" in self.samplers and time.monotonic() >= next_kmsg:
                    next_kmsg = time.monotonic() + 1.0
                    got.append(("kmsg", self.samplers["kmsg"].read()))
                for name, rows in got:
                    if rows:
                        self.out.put((name, rows))
            except Exception:  # a sampler failing must not stop the recording
                continue

    def drain(self) -> list[tuple[str, pa.Table]]:
        """(name, table) of the rows sampled since the last drain, a table per kind."""
        rows: dict[str, list[dict]] = {}
        while True:
            try:
                name, got = self.out.get_nowait()
            except queue.Empty:
                break
            rows.setdefault(name, []).extend(got)
        return [(name, pa.Table.from_pylist(r, schema=schema(name))) for name, r in rows.items() if r]

    def stop(self) -> list[tuple[str, pa.Table]]:
        self._stop.set()
        self._thread.join(timeout=5)
        for sampler in self.samplers.values():
            sampler.close()
        return self.drain()
