"""The panels of `slotscope top`: they format what analyzer.view.overview() computed
(no analysis here), and the screens: drill-down, findings, help."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static

from slotscope.analyzer.job import utc_ns
from slotscope.analyzer.rank_detail import RankDetail
from slotscope.analyzer.report_text import finding_lines, rank_ranges, verdict_line
from slotscope.analyzer.rpcs import COLUMN_LEGEND, REST, SPLIT, split
from slotscope.analyzer.thresholds import Thresholds
from slotscope.analyzer.units import clock, ms, pct, pids, plural, rate, round_rate, seconds, size
from slotscope.analyzer.view import Overview, RankRow, next_save, save_at

from .flow import Flow, Para
from .ranktable import Column, fit, fit_columns, fit_path

SPARK = " ▁▂▃▄▅▆▇█"
LABEL_W = 24          # the transport panel's label column
NOTE_W = 34           # and its note column after the sparklines
BAR_W = (12, 32)      # the RPC split bar: narrower, it drops a column; wider, it says no more
MAX_PROCS = 5         # procedures shown in the RPC panel (the costliest)
SHORT_SCREEN = 32     # lines: below, the RPC panel shows 3 procedures, for the rank table's rows
MAX_TRANSPORTS = 2    # transports in the slots & link panel, the busiest (a job of 1,000 nodes has 1,000)
MAX_HOSTS = 3         # hosts the banner names; more are counted
SEVERITY_STYLE = {"critical": "b red", "warning": "b yellow", "info": "b cyan"}


def ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def short_path(path: str | None, parts: int = 2) -> str:
    if not path:
        return "?"
    return "/".join(path.rstrip("/").split("/")[-parts:]) or path


def blocked_cell(r: RankRow) -> str:
    b = r.blocked_now
    if not b:
        return ""
    more = f" +{b.calls - 1}" if b.calls > 1 else ""
    return f"{b.longest.syscall} {seconds(b.longest.age_ns, 1, unit=True)}{more} {short_path(b.longest.path)}"


def _blocked_style(r: RankRow) -> str | None:
    b = r.blocked_now
    if not b:
        return None
    return "bold red" if b.longest.age_ns >= 1_000_000_000 else "yellow"


def _num(v) -> float:
    return -1 if v is None else v


def _rank_order(r: RankRow) -> tuple:
    e = r.entry                  # once: this runs for every rank at every refresh
    return (e["rank"] is None, e["rank"] or 0, e["host"], e["pids"])


# The rank table's columns, in order; s and S cycle the sort through them, r reverses it. Where
# they do not all fit, the lowest priority goes first: what stalls (blocked now, slot wait) and
# how much was written stay longest.
RANK_COLUMNS = [
    Column("rank", 5, lambda r: "-" if r.entry["rank"] is None else str(r.entry["rank"]), _rank_order, right=True,
           priority=9),
    Column("host", 9, lambda r: r.entry["host"] or "?", lambda r: (r.entry["host"] or "", r.entry["rank"] or 0),
           priority=0),
    Column("pid", 8,
           lambda r: pids(r.entry["pids"]),
           lambda r: r.entry["pids"], priority=2),
    Column("comm", 9, lambda r: r.entry["comm"] or "?", lambda r: r.entry["comm"] or "", priority=4),
    Column("written", 10, lambda r: size(r.entry["bytes_written"]), lambda r: r.entry["bytes_written"], True, True,
           priority=6),
    Column("WRITEs", 6, lambda r: "-" if r.entry["write_rpcs"] is None else f"{r.entry['write_rpcs']:,}",
           lambda r: _num(r.entry["write_rpcs"]), True, True, priority=3),
    Column("mean WRITE", 10, lambda r: size(r.entry["mean_rpc_bytes"]), lambda r: _num(r.entry["mean_rpc_bytes"]),
           True, True, priority=1),
    Column("p99 ms", 8, lambda r: ms(r.extras.p99_ns), lambda r: _num(r.extras.p99_ns), True, True, priority=5),
    Column("slot wait", 9, lambda r: seconds(r.entry["slot_wait_ns"], unit=True), lambda r: _num(r.entry["slot_wait_ns"]),
           True, True, priority=7),
    Column("blocked now", 0, blocked_cell, lambda r: r.blocked_now.longest.age_ns if r.blocked_now else -1, True,
           style=_blocked_style, priority=8, min_width=16),
]


def sort_title(index: int, descending: bool) -> str:
    """The rank table's sort, as its border says it."""
    return f"sort: {RANK_COLUMNS[index].title} {'▼ descending' if descending else '▲ ascending'}"


