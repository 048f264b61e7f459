"""The sampled mode's NFS counters: /proc/self/mountstats every interval, as deltas per mount,
per operation (ms_ops) and per transport (ms_xprt). Reading it never contacts the server: the
kernel prints counters it keeps in memory."""
from __future__ import annotations

import os

from slotscope.capture.mountstats import interval_rows, nfs_sections, parse_section, went_back

from .mounts import MountTable
from .samplers import pread_all


def _server(section: str, mountpoint: str, mounts: MountTable) -> str:
    """The server's address as the mount options give it (as in netdev), else the device's host."""
    mount = mounts.by_point.get(mountpoint)
    addr = mount.option("addr") if mount else None
    if addr:
        return addr
    source = section.split(None, 2)[1]
    return source[1:source.index("]")] if source.startswith("[") else source.partition(":")[0]


class MountstatsSampler:
    """Deltas of every NFS mount's counters since the previous sample. A mount seen for the first
    time (at the start, or mounted since), or whose counters went back, is a baseline: no rows
    until the next sample."""

    def __init__(self):
        # Kept open: a pread from 0 prints the file afresh.
        self._fd = os.open("/proc/self/mountstats", os.O_RDONLY | os.O_CLOEXEC)
        self._last: dict[str, tuple[int, dict]] = {}    # mountpoint -> (ts, parsed)
        self._servers: dict[str, str] = {}

    def sample(self, ts: int) -> tuple[list[dict], list[dict]]:
        """(MS_OPS rows, MS_XPRT rows) of the interval that ends at ts."""
        sections = nfs_sections(pread_all(self._fd).decode("utf-8", "replace"))
        return self.rows(ts, sections)

    def rows(self, ts: int, sections: dict[str, str]) -> tuple[list[dict], list[dict]]:
        if set(sections) - set(self._servers):
            mounts = MountTable.read()
            self._servers = {point: _server(text, point, mounts) for point, text in sections.items()}
        ops, xprts = [], []
        last, self._last = self._last, {}
        for point, text in sections.items():
            now = parse_section(text)
            self._last[point] = (ts, now)
            if point in last and not went_back(last[point][1], now):
                then_ts, then = last[point]
                got = interval_rows(then, now, ts, ts - then_ts, point, self._servers[point])
                ops += got[0]
                xprts += got[1]
        return ops, xprts

    def close(self) -> None:
        os.close(self._fd)

