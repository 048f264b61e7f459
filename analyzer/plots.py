"""The HTML report's five plots, drawn with matplotlib as inline SVG from plot_data.

Three share one UTC time axis, stacked and aligned (same x range, same axes width and left
edge), each with the recording's saves shaded on it: slot occupancy against the limit per
transport, link utilisation against capacity, and what each rank was blocked in. Two are
not on the time axis: the latency split per procedure and the WRITE size histogram.

Imported only when a report is written (report_html.render_html), so importing the analyzer
does not load matplotlib.
"""
from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

import matplotlib
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.colors import LinearSegmentedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator, NullFormatter

from slotscope.capture.syscalls import FLUSH_SYSCALLS, METADATA_SYSCALLS, OPEN_SYSCALLS, WRITE_SYSCALLS

from .job import Job
from .plot_data import (HEATMAP_BINS, MAX_STEP_POINTS, RankCalls, SaveSpan, Steps, TimeContext, blocked_share,
                        latency_split, link_rates, occupancy, rank_calls, size_histogram, write_sizes)
from .ranks import rank_name
from .rpcs import REST, SPLIT
from .units import clock, ms, pct, plural, round_rate

# Layout of the time plots, in inches: every one has the same width and margins, so their
# axes line up when the SVGs are stacked at their natural size.
FIG_W = 11.0
LEFT_IN, RIGHT_IN = 1.15, 2.05
TOP_IN, BOTTOM_IN, GAP_IN = 0.32, 0.42, 0.42
MAX_BARS_VECTOR = 3000          # more syscall bars than this are drawn as one embedded image
HEATMAP_RANKS = 64              # more ranks than this: blocked share per time bin, not bars
PIXEL = 1 / 1500                # of the time axis: what is shorter is drawn this wide, so it still shows
SAVE_LABEL_ROOM = 0.07          # of the time axis: a "save N" label closer to the previous one is left out
SAVE_LABEL_IN = 0.2             # the strip above the rank rows that the "save N" labels take

# Colours: syscalls by what they do, a family of colours per group, one of them per call in
# the group's order (a call in two groups, as the open calls that are metadata too, takes the
# first group's): write blue and writev cyan, close red and fsync orange, openat green, the
# metadata calls purple, olive, grey and brown; the occupancy/link series.
GROUP_COLOURS = (
    (WRITE_SYSCALLS, ("#1f77b4", "#0b3d66", "#17becf", "#9ecae1", "#393b79")),
    (FLUSH_SYSCALLS, ("#d62728", "#ff7f0e", "#8c564b", "#e377c2")),
    (OPEN_SYSCALLS, ("#2ca02c", "#98df8a", "#637939")),
    (METADATA_SYSCALLS, ("#9467bd", "#c5b0d5", "#bcbd22", "#dbdb8d", "#e7cb94", "#7f7f7f", "#c7c7c7",
                         "#8c6d31", "#bd9e39")),
)


def _syscall_colours() -> dict[str, str]:
    out: dict[str, str] = {}
    for group, shades in GROUP_COLOURS:
        out.update(zip([name for name in group if name not in out], shades))
    return out


SYSCALL_COLOURS = _syscall_colours()
EXTRA_COLOURS = ("#f7b6d2", "#c49c94", "#ffbb78", "#ad494a", "#5254a3", "#e7ba52", "#843c39", "#d6616b")
C_IN_USE, C_WAITING, C_LIMIT, C_SESSION = "#1f77b4", "#ff7f0e", "#d62728", "#9467bd"
C_TX, C_RX, C_CAPACITY, C_WINDOW = "#1f77b4", "#2ca02c", "#d62728", "#555555"
C_SAVE, C_SAVE_LABEL = "#8a6d3b", "#5c4620"      # a neutral shade, apart from the series' colours
SPLIT_COLOURS = {"slot_wait_ns": "#ff7f0e", "transmit_wait_ns": "#bcbd22", "rtt_ns": "#1f77b4", REST: "#9aa5b1"}


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
    saves: list[SaveSpan] = field(default_factory=list)     # time plots: the saves marked on every axes