def matches(r: RankRow, text: str) -> bool:
    if not text:
        return True
    e = r.entry
    hay = " ".join(str(x) for x in ("rank", e["rank"], e["host"], e["comm"], *e["pids"])).lower()
    return all(word in hay for word in text.lower().split())


# ---- banner ----

def _recorded(result: dict, cursor_ns: int, now: float) -> str:
    """'2026-12-02 18:04:11 UTC, 2 days ago': when the moment at the cursor was recorded."""
    starts = [utc_ns(c["start"]) for c in result["captures"] if c["start"]]
    if not starts:
        return "recorded at an unknown time"
    at = min(starts) + cursor_ns
    day = datetime.fromtimestamp(at / 1e9, timezone.utc).strftime("%Y-%m-%d")
    return f"{day} {clock(at, 0)} UTC, {ago(max(0.0, now - at / 1e9))} ago"


def banner_text(view: Overview, following: bool, playing: bool, now: float | None = None) -> Flow:
    """What the capture says and where the cursor is: two lines at 80 columns or more, broken
    between items, never inside one; then the analysis' notes and problems."""
    now = time.time() if now is None else now
    result, tl = view.analysis, view.timeline
    names = sorted({c["host"] or "?" for c in result["captures"]})
    hosts = ", ".join(names) if len(names) <= MAX_HOSTS else f"{names[0]} … {names[-1]} ({len(names):,} hosts)"
    lost = sum(c["lost_events"] for c in result["captures"])
    style = {"healthy": "b green", None: "b yellow"}.get(result["verdict"], "b red")
    cursor = f"cursor {seconds(tl.cursor_ns, 1, unit=True)} / {seconds(tl.span_ns, 1, unit=True)}"
    if not view.settled:            # the cursor moves: the rank rows follow it, the findings when it rests
        cursor += f" [yellow](findings as of {seconds(view.analysis_ns, 1, unit=True)})[/]"
    if tl.live:
        starts = [datetime.fromisoformat(c["start"]).timestamp() for c in result["captures"] if c["start"]]
        state = "[b green]LIVE[/] following" if following else "[b yellow]LIVE[/] paused"
        when = [f"recording for {ago(max(0.0, now - min(starts)))}" if starts else "recording"]
        if tl.updated_at:
            quiet = max(0.0, now - tl.updated_at)
            when.append(f"[b red]no new data for {ago(quiet)}: is the recorder still running?[/]" if quiet > 5
                        else f"newest data {ago(quiet)} ago")
    else:
        state = "[b]REPLAY[/]" + (" playing" if playing else "")
        when = [_recorded(result, tl.cursor_ns, now)]
    return Flow.of(
        Para.of(f"[{style}]{escape(verdict_line(result))}[/]", f"host {escape(hosts)}", plural(len(view.ranks), "rank"),
                f"[{'b red' if lost else 'dim'}]{plural(lost, 'event')} lost[/]"),
        Para.of(state, cursor, *when),
        *(Para.of(f"[dim]note: {escape(n)}[/]") for n in result["notes"]),
        *(Para.of(f"[red]problem: {escape(p)}[/]") for p in result["problems"][:3]))


# ---- the save at the cursor ----

def _no_save(live: bool) -> str:
    return "no save yet" if live else "no save in this capture"


def save_text(view: Overview) -> str:
    """One line: the save the cursor is in, or the saves around it; its size and time first,
    which an 80-column screen keeps when it cuts the line."""
    saves, cursor, live = view.saves, view.timeline.cursor_ns, view.timeline.live
    if not saves:
        return f"[dim]{_no_save(live)}: no traced file written{' so far' if live else ''}[/]"
    n = len(saves)
    at = save_at(saves, cursor)
    if at is not None:
        # an ongoing save lasts as far as the capture reaches: a stalled one's time keeps growing
        end, so_far = (view.timeline.span_ns, " so far") if at.ongoing else (at.end_ns, "")
        return (f"[b]save {at.number} of {n}[/] · {size(at.bytes)} in "
                f"{seconds(end - at.start_ns, 1, unit=True)}{so_far} · {escape(at.what)}")
    before, after = next_save(saves, cursor, -1), next_save(saves, cursor, 1)
    if before is None:
        return f"[b]before save 1 of {n}[/] [dim](it starts at {seconds(after.start_ns, 1, unit=True)})[/]"
    ended = f"save {before.number} ended at {seconds(before.end_ns, 1, unit=True)}"
    if after is None:
        return f"[b]after save {n} of {n}[/] [dim]({ended})[/]"
    return (f"[b]between saves {before.number} and {after.number} of {n}[/] [dim]({ended}, "
            f"save {after.number} starts at {seconds(after.start_ns, 1, unit=True)})[/]")


