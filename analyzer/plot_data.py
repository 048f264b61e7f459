"""What the HTML report's plots show, computed from the job and the analysis result with
numpy and pyarrow only (plots.py draws it): the shared time axis and the data on it (the
saves marked on it, step series reduced to bins, the calls per rank, the blocked share per
time bin), the latency split per procedure, the write sizes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import WRITE_SYSCALLS

from .job import Job, utc_ns
from .ranks import rank_key, syscall_rows, with_identity
from .rpcs import split
from .transports import occupancy_of, transport_table

MAX_STEP_POINTS = 2000          # a longer step series is reduced to this many bins (mean and range)
MAX_TIME_PANELS = 6             # transports / links shown one above the other
HEATMAP_BINS = 600
MAX_SPLIT_PROCS = 20


@dataclass
class SaveSpan:
    """One save of the recording on the time axis, UTC ns (to the millisecond of the result's times)."""
    number: int
    start: int
    end: int


def save_spans(result: dict) -> list[SaveSpan]:
    return [SaveSpan(s["number"], utc_ns(s["start"]), utc_ns(s["end"])) for s in result.get("saves") or []]


@dataclass
class TimeContext:
    """The shared time axis: [x0, x1] in UTC ns, and the data drawn on it."""
    x0: int | None
    x1: int | None
    window: tuple[int, int] | None
    transports: list[dict]
    has_rpc: bool
    syscalls: pa.Table | None       # syscall rows with host, rank, solo, UTC times
    saves: list[SaveSpan]           # every time plot marks them

    @classmethod
    def of(cls, job: Job, result: dict) -> "TimeContext":
        window = None
        if result.get("window"):
            window = (utc_ns(result["window"]["start"]), utc_ns(result["window"]["end"]))
        saves = save_spans(result)
        sc = syscall_rows(job) if result["ranks"] else None
        if sc is not None:
            sc = with_identity(job, sc)
            sc = sc.append_column("enter_utc", job.to_utc(sc["host"], sc["ts_enter"]))
            sc = sc.append_column("exit_utc", job.to_utc(sc["host"], sc["ts_exit"]))
        if window:
            # the saves whole: one can start before the window (a directory made by a process
            # that writes nothing)
            lo = min([window[0]] + [s.start for s in saves])
            hi = max([window[1]] + [s.end for s in saves])
            pad = max((hi - lo) // 40, 200_000_000)
            x0, x1 = lo - pad, hi + pad
        else:
            x0 = x1 = None
        transports = transport_table(job, (x0, x1) if window else None)
        if not window:
            # no save window: everything there is
            lo, hi = [], []
            for t in transports:
                occ = occupancy_of(t)
                if occ is not None:
                    lo.append(int(occ.ts[0]))
                    hi.append(int(occ.ts[-1]))
                if t["link"]:
                    ts = t["link"]["_series"][0]
                    lo.append(int(ts[0]))
                    hi.append(int(ts[-1]))
            if sc is not None and sc.num_rows:
                lo.append(pc.min(sc["enter_utc"]).as_py())
                hi.append(pc.max(sc["exit_utc"]).as_py())
            if lo:
                x0, x1 = min(lo), max(hi)
                if x1 <= x0:
                    x1 = x0 + 1_000_000_000
                pad = max((x1 - x0) // 40, 200_000_000)
                x0, x1 = x0 - pad, x1 + pad
        return cls(x0, x1, window, transports, job.table("rpc") is not None, sc, saves)

    @property
    def origin(self) -> int:
        """Midnight UTC of the axis's first day: x = seconds since then, so ticks fall on round clock times."""
        return (self.x0 // 86_400_000_000_000) * 86_400_000_000_000

    def x(self, ns) -> np.ndarray:
        return (np.asarray(ns, dtype=np.int64) - self.origin) / 1e9

    @property
    def xlim(self) -> tuple[float, float]:
        return float(self.x(self.x0)), float(self.x(self.x1))


# --------------------------------------------------------------------------- step series

def _peak(values: np.ndarray) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else 0.0


@dataclass
class Steps:
    """A step function ready to draw with drawstyle steps-post: `value` holds from ts[i] to
    ts[i + 1] (UTC ns; the last point repeats the value at the end). When reduced, `value`
    is the time-weighted mean in each bin and [low, high] the range it took there."""
    ts: np.ndarray
    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    reduced: bool = False

    @property
    def peak(self) -> float:
        return _peak(self.high)


def steps(ts: np.ndarray, vals: np.ndarray, x0: int, x1: int, limit: int = MAX_STEP_POINTS) -> Steps:
    """A step function (vals[i] holds from ts[i] on) within [x0, x1]. Past `limit` steps it is
    reduced to `limit` equal bins (mean, min and max in each), so a 50k-row capture stays
    a small SVG while its peaks stay visible."""
    ts = np.asarray(ts, dtype=np.int64)
    vals = np.asarray(vals, dtype=float)
    first = max(int(np.searchsorted(ts, x0, side="right")) - 1, 0)
    last = int(np.searchsorted(ts, x1, side="right"))
    ts, vals = ts[first:last].copy(), vals[first:last]
    if ts.size == 0:
        return Steps(ts, vals, vals, vals)
    ts[0] = max(ts[0], x0)
    if ts.size <= limit:
        ts, vals = np.append(ts, max(x1, ts[-1])), np.append(vals, vals[-1])
        return Steps(ts, vals, vals, vals)
    edges = np.linspace(x0, x1, limit + 1).astype(np.int64)
    # the value in force at each bin's start (none before the first sample)...
    idx = np.searchsorted(ts, edges, side="right") - 1
    known = idx >= 0
    at_start = np.where(known[:-1], vals[np.clip(idx[:-1], 0, None)], np.nan)
    # ... and the ones starting inside it
    bins = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, limit - 1)
    high = np.full(limit, -np.inf)
    low = np.full(limit, np.inf)
    np.maximum.at(high, bins, vals)
    np.minimum.at(low, bins, vals)
    high = np.fmax(high, at_start)
    low = np.fmin(low, at_start)
    # time-weighted mean: the integral of the steps over each bin
    area = np.concatenate(([0.0], np.cumsum(vals[:-1] * np.diff(ts).astype(float))))
    i = np.clip(idx, 0, None)
    integral = np.where(known, area[i] + vals[i] * (edges - ts[i]), 0.0)
    covered = np.diff(np.where(known, edges - ts[0], 0)).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(covered > 0, np.diff(integral) / covered, np.nan)
    high[~np.isfinite(high)] = np.nan
    low[~np.isfinite(low)] = np.nan
    def pad(a: np.ndarray) -> np.ndarray:
        return np.append(a, a[-1])
    return Steps(edges, pad(mean), pad(low), pad(high), True)


# --------------------------------------------------------------------------- slots and links

@dataclass
class Occupancy:
    """One transport's slot table on the time axis."""
    transport: dict         # transport_table()'s entry on the axis: host, server, limits
    stats: dict             # the result's entry: its figures over the save
    in_use: Steps
    waiting: Steps


def occupancy(ctx: TimeContext, result: dict) -> tuple[list[Occupancy], int]:
    """The transports with slot samples (or a sampled capture's mountstats counters), the
    fullest first, at most MAX_TIME_PANELS of them; and how many more there are."""
    shown = [t for t in ctx.transports if occupancy_of(t) is not None] if ctx.x0 is not None else []
    shown.sort(key=lambda t: (-(t["saturated_fraction"] or 0), -(t["backlog_peak"] or 0), t["host"]))
    stats_of = {(t["host"], t["server"]): t for t in result["transports"]}
    out = []
    for t in shown[:MAX_TIME_PANELS]:
        occ = occupancy_of(t)
        out.append(Occupancy(t, stats_of.get((t["host"], t["server"]), t),
                             steps(occ.ts, occ.cols["in_use"], ctx.x0, ctx.x1),
                             steps(occ.ts, occ.cols["backlog"] + occ.cols["session_wait"], ctx.x0, ctx.x1)))
    return out, len(shown) - MAX_TIME_PANELS


@dataclass
class LinkRates:
    """One link toward a server on the time axis, in bits per second."""
    transport: dict         # transport_table()'s entry on the axis
    link: dict              # its link: iface, speed_bps
    peak_util: float | None     # over the save
    sent: Steps
    received: Steps


def link_rates(ctx: TimeContext, result: dict) -> tuple[list[LinkRates], int]:
    """The links with samples (each once), at most MAX_TIME_PANELS; and how many more there are."""
    links, seen = [], set()
    for t in ctx.transports if ctx.x0 is not None else []:
        link = t["link"]
        if link and (t["host"], link["iface"]) not in seen and len(link["_series"][0]):
            seen.add((t["host"], link["iface"]))
            links.append((t, link))
    stats_of = {(t["host"], t["server"]): t for t in result["transports"]}
    out = []
    for t, link in links[:MAX_TIME_PANELS]:
        end, tx, rx = (np.asarray(a) for a in link["_series"])
        # each rate holds over the sampling interval that ends at its sample
        dt = np.diff(end)
        start = np.concatenate(([end[0] - (int(np.median(dt)) if dt.size else 1_000_000_000)], end[:-1]))
        x_end = min(ctx.x1, int(end[-1]))
        util = stats_of.get((t["host"], t["server"]), t)["link"] or link
        out.append(LinkRates(t, link, util["peak_util"], steps(start, tx, ctx.x0, x_end),
                             steps(start, rx, ctx.x0, x_end)))
    return out, len(links) - MAX_TIME_PANELS


# --------------------------------------------------------------------------- ranks

@dataclass
class RankCalls:
    """The traced calls of the report's ranks that overlap the time axis, one entry each."""
    row: np.ndarray         # the rank's index in result["ranks"]
    enter: np.ndarray       # UTC ns
    leave: np.ndarray
    name: np.ndarray        # the syscall

    def by_time(self) -> list[str]:
        """The syscalls, the most time-consuming first."""
        totals: dict[str, int] = {}
        for name, d in zip(self.name, self.leave - self.enter):
            totals[name] = totals.get(name, 0) + int(d)
        return sorted(totals, key=lambda n: -totals[n])


def rank_calls(ctx: TimeContext, result: dict) -> RankCalls | None:
    """None when the capture has no traced syscalls of the report's ranks at all."""
    ranks = result["ranks"]
    sc = ctx.syscalls
    if ctx.x0 is None or sc is None or not sc.num_rows or not ranks:
        return None
    row_of = {rank_key(r): i for i, r in enumerate(ranks)}
    hosts = sc["host"].to_pylist()
    rank_col = sc["rank"].to_pylist()
    solo = sc["solo"].to_pylist()
    rows = np.array([row_of.get((h, r, s), -1) for h, r, s in zip(hosts, rank_col, solo)], dtype=np.int64)
    enter = sc["enter_utc"].to_numpy().astype(np.int64)
    leave = sc["exit_utc"].to_numpy().astype(np.int64)
    keep = (rows >= 0) & (leave >= ctx.x0) & (enter <= ctx.x1)
    names = np.asarray(sc["syscall"].to_pylist(), dtype=object)
    return RankCalls(rows[keep], enter[keep], leave[keep], names[keep])


def _busy_per_bin(enter: np.ndarray, leave: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time inside calls per bin (ns): sum over calls of their overlap with each bin."""
    a, b = np.sort(enter), np.sort(leave)
    ca = np.concatenate(([0], np.cumsum(a, dtype=np.float64)))
    cb = np.concatenate(([0], np.cumsum(b, dtype=np.float64)))
    na = np.searchsorted(a, edges, side="left")
    nb = np.searchsorted(b, edges, side="left")
    e = edges.astype(np.float64)
    covered = (na * e - ca[na]) - (nb * e - cb[nb])      # busy time before each edge
    return np.diff(covered)


def blocked_share(ctx: TimeContext, calls: RankCalls, ranks: int) -> np.ndarray:
    """Per rank (rows) and per time bin (HEATMAP_BINS over the axis), the share of the bin the
    rank spent inside syscalls."""
    edges = np.linspace(ctx.x0, ctx.x1, HEATMAP_BINS + 1).astype(np.int64)
    width = np.diff(edges).astype(np.float64)
    grid = np.zeros((ranks, HEATMAP_BINS))
    order = np.argsort(calls.row, kind="stable")
    bounds = np.searchsorted(calls.row[order], np.arange(ranks + 1))
    for r in range(ranks):
        sel = order[bounds[r]:bounds[r + 1]]
        if sel.size:
            grid[r] = np.clip(_busy_per_bin(calls.enter[sel], calls.leave[sel], edges) / width, 0, 1)
    return grid


# --------------------------------------------------------------------------- latency split

def latency_split(result: dict) -> list[tuple[str, int, dict[str, float]]]:
    """The procedures with completed RPCs, the slowest per RPC first, at most MAX_SPLIT_PROCS:
    (procedure, RPCs, its mean split: rpcs.split())."""
    rows = [(name, p["count"], split(p)) for name, p in result["rpc"]["by_proc"].items() if p.get("count")]
    rows.sort(key=lambda row: -row[2]["execute_ns"])
    return rows[:MAX_SPLIT_PROCS]


# --------------------------------------------------------------------------- write sizes

def write_sizes(job: Job, result: dict) -> tuple[np.ndarray, str]:
    """Sizes of the WRITE RPCs, or of the write calls of the report's ranks when the capture
    has no WRITE RPCs: (bytes, what they are)."""
    rpc = job.table("rpc")
    if rpc is not None:
        w = rpc.filter(pc.equal(rpc["procname"], "WRITE"))
        sizes = w["io_count"].to_numpy(zero_copy_only=False) if w.num_rows else np.array([])
        sizes = sizes[~np.isnan(sizes.astype(float))] if sizes.dtype.kind == "f" else sizes
        if sizes.size:
            return sizes.astype(np.int64), "WRITE RPCs"
    sc = syscall_rows(job)
    if sc is None or not result["ranks"]:
        return np.array([], dtype=np.int64), ""
    sc = sc.filter(pc.is_in(sc["syscall"], pa.array(WRITE_SYSCALLS)))
    sc = with_identity(job, sc)
    wanted = {rank_key(r) for r in result["ranks"]}
    keys = zip(sc["host"].to_pylist(), sc["rank"].to_pylist(), sc["solo"].to_pylist())
    mask = np.array([k in wanted for k in keys], dtype=bool)
    sizes = sc["bytes"].to_numpy(zero_copy_only=False)
    sizes = np.asarray(sizes, dtype=float)[mask] if sizes.size else sizes
    sizes = sizes[~np.isnan(sizes)] if sizes.size else sizes
    return sizes.astype(np.int64), "write calls (no WRITE RPCs in the capture)"


def size_histogram(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts of positive sizes in log2 buckets (bucket b: at least 2**b bytes, under twice
    that), at least three buckets wide: (b of each bucket, counts)."""
    buckets = np.floor(np.log2(sizes)).astype(int)
    lo, hi = int(buckets.min()), int(buckets.max())
    lo, hi = min(lo, hi - 2), max(hi, lo + 2)
    lo = max(lo, 0)
    span = np.arange(lo, hi + 1)
    return span, np.array([(buckets == b).sum() for b in span])