def build_plots(job: Job, result: dict) -> dict[str, Plot]:
    """The five plots (SVG or a note each), keyed occupancy, link, ranks, latency, sizes."""
    rc = {"svg.fonttype": "none", "svg.hashsalt": "slotscope", "font.family": "DejaVu Sans",
          "font.size": 9, "axes.titlesize": 9.5, "axes.titleweight": "bold", "axes.labelsize": 9,
          "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8, "legend.frameon": False,
          "axes.spines.top": False, "axes.spines.right": False, "text.parse_math": False,
          "path.simplify": True, "image.interpolation": "nearest"}
    with matplotlib.rc_context(rc):
        ctx = TimeContext.of(job, result)
        return {
            "occupancy": _occupancy_plot(ctx, result),
            "link": _link_plot(ctx, result),
            "ranks": _rank_plot(ctx, result),
            "latency": _latency_plot(result),
            "sizes": _size_plot(job, result),
        }


# --------------------------------------------------------------------------- the shared time axis

def _tick_step(span_s: float, ticks: int = 9) -> float:
    for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300,
                 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):
        if span_s / step <= ticks:
            return step
    return 86400 * math.ceil(span_s / ticks / 86400)


def _time_figure(ctx: TimeContext, heights: list[float]):
    """A figure of stacked axes on the shared time axis, laid out in absolute inches so every
    time plot has the same axes position across figures."""
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


def _axis_label(ctx: TimeContext) -> str:
    day = datetime.fromtimestamp(ctx.origin / 1e9, timezone.utc).strftime("%Y-%m-%d")
    keys = (["dashed: the save window"] if ctx.window else []) + (["shaded: each save"] if ctx.saves else [])
    return f"time (UTC, {day})" + ("   " + "; ".join(keys) if keys else "")


def _mark_saves(ax, ctx: TimeContext) -> None:
    """Shade each save from its start to its end, labelled "save N" at the top. Under the data
    (bars, lines) but over a heatmap's image, so it shows on every time plot."""
    lo, hi = ctx.xlim
    room = (hi - lo) * SAVE_LABEL_ROOM
    last_label = -math.inf
    for s in ctx.saves:
        a, b = float(ctx.x(s.start)), float(ctx.x(s.end))
        ax.axvspan(a, max(b, a + (hi - lo) * PIXEL), color=C_SAVE, alpha=0.14, linewidth=0, zorder=0.5)
        # from the save's start, or ending at its end when the axis ends too soon for the label
        at_end = a + room > hi
        x, left = (min(b, hi), min(b, hi) - room) if at_end else (a, a)
        if left - last_label >= room:           # saves close together: not one label on another
            ax.text(x, 0.97, f"save {s.number}", transform=ax.get_xaxis_transform(), ha="right" if at_end else "left",
                    va="top", fontsize=7.5, color=C_SAVE_LABEL, zorder=6, clip_on=True,
                    bbox={"boxstyle": "square,pad=0.15", "facecolor": "#ffffff", "alpha": 0.75, "linewidth": 0})
            last_label = left


def _rows_figure(ctx: TimeContext, rows: int, height: float):
    """A time figure of one axes with `rows` rows (the first at the top) in `height` inches, and a
    strip above them for the saves' labels, so that no label hides a row: (figure, axes, ylim)."""
    room = SAVE_LABEL_IN if ctx.saves else 0.0
    fig, (ax,) = _time_figure(ctx, [height + room])
    return fig, ax, (rows - 0.5, -0.5 - room * rows / height)