def no_jump_text(view: Overview, direction: int) -> str:
    """Why the key to the next (1) or previous (-1) save has nowhere to go: short, a toast
    at 80 columns holds ~35 characters on a line."""
    n, live = len(view.saves), view.timeline.live
    if not n:
        return _no_save(live)
    if direction > 0:
        return f"save {n} of {n} is the last" + (" so far" if live else "")
    return f"save 1 of {n} is the first"


# ---- slots and link on the capture's time axis ----
# Built as rich Text with styled runs, not markup: a sparkline is one styled cell per bin, and
# parsing thousands of markup tags a frame costs more than everything else on screen.

def spark(values: list[float] | None, scale: float, color_of=None, cursor: int | None = None) -> Text:
    """A sparkline: one cell per bin, 0 blank, anything above 0 at least ▁; the cell of the
    cursor reversed; cells of one color in one run."""
    out = Text()
    if not values:
        return out
    run, run_style = [], None
    for i, v in enumerate(values):
        level = 0 if v <= 0 or scale <= 0 else max(1, min(8, round(8 * v / scale)))
        ch = SPARK[level]
        style = (color_of(i) if color_of else "") or ""
        if i == cursor:
            style, ch = "reverse", ch if ch != " " else "·"
        if style != run_style and run:
            out.append("".join(run), run_style or None)
            run = []
        run_style = style
        run.append(ch)
    if run:
        out.append("".join(run), run_style or None)
    return out


def series_bins(width: int) -> int:
    """How many time bins fit in the transport panel at this width."""
    return max(10, width - LABEL_W - NOTE_W - 2)


def _label(text: str, style: str | None = None) -> Text:
    return Text(fit(text, LABEL_W - 1, False) + " ", style=style or "")


def _line(*parts) -> Text:
    out = Text()
    for p in parts:                   # str, Text, or (str, style)
        if isinstance(p, tuple):
            out.append(*p)
        else:
            out.append(p)
    return out


def nfs_text(view: Overview) -> Text:
    if not view.has_rpc and not any(s.from_mountstats for s in view.series):
        return _line(("slots & link", "bold"), "  no RPC data in this capture "
                     "(needs the sunrpc/NFS probes on a kernel with NFS)")
    series = view.series
    tl = view.timeline
    if not series:
        return _line(("slots & link", "bold"), "  no transport seen yet")
    bins = series[0].bins
    span = series[0].span_ns or 1
    cursor = min(bins - 1, int(bins * tl.cursor_ns / span)) if span else None
    axis = ["─"] * bins
    if cursor is not None and 0 <= cursor < bins:
        axis[cursor] = "▼"
    a = "".join(axis)
    at = cursor if cursor is not None else bins
    lines = [_line(("slots & link", "bold"), "0 s ".rjust(LABEL_W - 12), (a[:at], "dim"), (a[at:at + 1], "bold"),
                   (a[at + 1:], "dim"), f" {seconds(span, 1, unit=True)} ",
                   (f"· cursor {seconds(tl.cursor_ns, 1, unit=True)}", "dim"))]
    now = {(t["host"], t["server"]): t for t in view.analysis["transports"]}
    hosts = {s.host for s in series}
    shown = series
    if len(series) > MAX_TRANSPORTS:            # the busiest: full the longest, then the most in use
        def busy(s):
            t = now.get((s.host, s.server), {})
            return -(t.get("saturated_fraction") or 0), -(s.peak_in_use or 0), s.host, s.server or ""
        shown = sorted(series, key=busy)[:MAX_TRANSPORTS]
    for s in shown:
        t = now.get((s.host, s.server), {})
        name = s.server or "?"
        if len(hosts) > 1:
            name = f"{s.host}→{name}"
        limit = s.limit
        if s.in_use is not None:
            peak = s.in_use_peak
            scale = limit or max(s.peak_in_use or 0, 1)
            full = f" · full {100 * t['saturated_fraction']:.0f}%" if t.get("saturated_fraction") is not None else ""
            note = f"limit {limit or '?'} · peak {_known(t.get('peak_in_use'), s.peak_in_use)}{full}"
            if s.from_mountstats:
                note += " · mountstats"
            lines.append(_line(_label(f"{name} in use"), spark(
                s.in_use, scale, lambda i: "red" if limit and peak[i] >= limit else "green", cursor), f"  {note}"))
            lines.append(_line(_label("  waiting for a slot"), spark(
                s.waiting, max(s.waiting_peak or 0, 1), lambda i: "yellow", cursor),
                f"  peak {_known(t.get('backlog_peak'), s.waiting_peak)} waiting"))
        else:
            lines.append(_line(_label(f"{name} in use"), ("no slot samples", "dim")))
        link = s.link
        if link:
            speed = link.speed_bps
            scale = speed or link.peak_bps or 1
            util = [max(a, b) for a, b in zip(link.tx, link.rx)]
            hot = (lambda i: "red" if util[i] >= 0.8 * speed else "cyan") if speed else (lambda i: "cyan")
            cap = f"of {round_rate(speed)}" if speed else "· speed unknown"
            lines.append(_line(_label(f"  link {link.iface}"), spark(util, scale, hot, cursor),
                               f"  peak {rate(link.peak_bps)} {cap}"))
    if len(shown) < len(series):
        lines.append(_line((f"+ {len(series) - len(shown):,} more transports, less busy "
                            f"(slotscope analyze lists them all)", "dim")))
    return Text("\n").join(lines)


