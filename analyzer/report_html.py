"""The HTML report of an analysis: one self-contained file (inline CSS, plots as inline SVG,
no scripts, nothing fetched) with the content of the terminal report and five plots.

Three plots share one UTC time axis, stacked and aligned (same x range, same axes width and
left edge): slot occupancy against the limit per transport, link utilisation against
capacity, and what each rank was blocked in. Two are not on the time axis: the latency
split per procedure and the WRITE size histogram.

matplotlib is imported inside write_html() only, so importing the analyzer stays light.
"""
from __future__ import annotations

import errno
import html
import io
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import FLUSH_SYSCALLS, METADATA_SYSCALLS, OPEN_SYSCALLS, WRITE_SYSCALLS

from .job import Job, utc_ns
from .ranks import rank_key, syscall_rows, with_identity
from .report_text import _value, rank_ranges
from .units import clock, ms, pct, round_rate, seconds, size
from .transports import transport_table

# Layout of the time plots, in inches: every one has the same width and margins, so their
# axes line up when the SVGs are stacked at their natural size.
FIG_W = 11.0
LEFT_IN, RIGHT_IN = 1.15, 2.05
TOP_IN, BOTTOM_IN, GAP_IN = 0.32, 0.42, 0.42
MAX_STEP_POINTS = 2000          # a step series is reduced to per-bin maxima past this many steps
MAX_BARS_VECTOR = 3000          # more syscall bars than this are drawn as one embedded image
HEATMAP_RANKS = 64              # more ranks than this: blocked share per time bin, not bars
HEATMAP_BINS = 600
MAX_TIME_PANELS = 6             # transports / links drawn one above the other
MAX_RANK_TABLE_ROWS = 256
MAX_NESTED_ROWS = 16
SEVERITY_ORDER = ("critical", "warning", "info")

# Colours: syscalls by what they do, one colour per group (a call in two groups, as the open
# calls that are metadata too, takes the first group's); the occupancy/link series.
GROUP_COLOURS = ((WRITE_SYSCALLS, "#1f77b4"), (FLUSH_SYSCALLS, "#d62728"), (OPEN_SYSCALLS, "#2ca02c"),
                 (METADATA_SYSCALLS, "#9467bd"))
SYSCALL_COLOURS = {name: colour for group, colour in reversed(GROUP_COLOURS) for name in group}
EXTRA_COLOURS = ("#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d")
C_IN_USE, C_WAITING, C_LIMIT, C_SESSION = "#1f77b4", "#ff7f0e", "#d62728", "#9467bd"
C_TX, C_RX, C_CAPACITY, C_WINDOW = "#1f77b4", "#2ca02c", "#d62728", "#555555"
SPLIT = (("slot_wait_ns", "slot wait", "#ff7f0e"), ("transmit_wait_ns", "transmit wait", "#bcbd22"),
         ("rtt_ns", "round trip (rtt)", "#1f77b4"), (None, "rest of execute", "#9aa5b1"))


@dataclass
class Plot:
    """One plot of the report: an inline SVG, or a note saying why there is none."""
    name: str
    title: str
    svg: str | None = None
    note: str | None = None
    caption: str = ""
    # time plots: the x range of every axes in the figure (UTC ns) and the axes' left and right
    # edges as fractions of the figure width (equal for all time plots: they line up)
    xlims: list[tuple[int, int]] = field(default_factory=list)
    axes_x: list[tuple[float, float]] = field(default_factory=list)


# --------------------------------------------------------------------------- entry point

def write_html(job: Job, result: dict, path: str) -> None:
    """Write the report of `result` (analyze(job, ...)) to `path`, replacing it whole: the
    file is written next to it and renamed over it. OSError when it cannot be written."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, f"no such directory: {parent}", path)
    text = render_html(job, result)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def render_html(job: Job, result: dict) -> str:
    plots = build_plots(job, result)
    return _page(result, plots)


# --------------------------------------------------------------------------- plots

def build_plots(job: Job, result: dict) -> dict[str, Plot]:
    """The five plots (SVG or a note each), keyed occupancy, link, ranks, latency, sizes."""
    import matplotlib
    rc = {"svg.fonttype": "none", "svg.hashsalt": "slotscope", "font.family": "DejaVu Sans",
          "font.size": 9, "axes.titlesize": 9.5, "axes.titleweight": "bold", "axes.labelsize": 9,
          "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8, "legend.frameon": False,
          "axes.spines.top": False, "axes.spines.right": False, "text.parse_math": False,
          "path.simplify": True, "image.interpolation": "nearest"}
    with matplotlib.rc_context(rc):
        ctx = _TimeContext.of(job, result)
        return {
            "occupancy": _occupancy_plot(ctx, result),
            "link": _link_plot(ctx, result),
            "ranks": _rank_plot(ctx, job, result),
            "latency": _latency_plot(result),
            "sizes": _size_plot(job, result),
        }


@dataclass
class _TimeContext:
    """The shared time axis: [x0, x1] in UTC ns, and the data drawn on it."""
    x0: int | None
    x1: int | None
    window: tuple[int, int] | None
    transports: list[dict]
    has_rpc: bool
    syscalls: pa.Table | None       # syscall rows with host, rank, solo, UTC times

    @classmethod
    def of(cls, job: Job, result: dict) -> "_TimeContext":
        window = None
        if result.get("window"):
            window = (utc_ns(result["window"]["start"]), utc_ns(result["window"]["end"]))
        sc = syscall_rows(job) if result["ranks"] else None
        if sc is not None:
            sc = with_identity(job, sc)
            sc = sc.append_column("enter_utc", job.to_utc(sc["host"], sc["ts_enter"]))
            sc = sc.append_column("exit_utc", job.to_utc(sc["host"], sc["ts_exit"]))
        if window:
            pad = max((window[1] - window[0]) // 40, 200_000_000)
            x0, x1 = window[0] - pad, window[1] + pad
        else:
            x0 = x1 = None
        transports = transport_table(job, (x0, x1) if window else None)
        if not window:
            # no save window: everything there is
            lo, hi = [], []
            for t in transports:
                if "_occupancy" in t:
                    lo.append(int(t["_occupancy"].ts[0]))
                    hi.append(int(t["_occupancy"].ts[-1]))
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
        return cls(x0, x1, window, transports, job.table("rpc") is not None, sc)

    @property
    def origin(self) -> int:
        """Midnight UTC of the axis's first day: x = seconds since then, so ticks fall on round clock times."""
        return (self.x0 // 86_400_000_000_000) * 86_400_000_000_000

    def x(self, ns) -> np.ndarray:
        return (np.asarray(ns, dtype=np.int64) - self.origin) / 1e9

    @property
    def xlim(self) -> tuple[float, float]:
        return float(self.x(self.x0)), float(self.x(self.x1))


def _tick_step(span_s: float, ticks: int = 9) -> float:
    for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300,
                 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):
        if span_s / step <= ticks:
            return step
    return 86400 * math.ceil(span_s / ticks / 86400)


