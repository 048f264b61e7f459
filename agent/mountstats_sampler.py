"""The sampled mode's NFS counters: /proc/self/mountstats every interval, as deltas per mount,
per operation (ms_ops) and per transport (ms_xprt). Reading it never contacts the server: the
kernel prints counters it keeps in memory."""
from __future__ import annotations

import os

from slotscope.capture.mountstats import OP_FIELDS, nfs_sections, parse_section

from .mounts import MountTable
from .samplers import pread_all

MS = 1_000_000      # mountstats counts times in whole ms
# The transport counters that are running totals (the rest are the port and a high-water mark).
XPRT_COUNTERS = ("connect_count", "sends", "recvs", "bad_xids", "req_u", "bklog_u", "sending_u", "pending_u")


def op_rows(ts: int, interval_ns: int, mount: str, server: str, before: dict, after: dict) -> list[dict]:
    """MS_OPS rows of one mount: the ops whose counters moved (no row: nothing happened)."""
    rows = []
    for op, now in after["ops"].items():
        then = before["ops"].get(op, dict.fromkeys(OP_FIELDS, 0))
        d = {k: now[k] - then[k] for k in OP_FIELDS}
        if any(d.values()):
            rows.append({"ts": ts, "interval_ns": interval_ns, "mount": mount, "server": server, "op": op,
                         "ops": d["ops"], "ntrans": d["ntrans"], "timeouts": d["timeouts"],
                         "bytes_sent": d["bytes_sent"], "bytes_recv": d["bytes_recv"],
                         "queue_ns": d["queue_ms"] * MS, "rtt_ns": d["rtt_ms"] * MS,
                         "execute_ns": d["execute_ms"] * MS, "errors": d["errors"]})
    return rows


def xprt_rows(ts: int, interval_ns: int, mount: str, server: str, before: dict, after: dict) -> list[dict]:
    """MS_XPRT rows of one mount, one per transport (nconnect) every interval: an interval with
    sends and no receives is an answer in itself. A transport is matched by its place in the
    list; one without a predecessor (new, or its counters went back) gives no row yet."""
    rows = []
    for n, (then, now) in enumerate(zip(before["xprt"], after["xprt"])):
        d = {k: now[k] - then[k] for k in XPRT_COUNTERS}
        if min(d.values()) < 0:
            continue
        rows.append({"ts": ts, "interval_ns": interval_ns, "mount": mount, "server": server, "xprt": n,
                     "srcport": now["srcport"], "max_slots": now["max_slots"], **d})
    return rows


def _went_back(before: dict, after: dict) -> bool:
    """Whether an op's counters are lower than before: a remount at the same point (a new baseline)."""
    return any(now[k] < before["ops"].get(op, now)[k] for op, now in after["ops"].items() for k in OP_FIELDS)


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
            if point in last and not _went_back(last[point][1], now):
                then_ts, then = last[point]
                args = (ts, ts - then_ts, point, self._servers[point], then, now)
                ops += op_rows(*args)
                xprts += xprt_rows(*args)
        return ops, xprts

    def close(self) -> None:
        os.close(self._fd)