def _known(*values):
    """The first value that is not None."""
    return next((v for v in values if v is not None), None)


# ---- RPC latency split per procedure ----

SPLIT_STYLES = {"slot_wait_ns": "red", "transmit_wait_ns": "yellow", "rtt_ns": "blue", REST: "grey50"}


def split_bar(means: dict, scale: float, width: int) -> Text:
    total = means["execute_ns"]
    cells = round(width * total / scale) if scale else 0
    out, used, acc = Text(), 0, 0.0
    for part in SPLIT:
        acc += means[part.key]
        upto = round(cells * min(acc, total) / total) if total else 0
        if upto > used:
            out.append("█" * (upto - used), SPLIT_STYLES[part.key])
            used = upto
    out.append(" " * (width - used))
    return out


def _ms_of(key: str):
    return lambda row: ms(row[2][key]) if row[2] else ""


# The RPC panel's columns over (procedure, its by_proc entry, split() of it); the last, the bar,
# takes what the others leave. Dropped first where they do not fit: p99, count, execute.
PROC_COLUMNS = [
    Column("procedure", 11, lambda row: row[0], priority=9),
    Column("count", 7, lambda row: f"{row[1]['count']:,}", right=True, priority=3),
    *(Column(part.column, 7, _ms_of(part.key), right=True, priority=prio)
      for part, prio in zip(SPLIT, (7, 5, 6, 5))),
    Column("execute", 8, _ms_of("execute_ns"), right=True, priority=4),
    Column("p99", 8, lambda row: ms(row[1]["p99_ns"]) if row[2] else "", right=True, priority=2),
    Column("split", 0, None, priority=8, min_width=BAR_W[0]),
]
PART_STYLE = {part.column: SPLIT_STYLES[part.key] for part in SPLIT}