def _time_figure(ctx: _TimeContext, heights: list[float]):
    """A figure of stacked axes on the shared time axis, laid out in absolute inches so every
    time plot has the same axes position across figures."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MultipleLocator
    h = TOP_IN + BOTTOM_IN + sum(heights) + GAP_IN * (len(heights) - 1)
    fig = Figure(figsize=(FIG_W, h))
    axes = []
    top = h - TOP_IN
    lo, hi = ctx.xlim
    step = _tick_step(hi - lo)
    decimals = 0 if step >= 1 else max(0, -int(math.floor(math.log10(step))))
    # x is seconds since midnight UTC; ticks sit at float multiples of the step: to the ns first
    tick_clock = FuncFormatter(lambda v, _pos: clock(round(v * 1e9), decimals))

    for height in heights:
        bottom = top - height
        ax = fig.add_axes((LEFT_IN / FIG_W, bottom / h, (FIG_W - LEFT_IN - RIGHT_IN) / FIG_W, height / h))
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(MultipleLocator(step))
        ax.xaxis.set_major_formatter(tick_clock)
        ax.grid(axis="x", color="#e3e3e3", linewidth=0.6)
        ax.set_axisbelow(True)
        if ctx.window:
            for edge in ctx.window:
                ax.axvline(float(ctx.x(edge)), color=C_WINDOW, linestyle=(0, (4, 3)), linewidth=0.8, zorder=1)
        axes.append(ax)
        top = bottom - GAP_IN
    return fig, axes


def _finish_panels(plot: Plot, fig, axes, ctx: _TimeContext, tag: str, more: int, more_what: str,
                   reduced: bool) -> Plot:
    """A time plot of stacked panels (one per transport or link): one time axis label at the
    bottom, and captions for the panels left out and the series reduced to bins."""
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel(_axis_label(ctx))
    if more > 0:
        plot.caption += f"{more} more {more_what}. "
    if reduced:
        plot.caption += (f"Long series are reduced to {MAX_STEP_POINTS} time bins: the line is the mean "
                         "in each bin, the band the range it took there. ")
    return _finish_time_plot(plot, fig, axes, ctx, tag)


def _finish_time_plot(plot: Plot, fig, axes, ctx: _TimeContext, tag: str) -> Plot:
    for ax in axes:
        ax.set_xlim(*ctx.xlim)          # nothing drawn may have moved it
        lo, hi = ax.get_xlim()
        plot.xlims.append((int(round(lo * 1e9)) + ctx.origin, int(round(hi * 1e9)) + ctx.origin))
        pos = ax.get_position()
        plot.axes_x.append((round(pos.x0, 6), round(pos.x1, 6)))
    plot.svg = _svg(fig, tag)
    return plot


def _svg(fig, tag: str) -> str:
    """The figure as an inline <svg> element: no XML prologue, no metadata, ids unique to
    this figure (several SVGs live in one document)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Format": None, "Type": None, "Creator": None, "Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # only inside tags: text from the capture never holds a raw '<'
    tags = re.compile(r"<[^<>]*>")
    ids = {m for t in tags.findall(text) for m in re.findall(r'\sid="([^"]+)"', t)}

    def rename(m: re.Match) -> str:
        t = re.sub(r'(\sid=")([^"]+)"', lambda i: f'{i.group(1)}{tag}-{i.group(2)}"', m.group(0))
        return re.sub(r'(url\(#|href="#)([^")]+)',
                      lambda r: f"{r.group(1)}{tag}-{r.group(2)}" if r.group(2) in ids else r.group(0), t)
    text = tags.sub(rename, text)
    return text.replace("<svg ", f'<svg class="plot-svg" role="img" aria-label="{tag}" ', 1)


def _peak(values: np.ndarray) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else 0.0


def _mpl(text) -> str:
    """A string from the capture, safe as matplotlib text (no mathtext, one line)."""
    return str(text).replace("$", r"\$").replace("\n", " ")[:80]


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


def _steps(ts: np.ndarray, vals: np.ndarray, x0: int, x1: int, limit: int = MAX_STEP_POINTS) -> Steps:
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


