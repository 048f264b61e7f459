"""The transports' time series for the TUI's slots & link panel: slot occupancy and the link's
rate from transport_table(), binned on the capture's time axis (ns since its start). A sampled
capture's slot figures are mountstats' per interval (ms_xprt)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slotscope.capture.meta import start_ns

from .job import Job
from .transports import occupancy_of, transport_table


@dataclass(frozen=True)
class LinkSeries:
    """The link toward a transport's server: its mean rate out and in per bin (bits/s)."""
    iface: str
    speed_bps: int | None            # its capacity, when the NIC says
    peak_bps: float
    tx: list[float]
    rx: list[float]


@dataclass(frozen=True)
class TransportSeries:
    """One transport on `bins` equal bins from the capture's start to `span_ns`. The slot
    figures are None when it has no slot samples."""
    host: str
    server: str | None
    limit: int | None                # the slots it may use
    bins: int
    span_ns: int
    in_use: list[float] | None = None         # mean in use per bin
    in_use_peak: list[float] | None = None    # the most in use at some time in each bin
    waiting: list[float] | None = None        # mean waiting for a slot per bin
    peak_in_use: int | None = None            # over the whole capture
    waiting_peak: int | None = None
    link: LinkSeries | None = None
    from_mountstats: bool = False    # a sampled capture's: the mean in use and waiting each send found, per
                                     # interval (mountstats' req_u and bklog_u), not each moment's


def step_mean(ts: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time-weighted mean per bin of a step function: values[i] holds from ts[i] (sorted) to
    ts[i + 1], the last one on; 0 before ts[0]."""
    if ts.size == 0:
        return np.zeros(edges.size - 1)
    v = values.astype(float)
    area = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(ts).astype(float))))
    k = np.searchsorted(ts, edges, side="right") - 1
    kk = np.clip(k, 0, None)
    integral = np.where(k < 0, 0.0, area[kk] + v[kk] * (edges - ts[kk]).astype(float))
    return np.diff(integral) / np.maximum(np.diff(edges).astype(float), 1.0)


def step_max(ts: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The largest value in force at some time inside each bin of a step function."""
    out = np.zeros(edges.size - 1)
    if ts.size == 0:
        return out
    first = np.searchsorted(ts, edges[:-1], side="right") - 1      # in force at the bin's start
    last = np.searchsorted(ts, edges[1:], side="left")             # steps starting before its end
    for i in range(out.size):
        lo, hi = max(first[i], 0), max(last[i], first[i] + 1)
        if hi > lo:
            out[i] = values[lo:hi].max()
    return out


def transport_series(job: Job, span_ns: int, bins: int) -> list[TransportSeries]:
    """Per transport of transport_table(): slot occupancy (mean and peak in use per bin, mean
    waiting for a slot) against its limit, and the link's mean rate out and in per bin against
    its capacity, on `bins` equal bins from the capture's start to `span_ns`."""
    if bins <= 0 or span_ns <= 0:
        return []
    edges = np.linspace(0, span_ns, bins + 1).astype(np.int64)
    out = []
    for t in transport_table(job, None):
        cap = next(c for c in job.captures if c.meta.get("host", "?") == t["host"])
        to_axis = job.utc_offset_ns(t["host"]) + start_ns(cap.meta)      # UTC ns -> since start
        limit = t["max_slots"] if not t["session_slots"] else min(t["max_slots"] or 1 << 30, t["session_slots"])
        slots = {}
        occ = occupancy_of(t)
        if occ is not None:
            ts = occ.ts - to_axis
            in_use = occ.cols["in_use"]
            waiting = occ.cols["backlog"] + occ.cols["session_wait"]
            slots = dict(in_use=step_mean(ts, in_use, edges).tolist(),
                         in_use_peak=step_max(ts, in_use, edges).tolist(),
                         waiting=step_mean(ts, waiting, edges).tolist(),
                         peak_in_use=int(np.ceil(in_use.max())), waiting_peak=int(np.ceil(waiting.max())),
                         from_mountstats="_counted" in t)
        link, rates = t["link"], None
        if link and link.get("_series") is not None and len(link["_series"][0]):
            ends, tx, rx = link["_series"]
            ends = np.asarray(ends, dtype=np.int64) - to_axis
            # each rate holds over the interval before its sample; the first as long as the next
            first = ends[0] - (ends[1] - ends[0] if ends.size > 1 else 1_000_000_000)
            starts = np.concatenate(([first], ends[:-1]))
            ts = np.concatenate((starts, [ends[-1]]))
            rates = LinkSeries(link["iface"], link["speed_bps"], link["peak_bps"],
                               tx=step_mean(ts, np.append(np.asarray(tx, float), 0.0), edges).tolist(),
                               rx=step_mean(ts, np.append(np.asarray(rx, float), 0.0), edges).tolist())
        out.append(TransportSeries(t["host"], t["server"], limit, bins, span_ns, **slots, link=rates))
    return out