@dataclass(frozen=True)
class RpcPanel:
    """The latency split of the costliest procedures, laid out at the width it is drawn at:
    columns that do not fit are dropped whole, the bars fill what is left (up to BAR_W[1]),
    no line wraps. The split columns' heads carry the bars' colours: the legend."""
    by_proc: dict
    limit: int = MAX_PROCS

    def lines(self, width: int) -> list[Text]:
        if not self.by_proc:
            return [Text("no completed RPCs yet")]
        rows = [(name, p, split(p)) for name, p in self.by_proc.items()]
        rows.sort(key=lambda x: -(x[2]["execute_ns"] * x[1]["count"] if x[2] else 0))
        scale = max((x[2]["execute_ns"] for x in rows if x[2]), default=0)
        layout = fit_columns(PROC_COLUMNS, width)
        head = Text(style="dim")
        out = [head]
        for n, (i, w) in enumerate(layout):
            c = PROC_COLUMNS[i]
            head.append(" " if n else "")
            if c.title in PART_STYLE:
                head.append(" " * (w - len(c.title) - 1))
                head.append("█", PART_STYLE[c.title])
                head.append(c.title)
            else:
                head.append(fit(c.title, w, c.right))
        for row in rows[:self.limit]:
            line = Text()
            for n, (i, w) in enumerate(layout):
                c = PROC_COLUMNS[i]
                line.append(" " if n else "")
                if c.cell is not None:
                    line.append(fit(c.cell(row), w, c.right))
                    continue
                name, p, means = row
                bar = min(w, BAR_W[1])
                if means is None:
                    line.append(f"({p.get('outstanding', 0)} outstanding)")
                    continue
                line.append_text(split_bar(means, scale, bar))
                if p.get("outstanding"):
                    line.append(f" +{p['outstanding']} outstanding")
            out.append(line)
        if len(rows) > self.limit:
            out.append(Text(f"+{len(rows) - self.limit} more: {', '.join(n for n, _, _ in rows[self.limit:])}",
                            style="dim"))
        for line in out:
            line.truncate(width, overflow="ellipsis")
        return out

    def __str__(self) -> str:
        return "\n".join(line.plain.rstrip() for line in self.lines(200))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines(options.max_width):
            line.no_wrap = True
            yield line


# ---- findings ----

def findings_title(result: dict, as_of_ns: int | None = None) -> str:
    """The findings box's title; as_of_ns: the earlier cursor they are as of (Overview.analysis_ns)."""
    n = len(result["findings"])
    when = "" if as_of_ns is None else f" as of {seconds(as_of_ns, 1, unit=True)}"
    return f"Findings ({n}){when} · f: evidence and checklist" if n else f"Findings{when}"


def findings_text(result: dict) -> Flow:
    findings = result["findings"]
    if not findings:
        return Flow.of(Para.of("none" + ("" if result["verdict"] else " (nothing to assess yet)")))
    paras = []
    for f in findings:
        who = f"  ranks {rank_ranges(f['ranks'])}" if f.get("ranks") else ""
        paras.append(Para.of(f"[{SEVERITY_STYLE.get(f['severity'], 'b')}]{f['severity']}[/] [b]{escape(f['kind'])}[/]"
                             f"[dim]{escape(who)}[/]: {escape(f['summary'])}"))
        if f.get("fix"):
            paras.append(Para.of(f"[green]fix:[/] {escape(f['fix'])}", indent=2))
    return Flow(tuple(paras))


def _indented(line: str, style: str | None = None) -> Para:
    """A line of the text report as a paragraph: its leading spaces, its indent."""
    body = line.lstrip(" ")
    return Para((Text(body, style=style or ""),), len(line) - len(body))


class FindingsScreen(Screen):
    """Every finding with its evidence and fix, and the checklist (as `slotscope analyze`)."""

    BINDINGS = [Binding("escape,f", "app.pop_screen", "back"), Binding("q", "app.quit", "quit")]

    def __init__(self, result: Overview):
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="findings-full"):
            yield Static(self.text(self.result), id="findings-text")
        yield Footer(compact=True)

    @staticmethod
    def text(view: Overview) -> Flow:
        result = view.analysis
        paras = [Para.of(f"[b]verdict: {escape(result['verdict'] or 'nothing to assess')}[/]  "
                         f"[dim]as of {'the cursor, ' if view.settled else ''}"
                         f"{seconds(view.timeline.cursor_ns if view.settled else view.analysis_ns, 1, unit=True)}[/]"),
                 Para.of()]
        for f in result["findings"]:
            lines = finding_lines(f, width=None)         # wrapped here, once, to the screen's width
            paras.append(_indented(lines[0], SEVERITY_STYLE.get(f["severity"], "b")))
            paras += [_indented(line) for line in lines[1:]]
            paras.append(Para.of())
        if not result["findings"]:
            paras += [Para.of("no findings"), Para.of()]
        if result.get("checklist"):
            paras.append(Para.of("[b]checklist[/]"))
            paras += [Para.of(f"{escape(c['question'])}: [b]{escape(c['answer'] or '-')}[/] ({escape(c['value'])})",
                              indent=2) for c in result["checklist"]]
        return Flow(tuple(paras))

    def show(self, result: Overview) -> None:
        self.result = result
        self.query_one("#findings-text", Static).update(self.text(result))


# ---- drill-down ----