def _draw_steps(ax, ctx: "_TimeContext", st: Steps, colour: str, label: str, width: float,
                fill: bool = False) -> None:
    x = ctx.x(st.ts)
    if st.reduced:
        ax.fill_between(x, st.low, st.high, step="post", color=colour, alpha=0.22, linewidth=0,
                        zorder=2)
    elif fill:
        ax.fill_between(x, st.value, step="post", color=colour, alpha=0.2, linewidth=0, zorder=2)
    ax.step(x, st.value, where="post", color=colour, linewidth=width, label=label, zorder=3)


# --- (1) slot occupancy

def _occupancy_plot(ctx: _TimeContext, result: dict) -> Plot:
    plot = Plot("occupancy", "Slot occupancy against the limit, per transport")
    shown = [t for t in ctx.transports if "_occupancy" in t]
    if ctx.x0 is None or not shown:
        plot.note = ("no RPC data: slot occupancy needs the sunrpc probes (a kernel with NFS)"
                     if not ctx.has_rpc else "no slot-table samples in this capture")
        return plot
    shown.sort(key=lambda t: (-(t["saturated_fraction"] or 0), -(t["backlog_peak"] or 0), t["host"]))
    more = len(shown) - MAX_TIME_PANELS
    shown = shown[:MAX_TIME_PANELS]
    from matplotlib.ticker import MaxNLocator
    stats_of = {(t["host"], t["server"]): t for t in result["transports"]}
    fig, axes = _time_figure(ctx, [1.55] * len(shown))
    reduced = False
    for t, ax in zip(shown, axes):
        occ = t["_occupancy"]
        stats = stats_of.get((t["host"], t["server"]), t)
        in_use = _steps(occ.ts, occ.cols["in_use"], ctx.x0, ctx.x1)
        waiting = _steps(occ.ts, occ.cols["backlog"] + occ.cols["session_wait"], ctx.x0, ctx.x1)
        reduced |= in_use.reduced or waiting.reduced
        _draw_steps(ax, ctx, waiting, C_WAITING, "waiting for a slot", 0.9, fill=True)
        _draw_steps(ax, ctx, in_use, C_IN_USE, "slots in use", 1.3)
        top = max(in_use.peak, waiting.peak, 1.0)
        if t["max_slots"]:
            ax.axhline(t["max_slots"], color=C_LIMIT, linestyle=(0, (5, 4)), linewidth=1.1, zorder=4,
                       label=f"limit: {t['max_slots']} transport slots")
            top = max(top, t["max_slots"])
        if t.get("session_slots"):
            ax.axhline(t["session_slots"], color=C_SESSION, linestyle=":", linewidth=1.1, zorder=4,
                       label=f"limit: {t['session_slots']} session slots")
            top = max(top, t["session_slots"])
        ax.set_ylim(0, top * 1.15 + 0.3)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax.set_ylabel("RPCs")
        full = ("" if stats["saturated_fraction"] is None
                else f"  (full {100 * stats['saturated_fraction']:.0f}% of the save window)")
        limit = "" if t["max_slots"] else "  limit unknown"
        ax.set_title(_mpl(f"{t['host']} → {t['server'] or '?'}") + full + limit, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _finish_panels(plot, fig, axes, ctx, "occupancy", more, "transports are in the table below", reduced)


def _axis_label(ctx: _TimeContext) -> str:
    day = datetime.fromtimestamp(ctx.origin / 1e9, timezone.utc).strftime("%Y-%m-%d")
    return f"time (UTC, {day})" + ("   dashed: the save window" if ctx.window else "")


# --- (2) link utilisation

def _link_plot(ctx: _TimeContext, result: dict) -> Plot:
    plot = Plot("link", "Link utilisation against capacity")
    links, seen = [], set()
    for t in ctx.transports:
        link = t["link"]
        if link and (t["host"], link["iface"]) not in seen and len(link["_series"][0]):
            seen.add((t["host"], link["iface"]))
            links.append((t, link))
    if ctx.x0 is None or not links:
        if not ctx.has_rpc:
            plot.note = "no RPC data: the link toward an NFS server is found from its RPCs"
        elif not ctx.transports:
            plot.note = "no NFS transport in this capture"
        else:
            plot.note = "no link samples (netdev) toward the servers in this capture"
        return plot
    more = len(links) - MAX_TIME_PANELS
    links = links[:MAX_TIME_PANELS]
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter
    stats_of = {(t["host"], t["server"]): t for t in result["transports"]}
    fig, axes = _time_figure(ctx, [1.45] * len(links))
    reduced = False
    for (t, link), ax in zip(links, axes):
        end, tx, rx = (np.asarray(a) for a in link["_series"])
        # each rate holds over the sampling interval that ends at its sample
        dt = np.diff(end)
        start = np.concatenate(([end[0] - (int(np.median(dt)) if dt.size else 1_000_000_000)], end[:-1]))
        x_end = min(ctx.x1, int(end[-1]))
        sent, recv = _steps(start, tx, ctx.x0, x_end), _steps(start, rx, ctx.x0, x_end)
        reduced |= sent.reduced or recv.reduced
        speed = link["speed_bps"]
        data_peak = max(sent.peak, recv.peak, 1.0)
        # traffic far below the capacity would be a flat line at zero: log scale then
        log = bool(speed) and data_peak < 0.05 * speed
        _draw_steps(ax, ctx, sent, C_TX, "sent (tx)", 1.1)
        _draw_steps(ax, ctx, recv, C_RX, "received (rx)", 1.0)
        if speed:
            ax.axhline(speed, color=C_CAPACITY, linestyle=(0, (5, 4)), linewidth=1.1, zorder=4,
                       label=f"capacity {round_rate(speed)}")
            util = stats_of.get((t["host"], t["server"]), t)["link"] or link
            util = "" if util["peak_util"] is None else f"  (peak {100 * util['peak_util']:.1f}% of capacity)"
        else:
            ax.text(0.99, 0.92, "capacity unknown (the interface reports no speed)", transform=ax.transAxes,
                    ha="right", va="top", fontsize=8, color="#444444", zorder=5,
                    bbox={"boxstyle": "round,pad=0.25", "facecolor": "#fff6d5", "edgecolor": "#e0c060"})
            util = "  capacity unknown"
        if log:
            ax.set_yscale("log")
            positive = np.concatenate([a[np.isfinite(a) & (a > 0)] for a in (sent.low, recv.low, sent.value)])
            floor = max(float(positive.min()) / 2 if positive.size else 1e3, speed / 1e7, 1.0)
            ax.set_ylim(floor, speed * 2.5)
            util += "  log scale"
        else:
            ax.set_ylim(0, max(data_peak, float(speed or 0)) * (1.12 if speed else 1.3))
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: round_rate(v)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("bits/s")
        ax.set_title(_mpl(f"{t['host']} {link['iface']} → {t['server'] or '?'}") + util, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _finish_panels(plot, fig, axes, ctx, "link", more, "links are in the transport table", reduced)


# --- (3) per-rank blocked time

def _rank_label(r: dict, many_hosts: bool) -> str:
    name = f"rank {r['rank']}" if r["rank"] is not None else f"pid {r['pids'][0]}"
    return _mpl(f"{r['host']} {name}" if many_hosts else name)


def _rank_plot(ctx: _TimeContext, job: Job, result: dict) -> Plot:
    plot = Plot("ranks", "What each rank was blocked in")
    ranks = result["ranks"]
    sc = ctx.syscalls
    if ctx.x0 is None or sc is None or not sc.num_rows or not ranks:
        plot.note = "no traced syscalls on matching files: nothing to draw per rank"
        return plot
    row_of = {rank_key(r): i for i, r in enumerate(ranks)}
    hosts = sc["host"].to_pylist()
    rank_col = sc["rank"].to_pylist()
    solo = sc["solo"].to_pylist()
    rows = np.array([row_of.get((h, r, s), -1) for h, r, s in zip(hosts, rank_col, solo)], dtype=np.int64)
    enter = sc["enter_utc"].to_numpy().astype(np.int64)
    leave = sc["exit_utc"].to_numpy().astype(np.int64)
    keep = (rows >= 0) & (leave >= ctx.x0) & (enter <= ctx.x1)
    names = np.asarray(sc["syscall"].to_pylist(), dtype=object)
    rows, enter, leave, names = rows[keep], enter[keep], leave[keep], names[keep]
    many_hosts = len({r["host"] for r in ranks}) > 1
    labels = [_rank_label(r, many_hosts) for r in ranks]
    if len(ranks) > HEATMAP_RANKS:
        return _rank_heatmap(plot, ctx, rows, enter, leave, labels)
    if not rows.size:
        plot.note = "no syscalls of these ranks in the time range"
        return plot
    # colour per syscall, the most time-consuming first in the legend
    totals: dict[str, int] = {}
    for name, d in zip(names, leave - enter):
        totals[name] = totals.get(name, 0) + int(d)
    order = sorted(totals, key=lambda n: -totals[n])
    colours, extra = {}, iter(EXTRA_COLOURS)
    for name in order:
        colours[name] = SYSCALL_COLOURS.get(name) or next(extra, "#7f7f7f")
    n = len(ranks)
    row_h = 0.24 if n <= 12 else max(0.13, 3.2 / n)
    fig, (ax,) = _time_figure(ctx, [max(1.0, row_h * n + 0.3)])
    lo, hi = ctx.xlim
    min_w = (hi - lo) / 1500              # a call shorter than a pixel still shows
    x_start = ctx.x(enter)
    widths = np.maximum((leave - enter) / 1e9, min_w)
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch
    dense = rows.size > MAX_BARS_VECTOR
    for name in order:
        sel = names == name
        xs, ws, ys = x_start[sel], widths[sel], rows[sel].astype(float)
        verts = np.stack([np.column_stack([xs, ys - 0.38]), np.column_stack([xs + ws, ys - 0.38]),
                          np.column_stack([xs + ws, ys + 0.38]), np.column_stack([xs, ys + 0.38])], axis=1)
        coll = PolyCollection(verts, facecolors=colours[name], edgecolors="none", linewidths=0,
                              rasterized=dense)
        ax.add_collection(coll)
    ax.set_ylim(n - 0.5, -0.5)
    step = max(1, math.ceil(n / 24))
    ax.set_yticks(range(0, n, step))
    ax.set_yticklabels(labels[::step])
    ax.tick_params(axis="y", length=0)
    ax.spines["left"].set_visible(False)
    shown = order[:12]
    handles = [Patch(facecolor=colours[nm], label=nm) for nm in shown]
    if len(order) > len(shown):
        handles.append(Patch(facecolor="#ffffff", edgecolor="#999999", label=f"+{len(order) - len(shown)} more"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
              title="in syscall", title_fontsize=8, alignment="left")
    ax.set_title("bars: the syscalls in progress, per rank (one row each)", loc="left")
    ax.set_xlabel(_axis_label(ctx))
    if dense:
        plot.caption += f"{rows.size:,} calls: drawn as an image. "
    return _finish_time_plot(plot, fig, [ax], ctx, "ranks")


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


def _rank_heatmap(plot: Plot, ctx: _TimeContext, rows, enter, leave, labels) -> Plot:
    n = len(labels)
    edges = np.linspace(ctx.x0, ctx.x1, HEATMAP_BINS + 1).astype(np.int64)
    width = np.diff(edges).astype(np.float64)
    grid = np.zeros((n, HEATMAP_BINS))
    order = np.argsort(rows, kind="stable")
    rows_s = rows[order]
    bounds = np.searchsorted(rows_s, np.arange(n + 1))
    for r in range(n):
        sel = order[bounds[r]:bounds[r + 1]]
        if sel.size:
            grid[r] = np.clip(_busy_per_bin(enter[sel], leave[sel], edges) / width, 0, 1)
    fig, (ax,) = _time_figure(ctx, [4.8])
    lo, hi = ctx.xlim
    from matplotlib.colors import LinearSegmentedColormap
    cmap = LinearSegmentedColormap.from_list("blocked", ["#ffffff", "#fdd49e", "#fc8d59", "#d7301f", "#7f0000"])
    img = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=1, extent=(lo, hi, n - 0.5, -0.5),
                    interpolation="nearest", rasterized=True)
    ax.set_xlim(lo, hi)
    ticks = np.unique(np.linspace(0, n - 1, 12).round().astype(int))
    ax.set_yticks(ticks)
    ax.set_yticklabels([labels[i] for i in ticks])
    ax.set_ylabel(f"{n} ranks")
    pos = ax.get_position()
    cax = fig.add_axes((pos.x1 + 0.2 / FIG_W, pos.y0, 0.14 / FIG_W, pos.height))
    bar = fig.colorbar(img, cax=cax)
    bar.set_label("share of each time bin spent in syscalls")
    ax.set_title(f"blocked share per rank and time bin ({n} ranks, {HEATMAP_BINS} bins)", loc="left")
    ax.set_xlabel(_axis_label(ctx))
    plot.caption += (f"More than {HEATMAP_RANKS} ranks: each row is a rank, each column 1/{HEATMAP_BINS} "
                     "of the time range, the colour how much of it the rank spent inside syscalls. ")
    return _finish_time_plot(plot, fig, [ax], ctx, "ranks")


# --- (4) latency split per procedure

def _latency_plot(result: dict) -> Plot:
    plot = Plot("latency", "RPC latency split per procedure (mean per RPC)")
    procs = [(name, p) for name, p in result["rpc"]["by_proc"].items() if p.get("count")]
    if not procs:
        plot.note = ("no RPC data: the latency split needs the sunrpc probes (a kernel with NFS)"
                     if not result["rpc"]["by_proc"] else "no completed RPCs")
        return plot
    procs.sort(key=lambda kv: -kv[1]["execute_ns"] / kv[1]["count"])
    procs = procs[:20]
    from matplotlib.figure import Figure
    n = len(procs)
    h = 0.75 + 0.34 * n
    fig = Figure(figsize=(FIG_W, h))
    ax = fig.add_axes((LEFT_IN / FIG_W, 0.5 / h, (FIG_W - LEFT_IN - RIGHT_IN) / FIG_W, (h - 0.65) / h))
    y = np.arange(n)
    left = np.zeros(n)
    per = {}
    for key, _label, _c in SPLIT:
        if key:
            per[key] = np.array([p[key] / p["count"] / 1e6 for _, p in procs])
    total = np.array([p["execute_ns"] / p["count"] / 1e6 for _, p in procs])
    rest = np.clip(total - sum(per.values()), 0, None)
    for key, label, colour in SPLIT:
        v = per[key] if key else rest
        ax.barh(y, v, left=left, height=0.62, color=colour, label=label)
        left += v
    for yi, (_name, p), tot in zip(y, procs, total):
        ax.text(max(tot, left[yi]) + left.max() * 0.01, yi, f"{tot:,.1f} ms  ({p['count']:,} RPCs)",
                va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels([_mpl(name) for name, _ in procs])
    ax.set_ylim(n - 0.5, -0.6)
    ax.set_xlim(0, left.max() * 1.22 or 1)
    ax.set_xlabel("ms per RPC (mean)")
    ax.grid(axis="x", color="#e3e3e3", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    plot.svg = _svg(fig, "latency")
    return plot


# --- (5) write sizes

def _pow2_label(b: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= shift:
            return f"{1 << (b - shift)} {unit}"
    return f"{1 << b} B"


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


def _size_plot(job: Job, result: dict) -> Plot:
    plot = Plot("sizes", "WRITE size histogram")
    sizes, what = write_sizes(job, result)
    sizes = sizes[sizes > 0]
    if not sizes.size:
        plot.note = "no writes traced: nothing to count"
        return plot
    buckets = np.floor(np.log2(sizes)).astype(int)
    lo, hi = int(buckets.min()), int(buckets.max())
    lo, hi = min(lo, hi - 2), max(hi, lo + 2)
    lo = max(lo, 0)
    span = np.arange(lo, hi + 1)
    counts = np.array([(buckets == b).sum() for b in span])
    from matplotlib.figure import Figure
    h = 2.7
    fig = Figure(figsize=(FIG_W, h))
    ax = fig.add_axes((LEFT_IN / FIG_W, 0.75 / h, (FIG_W - LEFT_IN - RIGHT_IN) / FIG_W, (h - 1.1) / h))
    ax.bar(np.arange(span.size), counts, width=0.8, color="#1f77b4")
    for i, c in enumerate(counts):
        if c:
            ax.text(i, c, f"{c:,}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(np.arange(span.size))
    ax.set_xticklabels([_pow2_label(int(b)) for b in span], rotation=0 if span.size <= 14 else 45,
                       ha="center" if span.size <= 14 else "right")
    ax.set_ylim(0, counts.max() * 1.18)
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.set_xlabel("size bucket (at least this many bytes, under twice as many)")
    ax.set_ylabel("count")
    ax.set_title(f"{sizes.size:,} {what}, log2 size buckets", loc="left")
    ax.grid(axis="y", color="#e3e3e3", linewidth=0.6)
    ax.set_axisbelow(True)
    plot.svg = _svg(fig, "sizes")
    return plot


# --------------------------------------------------------------------------- HTML

CSS = """
:root { --critical: #b71c1c; --warning: #e65100; --info: #1565c0; --healthy: #2e7d32; --none: #616161; }
* { box-sizing: border-box; }
body { font-family: "DejaVu Sans", "Helvetica Neue", Arial, sans-serif; font-size: 14px; color: #1d1d1d;
       margin: 0; background: #ffffff; }
main { max-width: 1120px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 18px; margin: 4px 0 12px; color: #333; font-weight: 600; }
h2 { font-size: 16px; margin: 28px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
h3 { font-size: 14px; margin: 14px 0 6px; }
.banner { color: #fff; padding: 14px 18px; border-radius: 6px; margin-bottom: 10px; }
.banner .verdict { font-size: 22px; font-weight: 700; letter-spacing: 0.2px; }
.banner .sub { margin-top: 4px; font-size: 13.5px; opacity: 0.95; }
.sev-critical { --sev: var(--critical); } .sev-warning { --sev: var(--warning); }
.sev-info { --sev: var(--info); } .sev-healthy { --sev: var(--healthy); } .sev-none { --sev: var(--none); }
.banner { background: var(--sev); }
.notes p, p.note { background: #f4f6f8; border-left: 4px solid #9aa5b1; padding: 6px 10px; margin: 6px 0;
                   font-size: 13px; }
.finding { border: 1px solid #ddd; border-left: 6px solid var(--sev); border-radius: 4px; padding: 10px 14px;
           margin: 10px 0; }
.finding header { display: flex; gap: 10px; align-items: baseline; flex-wrap: wrap; }
.badge { background: var(--sev); color: #fff; border-radius: 3px; padding: 1px 7px; font-size: 12px;
         font-weight: 700; text-transform: uppercase; }
.kind { font-weight: 700; font-size: 15px; font-family: "DejaVu Sans Mono", monospace; }
.when { color: #555; font-size: 13px; }
.summary { margin: 8px 0; line-height: 1.4; }
.fix { margin: 8px 0 2px; padding: 6px 10px; background: #eef6ee; border-radius: 3px; line-height: 1.4; }
.who { color: #333; font-size: 13px; margin: 6px 0; }
table { border-collapse: collapse; font-size: 12.5px; margin: 4px 0; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e6e6e6; text-align: left; vertical-align: top; }
th { background: #f3f4f6; font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.evidence { display: inline-table; }
table.evidence td:first-child { font-family: "DejaVu Sans Mono", monospace; color: #444; }
.evidence-grid { display: flex; flex-wrap: wrap; gap: 0 24px; align-items: flex-start; }
details { margin: 4px 0; font-size: 12.5px; }
summary { cursor: pointer; color: #333; }
code, .mono { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; word-break: break-all; }
figure.plot { margin: 0; }
figure.plot h3 { margin: 14px 0 2px; }
.plot-svg { display: block; max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 12px; margin: 2px 0 8px; }
.timeaxis figure.plot + figure.plot { margin-top: 0; }
.yes { color: var(--critical); font-weight: 600; } .no { color: var(--healthy); font-weight: 600; }
footer { margin-top: 28px; color: #777; font-size: 12px; }
"""


def _e(v) -> str:
    return html.escape("-" if v is None else str(v), quote=True)


def _severity(result: dict) -> str:
    if result["verdict"] is None:
        return "none"
    if result["verdict"] == "healthy":
        return "healthy"
    sev = [f["severity"] for f in result["findings"]]
    return next((s for s in SEVERITY_ORDER if s in sev), "info")


def _table(head: list[str], rows: list[list], numeric: set[int] = frozenset(), cls: str = "") -> str:
    """A table; every cell is escaped here."""
    out = [f'<table class="{cls}">' if cls else "<table>", "<thead><tr>"]
    out += [f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>" for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="n">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                                     for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _nested(key: str, value) -> str:
    """An evidence value that is a dict or a list: a small table in a <details>."""
    if isinstance(value, dict):
        body = _table(["", "value"], [[k, _value(v)] for k, v in value.items()])
        count = f"{len(value)} entries"
    elif value and all(isinstance(v, dict) for v in value):
        cols = list(dict.fromkeys(k for v in value for k in v))
        rows = [[_value(v.get(c)) if v.get(c) is not None else "-" for c in cols] for v in value[:MAX_NESTED_ROWS]]
        body = _table(cols, rows)
        if len(value) > MAX_NESTED_ROWS:
            body += f"<p class=\"note\">... {len(value) - MAX_NESTED_ROWS} more (see --json)</p>"
        count = f"{len(value)} rows"
    else:
        body = f"<p class=\"mono\">{_e(_value(value, items=MAX_NESTED_ROWS))}</p>"
        count = f"{len(value)} items"
    inline = ""
    if isinstance(value, dict) and len(value) <= 4:
        inline = ": " + _e(", ".join(f"{k} {_value(v)}" for k, v in value.items()))
    return (f"<details><summary><span class=\"mono\">{_e(key)}</span>{inline} "
            f"<span class=\"when\">({count})</span></summary>{body}</details>")


def _finding(f: dict) -> str:
    sev = f["severity"] if f["severity"] in SEVERITY_ORDER else "info"
    scalars = [(k, v) for k, v in f["evidence"].items() if not isinstance(v, (dict, list))]
    nested = [(k, v) for k, v in f["evidence"].items() if isinstance(v, (dict, list)) and v]
    # the evidence table in up to three columns of key/value pairs
    cols = 3 if len(scalars) > 8 else (2 if len(scalars) > 3 else 1)
    per = math.ceil(len(scalars) / cols) if scalars else 0
    grid = "".join(_table(["evidence", "value"], [[k, "-" if v is None else _value(v)]
                                                   for k, v in scalars[i * per:(i + 1) * per]],
                          numeric={1}, cls="evidence") for i in range(cols) if scalars[i * per:(i + 1) * per])
    who = []
    if f["ranks"]:
        who.append(f"<b>ranks</b> {_e(rank_ranges(f['ranks']))}")
    if f["syscalls"]:
        who.append(f"<b>syscalls</b> {_e(', '.join(f['syscalls']))}")
    if f["servers"]:
        who.append(f"<b>servers</b> {_e(', '.join(f['servers']))}")
    return "".join([
        f'<article class="finding sev-{sev}" data-kind="{_e(f["kind"])}" data-severity="{_e(sev)}">',
        f'<header><span class="badge">{_e(sev)}</span><span class="kind">{_e(f["kind"])}</span>',
        f'<span class="when">{_e(clock(utc_ns(f["start"])))} .. {_e(clock(utc_ns(f["end"])))} UTC</span></header>',
        f'<p class="summary">{_e(f["summary"])}</p>',
        f'<div class="evidence-grid">{grid}</div>' if grid else "",
        "".join(_nested(k, v) for k, v in nested),
        f'<p class="who">{"; ".join(who)}</p>' if who else "",
        f'<p class="fix"><b>fix:</b> {_e(f["fix"])}</p>',
        "</article>",
    ])


def _rank_table(ranks: list[dict]) -> str:
    if not ranks:
        return '<p class="note">no traced syscalls on matching files</p>'
    shown = ranks
    if len(ranks) > MAX_RANK_TABLE_ROWS:
        shown = sorted(ranks, key=lambda r: -r["blocked_ns"])[:MAX_RANK_TABLE_ROWS]
    rows = []
    for r in shown:
        pids = ", ".join(map(str, r["pids"][:4])) + (f" +{len(r['pids']) - 4}" if len(r["pids"]) > 4 else "")
        top = max(r["syscalls"].items(), key=lambda kv: kv[1]["total_ns"], default=None)
        top_text = f"{top[0]} {top[1]['count']:,}x {seconds(top[1]['total_ns'], unit=True)}" if top else "-"
        rows.append(["-" if r["rank"] is None else r["rank"], r["host"], pids, r["comm"] or "-",
                     size(r["bytes_written"]), "-" if r["write_rpcs"] is None else f"{r['write_rpcs']:,}",
                     size(r["mean_rpc_bytes"]), seconds(r["slot_wait_ns"]), seconds(r["blocked_ns"]),
                     f"{r['save_s']:.2f}", top_text])
    out = _table(["rank", "host", "pids", "comm", "written", "WRITEs", "mean WRITE", "slot wait (s)",
                  "blocked (s)", "save (s)", "top syscall"], rows, numeric={0, 4, 5, 6, 7, 8, 9})
    if len(shown) < len(ranks):
        out += (f'<p class="note">{len(ranks) - len(shown)} more ranks: the {len(shown)} most blocked are '
                "shown (--json or --rank R for the rest)</p>")
    return out


def _transport_table(transports: list[dict]) -> str:
    rows = []
    for t in transports:
        link = t["link"]
        if link:
            speed = f"{link['speed_bps'] / 1e9:g} Gb/s" if link["speed_bps"] else "speed unknown"
            util = "" if link["mean_util"] is None else f", mean {pct(link['mean_util'])}"
            peak = "" if link["peak_util"] is None else f", peak {100 * link['peak_util']:.1f}%"
            link_text = (f"{link['iface']} {speed}, {link['mean_tx_bps'] / 1e6:.1f} Mb/s out, "
                         f"{link['mean_rx_bps'] / 1e6:.1f} Mb/s in{util}{peak}")
        else:
            link_text = "-"
        m = t.get("mount") or {}
        mount = " ".join(f"{k}={m[k]}" for k in ("vers", "proto", "nconnect", "wsize") if m.get(k) is not None)
        slots = t["max_slots"] if not t.get("session_slots") else f"{t['max_slots']}/{t['session_slots']}"
        rows.append([t["host"], t["server"] or "?", (m.get("mountpoint") or "") + (" " + mount if mount else ""),
                     slots or "?", "-" if t["peak_in_use"] is None else t["peak_in_use"],
                     "-" if t["saturated_fraction"] is None else f"{100 * t['saturated_fraction']:.0f}%",
                     "-" if t["backlog_peak"] is None else t["backlog_peak"],
                     "-" if t.get("mean_waiting") is None else f"{t['mean_waiting']:.2f}", link_text])
        for x in t.get("xprts") or []:     # the kernel's own counters, per connection
            rows.append(["", f"transport {x['id']}", f"{x['min_reqs']} preallocated", x["max_reqs"],
                         f"{x['peak_num_reqs']} allocated", f"{100 * x['saturated_fraction']:.0f}%",
                         x["backlog_peak"], "-", ""])
    return _table(["host", "server", "mount", "slots", "peak in use", "full", "waiting peak", "mean waiting",
                   "link"], rows, numeric={3, 4, 5, 6, 7})


def _proc_table(by_proc: dict) -> str:
    rows = []
    for name, p in sorted(by_proc.items(), key=lambda kv: -kv[1].get("execute_ns", 0)):
        n = p["count"]
        if not n:
            rows.append([name, 0, "-", "-", "-", "-", "-", "-", "-", "-", p.get("outstanding", 0)])
            continue
        rows.append([name, f"{n:,}", size(p["bytes"]), ms(p["slot_wait_ns"] / n), ms(p["transmit_wait_ns"] / n),
                     ms(p["rtt_ns"] / n), ms(p["execute_ns"] / n), ms(p["p50_ns"]), ms(p["p99_ns"]),
                     f"{p.get('retransmits', 0)}/{p.get('timeouts', 0)}", p.get("outstanding", 0)])
    return _table(["procedure", "count", "bytes", "slot wait", "xmit wait", "rtt", "execute", "p50", "p99",
                   "retrans/timeouts", "outstanding"], rows, numeric=set(range(1, 11)))


def _figure(plot: Plot) -> str:
    attrs = f'class="plot" id="plot-{plot.name}" data-plot="{plot.name}"'
    if plot.xlims:
        lo, hi = plot.xlims[0]
        attrs += (f' data-time-axis="utc" data-xlim-utc-ns="{lo} {hi}"'
                  f' data-xlims-utc-ns="{_e(";".join(f"{a} {b}" for a, b in plot.xlims))}"'
                  f' data-axes-x="{_e(";".join(f"{a} {b}" for a, b in plot.axes_x))}"')
    body = plot.svg if plot.svg else f'<p class="note">{_e(plot.note)}</p>'
    caption = f"<figcaption>{_e(plot.caption.strip())}</figcaption>" if plot.caption.strip() else ""
    return f"<figure {attrs}><h3>{_e(plot.title)}</h3>{body}{caption}</figure>"


def _page(result: dict, plots: dict[str, Plot]) -> str:
    sev = _severity(result)
    verdict = result["verdict"] or "nothing to assess"
    head = f"verdict: {verdict}"
    if result["findings"] and result["verdict"] not in (None, "healthy"):
        head += f" ({result['findings'][0]['severity']})"
    sub = []
    if result.get("window"):
        w = result["window"]
        n = sum(1 for r in result["ranks"] if r["rank"] is not None)
        sub.append(f"save window {w['start']} .. {clock(utc_ns(w['end']))} UTC ({w['seconds']:.2f} s), {n} ranks")
    hosts = sorted({c["host"] or "?" for c in result["captures"]})
    title = f"slotscope: {verdict} ({', '.join(hosts)})" if hosts else f"slotscope: {verdict}"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta name=\"referrer\" content=\"no-referrer\">",
        f"<title>{_e(title)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<h1>slotscope {_e(result.get('slotscope_version'))} report: "
        f"{_e(', '.join(c['path'] for c in result['captures']) or 'no capture')}</h1>",
        f'<section id="verdict" class="banner sev-{sev}" data-verdict="{_e(result["verdict"] or "")}" '
        f'data-severity="{sev}"><div class="verdict">{_e(head)}</div>',
        "".join(f'<div class="sub">{_e(s)}</div>' for s in sub),
        "</section>",
    ]
    if result["notes"]:
        out.append('<div class="notes">' + "".join(f"<p>note: {_e(n)}</p>" for n in result["notes"]) + "</div>")

    out.append('<section id="findings"><h2>Findings</h2>')
    if result["findings"]:
        out += [_finding(f) for f in result["findings"]]
    else:
        out.append('<p class="note">none</p>')
    out.append("</section>")

    if result.get("checklist"):
        rows = [[c["question"], c["answer"] or "-", c["value"]] for c in result["checklist"]]
        out += ['<section id="checklist"><h2>Checklist</h2>', _table(["question", "answer", "measured"], rows),
                "</section>"]

    out += ['<section id="timeline" class="timeaxis"><h2>Timeline</h2>',
            '<p class="note">The time plots share one UTC time axis (same range, aligned).</p>'
            if sum(bool(plots[n].svg) for n in ("occupancy", "link", "ranks")) > 1 else "",
            _figure(plots["occupancy"]), _figure(plots["link"]), _figure(plots["ranks"]), "</section>"]

    out += ['<section id="ranks"><h2>Per rank</h2>', _rank_table(result["ranks"]), "</section>"]
    out.append('<section id="transports"><h2>Per transport</h2>')
    out.append(_transport_table(result["transports"]) if result["transports"]
               else '<p class="note">no NFS transports in this capture</p>')
    out.append("</section>")
    out.append('<section id="rpcs"><h2>RPCs by procedure</h2>')
    if result["rpc"]["by_proc"]:
        out.append('<p class="note">ms per RPC; p50 and p99 of execute</p>')
        out.append(_proc_table(result["rpc"]["by_proc"]))
    out += [_figure(plots["latency"]), "</section>"]
    out += ['<section id="sizes"><h2>Write sizes</h2>', _figure(plots["sizes"]), "</section>"]

    out.append('<section id="captures"><h2>Captures and losses</h2>')
    rows = [[c["path"], c["host"], c["kernel"], c["start"] or "?", c["end"] or "still recording",
             f"{c['lost_events']:,}"] for c in result["captures"]]
    out.append(_table(["capture", "host", "kernel", "start", "end", "events lost"], rows, numeric={5}))
    lost = sum(c["lost_events"] for c in result["captures"])
    if lost:
        out.append(f'<p class="note">{lost:,} events were lost: counts and times above are lower bounds</p>')
    for p in result["problems"]:
        out.append(f'<p class="note">problem: {_e(p)}</p>')
    out.append("</section>")
    if result.get("thresholds"):
        out.append("<details><summary>thresholds used</summary>"
                   + _table(["threshold", "value"], [[k, _value(v)] for k, v in result["thresholds"].items()])
                   + "</details>")
    out.append(f"<footer>slotscope {_e(result.get('slotscope_version'))}, capture format "
               f"{_e(result.get('schema'))}. Times are UTC.</footer>")
    out.append("</main></body></html>\n")
    return "\n".join(out)