def _finish_panels(plot: Plot, fig, axes, ctx: TimeContext, tag: str, more: int, more_what: str,
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


def _finish_time_plot(plot: Plot, fig, axes, ctx: TimeContext, tag: str) -> Plot:
    for ax in axes:
        _mark_saves(ax, ctx)
        ax.set_xlim(*ctx.xlim)          # nothing drawn may have moved it
        lo, hi = ax.get_xlim()
        plot.xlims.append((int(round(lo * 1e9)) + ctx.origin, int(round(hi * 1e9)) + ctx.origin))
        pos = ax.get_position()
        plot.axes_x.append((round(pos.x0, 6), round(pos.x1, 6)))
    plot.saves = ctx.saves
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


def _mpl(text) -> str:
    """A string from the capture, safe as matplotlib text (no mathtext, one line)."""
    return str(text).replace("$", r"\$").replace("\n", " ")[:80]


def _draw_steps(ax, ctx: TimeContext, st: Steps, colour: str, label: str, width: float,
                fill: bool = False) -> None:
    x = ctx.x(st.ts)
    if st.reduced:
        ax.fill_between(x, st.low, st.high, step="post", color=colour, alpha=0.22, linewidth=0,
                        zorder=2)
    elif fill:
        ax.fill_between(x, st.value, step="post", color=colour, alpha=0.2, linewidth=0, zorder=2)
    ax.step(x, st.value, where="post", color=colour, linewidth=width, label=label, zorder=3)


# --------------------------------------------------------------------------- (1) slot occupancy

def _occupancy_plot(ctx: TimeContext, result: dict) -> Plot:
    plot = Plot("occupancy", "Slot occupancy against the limit, per transport")
    panels, more = occupancy(ctx, result)
    if not panels:
        plot.note = ("no RPC data: slot occupancy needs the sunrpc probes (a kernel with NFS)"
                     if not ctx.has_rpc else "no slot-table samples in this capture")
        return plot
    fig, axes = _time_figure(ctx, [1.55] * len(panels))
    for p, ax in zip(panels, axes):
        t = p.transport
        _draw_steps(ax, ctx, p.waiting, C_WAITING, "waiting for a slot", 0.9, fill=True)
        _draw_steps(ax, ctx, p.in_use, C_IN_USE, "slots in use", 1.3)
        top = max(p.in_use.peak, p.waiting.peak, 1.0)
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
        full = ("" if p.stats["saturated_fraction"] is None
                else f"  (full {100 * p.stats['saturated_fraction']:.0f}% of the save window)")
        limit = "" if t["max_slots"] else "  limit unknown"
        counted = "  (mountstats: the mean each send found, per interval)" if "_counted" in t else ""
        ax.set_title(_mpl(f"{t['host']} → {t['server'] or '?'}") + full + limit + counted, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    reduced = any(p.in_use.reduced or p.waiting.reduced for p in panels)
    return _finish_panels(plot, fig, axes, ctx, "occupancy", more, "transports are in the table below", reduced)


# --------------------------------------------------------------------------- (2) link utilisation

def _link_plot(ctx: TimeContext, result: dict) -> Plot:
    plot = Plot("link", "Link utilisation against capacity")
    panels, more = link_rates(ctx, result)
    if not panels:
        if not ctx.has_rpc:
            plot.note = "no RPC data: the link toward an NFS server is found from its RPCs"
        elif not ctx.transports:
            plot.note = "no NFS transport in this capture"
        else:
            plot.note = "no link samples (netdev) toward the servers in this capture"
        return plot
    fig, axes = _time_figure(ctx, [1.45] * len(panels))
    for p, ax in zip(panels, axes):
        t, sent, recv = p.transport, p.sent, p.received
        speed = p.link["speed_bps"]
        data_peak = max(sent.peak, recv.peak, 1.0)
        # traffic far below the capacity would be a flat line at zero: log scale then
        log = bool(speed) and data_peak < 0.05 * speed
        _draw_steps(ax, ctx, sent, C_TX, "sent (tx)", 1.1)
        _draw_steps(ax, ctx, recv, C_RX, "received (rx)", 1.0)
        if speed:
            ax.axhline(speed, color=C_CAPACITY, linestyle=(0, (5, 4)), linewidth=1.1, zorder=4,
                       label=f"capacity {round_rate(speed)}")
            util = "" if p.peak_util is None else f"  (peak {pct(p.peak_util)} of capacity)"
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
        ax.set_title(_mpl(f"{t['host']} {p.link['iface']} → {t['server'] or '?'}") + util, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    reduced = any(p.sent.reduced or p.received.reduced for p in panels)
    return _finish_panels(plot, fig, axes, ctx, "link", more, "links are in the transport table", reduced)


# --------------------------------------------------------------------------- (3) per-rank blocked time

def _rank_label(r: dict, many_hosts: bool) -> str:
    name = rank_name(r)
    return _mpl(f"{r['host']} {name}" if many_hosts else name)


def _rank_plot(ctx: TimeContext, result: dict) -> Plot:
    plot = Plot("ranks", "What each rank was blocked in")
    ranks = result["ranks"]
    calls = rank_calls(ctx, result)
    if calls is None:
        plot.note = "no traced syscalls on matching files: nothing to draw per rank"
        return plot
    many_hosts = len({r["host"] for r in ranks}) > 1
    labels = [_rank_label(r, many_hosts) for r in ranks]
    if len(ranks) > HEATMAP_RANKS:
        return _rank_heatmap(plot, ctx, calls, labels)
    if not calls.row.size:
        plot.note = "no syscalls of these ranks in the time range"
        return plot
    # colour per syscall, the most time-consuming first in the legend
    order = calls.by_time()
    colours, extra = {}, iter(EXTRA_COLOURS)
    for name in order:
        colours[name] = SYSCALL_COLOURS.get(name) or next(extra, "#7f7f7f")
    n = len(ranks)
    row_h = 0.24 if n <= 12 else max(0.13, 3.2 / n)
    fig, ax, ylim = _rows_figure(ctx, n, max(1.0, row_h * n + 0.3))
    lo, hi = ctx.xlim
    min_w = (hi - lo) * PIXEL
    x_start = ctx.x(calls.enter)
    widths = np.maximum((calls.leave - calls.enter) / 1e9, min_w)
    dense = calls.row.size > MAX_BARS_VECTOR
    for name in order:
        sel = calls.name == name
        xs, ws, ys = x_start[sel], widths[sel], calls.row[sel].astype(float)
        verts = np.stack([np.column_stack([xs, ys - 0.38]), np.column_stack([xs + ws, ys - 0.38]),
                          np.column_stack([xs + ws, ys + 0.38]), np.column_stack([xs, ys + 0.38])], axis=1)
        coll = PolyCollection(verts, facecolors=colours[name], edgecolors="none", linewidths=0,
                              rasterized=dense)
        ax.add_collection(coll)
    ax.set_ylim(*ylim)
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
        plot.caption += f"{calls.row.size:,} calls: drawn as an image. "
    return _finish_time_plot(plot, fig, [ax], ctx, "ranks")


def _rank_heatmap(plot: Plot, ctx: TimeContext, calls: RankCalls, labels: list[str]) -> Plot:
    n = len(labels)
    grid = blocked_share(ctx, calls, n)
    fig, ax, ylim = _rows_figure(ctx, n, 4.8)
    lo, hi = ctx.xlim
    cmap = LinearSegmentedColormap.from_list("blocked", ["#ffffff", "#fdd49e", "#fc8d59", "#d7301f", "#7f0000"])
    img = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=1, extent=(lo, hi, n - 0.5, -0.5),
                    interpolation="nearest", rasterized=True)
    ax.set_xlim(lo, hi)
    ax.set_ylim(*ylim)
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


# --------------------------------------------------------------------------- (4) latency split per procedure

def _latency_plot(result: dict) -> Plot:
    plot = Plot("latency", "RPC latency split per procedure (mean per RPC)")
    procs = latency_split(result)
    if not procs:
        plot.note = ("no RPC data: the latency split needs the sunrpc probes (a kernel with NFS)"
                     if not result["rpc"]["by_proc"] else "no completed RPCs")
        return plot
    n = len(procs)
    h = 0.75 + 0.34 * n
    fig = Figure(figsize=(FIG_W, h))
    ax = fig.add_axes((LEFT_IN / FIG_W, 0.5 / h, (FIG_W - LEFT_IN - RIGHT_IN) / FIG_W, (h - 0.65) / h))
    y = np.arange(n)
    left = np.zeros(n)
    for part in SPLIT:
        v = np.array([means[part.key] for _, _, means in procs]) / 1e6       # the axis is in ms
        ax.barh(y, v, left=left, height=0.62, color=SPLIT_COLOURS[part.key], label=part.label)
        left += v
    for yi, (_name, count, means) in zip(y, procs):
        ax.text(max(means["execute_ns"] / 1e6, left[yi]) + left.max() * 0.01, yi,
                f"{ms(means['execute_ns'])} ms  ({plural(count, 'RPC')})", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels([_mpl(name) for name, _, _ in procs])
    ax.set_ylim(n - 0.5, -0.6)
    ax.set_xlim(0, left.max() * 1.22 or 1)
    ax.set_xlabel("ms per RPC (mean)")
    ax.grid(axis="x", color="#e3e3e3", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    plot.svg = _svg(fig, "latency")
    return plot


# --------------------------------------------------------------------------- (5) write sizes

def _pow2_label(b: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= shift:
            return f"{1 << (b - shift)} {unit}"
    return f"{1 << b} B"


def _size_plot(job: Job, result: dict) -> Plot:
    plot = Plot("sizes", "WRITE size histogram")
    sizes, what = write_sizes(job, result)
    sizes = sizes[sizes > 0]
    if not sizes.size:
        plot.note = "no writes traced: nothing to count"
        return plot
    span, counts = size_histogram(sizes)
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
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.set_xlabel("size bucket (at least this many bytes, under twice as many)")
    ax.set_ylabel("count")
    ax.set_title(f"{sizes.size:,} {what}, log2 size buckets", loc="left")
    ax.grid(axis="y", color="#e3e3e3", linewidth=0.6)
    ax.set_axisbelow(True)
    plot.svg = _svg(fig, "sizes")
    return plot