RPC_COLUMNS = ("procedure", "count", "bytes", *(part.column for part in SPLIT), "execute", "p99")


class RankScreen(Screen):
    """Drill-down: one rank's syscalls, RPCs per procedure, files, and what it is blocked in,
    as of the cursor."""

    BINDINGS = [Binding("escape", "dismiss", "back"), Binding("q", "app.quit", "quit")]

    def __init__(self, rank: RankRow):
        super().__init__()
        self.key = rank.key
        self.rank = rank
        self.detail: RankDetail | None = None
        self._widths: dict[str, int] = {}       # each table's width, to lay them out

    def compose(self) -> ComposeResult:
        yield Static(id="rank-title")
        yield Static(id="rank-blocked")
        with Horizontal(id="rank-top"):
            yield DataTable(id="syscalls", classes="rank-table", cursor_type="row", zebra_stripes=True)
            with Vertical(id="rank-rpc-box"):
                yield Static(id="rank-rpc-title")
                yield DataTable(id="rpcs", classes="rank-table", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="files", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.show(self.rank, None)

    def on_resize(self) -> None:
        self._arrange()

    def _arrange(self) -> None:
        """The syscalls and RPC tables side by side where both fit whole, else one above the
        other, and fewer rows of each on a short screen."""
        need = self._widths.get("syscalls", 0) + self._widths.get("rpcs", 0) + 1      # + the border between
        self.set_class(need > self.size.width, "-stacked")
        self.set_class(self.size.height < SHORT_SCREEN, "-short")

    def fill(self, table: DataTable, titles: tuple[str, ...], rows: list[tuple]) -> None:
        """Replace a table's rows, its columns as wide as their widest cell (set here, not
        measured by the table as rows arrive: the same screen at every refresh)."""
        table.clear(columns=True)
        widths = [max([len(title)] + [len(str(r[i])) for r in rows]) for i, title in enumerate(titles)]
        for title, width in zip(titles, widths):
            table.add_column(title, width=width)
        for r in rows:
            table.add_row(*r)
        self._widths[table.id] = sum(widths) + 2 * table.cell_padding * len(widths)

    def show(self, row: RankRow, detail: RankDetail | None) -> None:
        self.rank = row
        self.detail = detail
        r = row.entry
        who = f"rank {r['rank']}" if r["rank"] is not None else f"pid {r['pids'][0]} (no rank)"
        sampled = detail is not None and detail.waits is not None
        # a sampled capture counts no call: its bytes are /proc/PID/io's, its time blocked the samples'
        written = (f"written {size(r['bytes_written'])} (/proc/PID/io)" if sampled else
                   f"written {size(r['bytes_written'])} in {row.extras.write_calls} writes")
        self.query_one("#rank-title", Static).update(Flow.of(Para.of(
            f"[b]{who}[/] on {escape(r['host'])}", f"pids {', '.join(map(str, r['pids']))}",
            escape(r["comm"] or "?"), written,
            f"{r['write_rpcs'] if r['write_rpcs'] is not None else '-'} WRITE RPCs of {size(r['mean_rpc_bytes'])}",
            f"p99 {ms(row.extras.p99_ns)} ms", f"blocked {seconds(r['blocked_ns'], unit=True)}",
            f"slot wait {seconds(r['slot_wait_ns'], unit=True)}")))
        blocked = detail.blocked if detail else []
        if blocked:
            text = Para.of("[b red]blocked now:[/] " + "; ".join(
                f"tid {b.tid} in {escape(b.syscall)} for {seconds(b.age_ns, 1, unit=True)} "
                f"on {escape(b.path or '?')}"
                + (" (snapshot)" if b.source == "snapshot" else "") for b in blocked[:4]))
        else:
            slow = row.extras.slowest_recent
            text = Para.of("[dim]not blocked at the cursor" + (
                f"; slowest in the 5 s before it: {escape(slow.syscall)} {ms(slow.latency_ns)} ms"
                if slow else "") + "[/]")
        self.query_one("#rank-blocked", Static).update(Flow.of(text))
        if sampled:
            total = sum(n for _, n in detail.waits) or 1
            self.fill(self.query_one("#syscalls", DataTable), ("sampled in", "samples", "share"),
                      [(kind, f"{n:,}", pct(n / total)) for kind, n in detail.waits])
        else:
            self.fill(self.query_one("#syscalls", DataTable), ("syscall", "count", "total ms", "max ms"), [
                (name, f"{c['count']:,}", ms(c["total_ns"]), ms(c["max_ns"]))
                for name, c in sorted(r["syscalls"].items(), key=lambda kv: -kv[1]["total_ns"])])
        title = self.query_one("#rank-rpc-title", Static)
        rpc_rows = []
        if detail is None:
            title.update("[b]RPCs[/] [dim]reading...[/]")
        else:
            how = ", ".join(f"{n} {k}" for k, n in sorted(detail.attribution.items()))
            title.update(f"[b]RPCs[/] [dim](ms per RPC; attributed: {how or 'none'})[/]")
            for name, p in sorted(detail.by_proc.items(), key=lambda kv: -kv[1].get("execute_ns", 0)):
                means = split(p)
                if means is None:
                    rpc_rows.append((name, "0", "", f"{p.get('outstanding', 0)} outstanding")
                                    + ("",) * (len(RPC_COLUMNS) - 4))
                    continue
                rpc_rows.append((name, f"{p['count']:,}", size(p["bytes"]),
                                 *(ms(means[part.key]) for part in SPLIT), ms(means["execute_ns"]),
                                 ms(p["p99_ns"])))
        self.fill(self.query_one("#rpcs", DataTable), RPC_COLUMNS, rpc_rows)
        files = self.query_one("#files", DataTable)
        if sampled:
            rows = [(path, f"{n:,}") for path, n in detail.sampled_files]
            titles = ("file", "samples writing, closing or syncing it")
        else:
            rows = [(f.path, size(f.bytes), f"{f.calls:,}", ms(f.total_ns), ms(f.max_ns))
                    for f in (detail.files if detail else [])]
            titles = ("file", "written", "calls", "total ms", "max ms")
        # The numbers whole, the paths cut from the left to what is left of the screen's width.
        numbers = sum(max([len(t)] + [len(r[i]) for r in rows]) for i, t in enumerate(titles) if i)
        room = max(16, (self.size.width or self.app.size.width) - numbers - 2 * files.cell_padding * len(titles) - 2)
        self.fill(files, titles, [(fit_path(r[0], room), *r[1:]) for r in rows])
        self._arrange()


KEYS = (
    ("q", "quit (ctrl+c too)"),
    ("?", "this help; escape closes it"),
    ("← →", "scrub the time cursor: every panel shows the capture as of it"),
    ("home end", "cursor to the start / the end (live: the end follows again)"),
    ("[ ]", "cursor to the start of the previous / next save"),
    ("p", "live: pause / resume following; replay: play / pause"),
    ("space", "the same as p"),
    ("/", "filter ranks by rank, host, comm or pid; enter keeps it, escape clears it"),
    ("s S", "sort the ranks by the next / previous column"),
    ("r", "reverse the sort (▲ ascending, ▼ descending, on the column's head)"),
    ("enter", "drill down into the selected rank: syscalls, RPCs, files; escape back"),
    ("f", "findings with their evidence, and the checklist"),
)
KEY_W = 10
HELP = Flow.of(
    Para.of("[b]slotscope top[/]"), Para.of(),
    *(Para.of(escape(f"{key:<{KEY_W}}{what}"), indent=2, hang=KEY_W) for key, what in KEYS), Para.of(),
    Para.of(f"[b]save[/]: the one the cursor is in: what it wrote, how much, how long; a save is a burst of "
            f"file events on the written files, {Thresholds().save_gap_s:g} s (save_gap_s) or more from the next.",
            hang=0),
    Para.of("[b]slots & link[/]: slot-table occupancy against its limit (red where full) and the RPCs waiting "
            "for a slot, then the link's rate against its capacity, over the whole capture; ▼ and the reversed "
            "cell mark the cursor.", hang=0),
    Para.of(f"[b]RPC latency[/]: each procedure's mean ms per RPC, split into {COLUMN_LEGEND}; the bars "
            "draw the split, to one scale.", hang=0),
    Para.of("[b]blocked now[/]: the longest traced syscall in progress at the cursor: from the agent's "
            "snapshots (calls over 1 s, taken every second) and, in replay, from the calls recorded when "
            "they returned (over 0.1 s).", hang=0),
    Para.of("[b]columns[/] that do not fit the width are left out, the least telling first (the sorted one "
            "stays); a cell cut short ends in …", hang=0),
)


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):          # scrolls where the screen is shorter than the help
            yield Static(HELP, id="help-text")
