"""The panels of `slotscope top`: they format what analyzer.view.overview() computed
(no analysis here), and the screens: drill-down, findings, help."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static

from slotscope.analyzer.job import utc_ns
from slotscope.analyzer.rank_detail import RankDetail
from slotscope.analyzer.report_text import finding_lines, rank_ranges
from slotscope.analyzer.rpcs import REST, SPLIT, split
from slotscope.analyzer.thresholds import Thresholds
from slotscope.analyzer.units import clock, ms, pids, rate, round_rate, seconds, size
from slotscope.analyzer.view import Overview, RankRow, next_save, save_at

from .ranktable import Column

SPARK = " ▁▂▃▄▅▆▇█"
LABEL_W = 24          # the transport panel's label column
NOTE_W = 34           # and its note column after the sparklines
BAR_W = 24            # the RPC split bar
MAX_PROCS = 5         # procedures shown in the RPC panel (the costliest)
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


# The rank table's columns, in order; s cycles the sort through them.
RANK_COLUMNS = [
    Column("rank", 5, lambda r: "-" if r.entry["rank"] is None else str(r.entry["rank"]), _rank_order, right=True),
    Column("host", 9, lambda r: r.entry["host"] or "?", lambda r: (r.entry["host"] or "", r.entry["rank"] or 0)),
    Column("pid", 8,
           lambda r: pids(r.entry["pids"]),
           lambda r: r.entry["pids"]),
    Column("comm", 9, lambda r: r.entry["comm"] or "?", lambda r: r.entry["comm"] or ""),
    Column("written", 10, lambda r: size(r.entry["bytes_written"]), lambda r: r.entry["bytes_written"], True, True),
    Column("WRITEs", 6, lambda r: "-" if r.entry["write_rpcs"] is None else f"{r.entry['write_rpcs']:,}",
           lambda r: _num(r.entry["write_rpcs"]), True, True),
    Column("mean WRITE", 10, lambda r: size(r.entry["mean_rpc_bytes"]), lambda r: _num(r.entry["mean_rpc_bytes"]),
           True, True),
    Column("p99 ms", 8, lambda r: ms(r.extras.p99_ns), lambda r: _num(r.extras.p99_ns), True, True),
    Column("slot wait", 9, lambda r: seconds(r.entry["slot_wait_ns"], unit=True), lambda r: _num(r.entry["slot_wait_ns"]),
           True, True),
    Column("blocked now", 0, blocked_cell, lambda r: r.blocked_now.longest.age_ns if r.blocked_now else -1, True,
           style=_blocked_style),
]


def matches(r: RankRow, text: str) -> bool:
    if not text:
        return True
    e = r.entry
    hay = " ".join(str(x) for x in ("rank", e["rank"], e["host"], e["comm"], *e["pids"])).lower()
    return all(word in hay for word in text.lower().split())


# ---- banner ----

def _cursor_clock(result: dict, cursor_ns: int) -> str:
    """' 18:04:00 UTC', the time at the cursor; '' when no capture says when it started."""
    starts = [utc_ns(c["start"]) for c in result["captures"] if c["start"]]
    return f" {clock(min(starts) + cursor_ns, 0)} UTC" if starts else ""


def banner_text(view: Overview, following: bool, playing: bool, filter_text: str, sort_title: str,
                now: float | None = None) -> str:
    now = time.time() if now is None else now
    result, tl = view.analysis, view.timeline
    hosts = ", ".join(sorted({c["host"] or "?" for c in result["captures"]}))
    lost = sum(c["lost_events"] for c in result["captures"])
    verdict = result["verdict"] or "nothing to assess"
    style = {"healthy": "b green", "nothing to assess": "b yellow"}.get(verdict, "b red")
    if result["findings"] and result["verdict"] not in (None, "healthy"):
        verdict += f" ({result['findings'][0]['severity']})"
    starts = [datetime.fromisoformat(c["start"]).timestamp() for c in result["captures"] if c["start"]]
    started = min(starts) if starts else None
    if tl.live:
        state = "[b green]LIVE[/] following" if following else "[b yellow]LIVE[/] paused"
        age = f"recording for {ago(max(0.0, now - started))}" if started else "recording"
        if tl.updated_at:
            quiet = max(0.0, now - tl.updated_at)
            age += (f" · [b red]no new data for {ago(quiet)}: is the recorder still running?[/]" if quiet > 5
                    else f" · newest data {ago(quiet)} ago")
    else:
        state = "[b]REPLAY[/]" + (" playing" if playing else "")
        age = "recorded " + (f"{datetime.fromtimestamp(started, timezone.utc):%Y-%m-%d %H:%M} UTC, "
                             f"{ago(max(0.0, now - started))} ago" if started else "at an unknown time")
    line1 = (f"[{style}]verdict: {escape(verdict)}[/]  host {escape(hosts)} · {state} · "
             f"cursor {seconds(tl.cursor_ns, 1, unit=True)} / {seconds(tl.span_ns, 1, unit=True)}"
             f"{_cursor_clock(result, tl.cursor_ns)}")
    extra = f"sort: {sort_title}" + (f" · filter: {escape(repr(filter_text))}" if filter_text else "")
    line2 = (f"{age} · [{'b red' if lost else 'dim'}]{lost} events lost[/] · "
             f"{len(view.ranks)} ranks · [dim]{extra} · ? help[/]")
    lines = [line1, line2]
    lines += [f"[dim]note: {escape(n)}[/]" for n in result["notes"]]
    lines += [f"[red]problem: {escape(p)}[/]" for p in result["problems"][:3]]
    return "\n".join(lines)


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
    return Text(text[:LABEL_W - 1].ljust(LABEL_W), style=style or "")


def _line(*parts) -> Text:
    out = Text()
    for p in parts:                   # str, Text, or (str, style)
        if isinstance(p, tuple):
            out.append(*p)
        else:
            out.append(p)
    return out


def nfs_text(view: Overview) -> Text:
    if not view.has_rpc:
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
    for s in series:
        t = now.get((s.host, s.server), {})
        name = s.server or "?"
        if len(hosts) > 1:
            name = f"{s.host}→{name}"
        limit = s.limit
        if s.in_use is not None:
            peak = s.in_use_peak
            scale = limit or max(s.peak_in_use or 0, 1)
            full = f" · full {100 * t['saturated_fraction']:.0f}%" if t.get("saturated_fraction") is not None else ""
            note = f"limit {limit or '?'} · peak {t.get('peak_in_use', s.peak_in_use)}{full}"
            lines.append(_line(_label(f"{name} in use"), spark(
                s.in_use, scale, lambda i: "red" if limit and peak[i] >= limit else "green", cursor), f"  {note}"))
            lines.append(_line(_label("  waiting for a slot"), spark(
                s.waiting, max(s.waiting_peak or 0, 1), lambda i: "yellow", cursor),
                f"  peak {t.get('backlog_peak', s.waiting_peak)} waiting"))
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
    return Text("\n").join(lines)


# ---- RPC latency split per procedure ----

SPLIT_STYLES = {"slot_wait_ns": "red", "transmit_wait_ns": "yellow", "rtt_ns": "blue", REST: "grey50"}


def split_bar(means: dict, scale: float, width: int = BAR_W) -> Text:
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


def rpc_text(by_proc: dict, title: str = "RPC latency per procedure", limit: int = MAX_PROCS) -> Text:
    if not by_proc:
        return _line((title, "bold"), "  no completed RPCs yet")
    head = _line((title, "bold"), (" (ms per RPC)", "dim"), " ")
    for part in SPLIT:
        head.append(" █", SPLIT_STYLES[part.key])
        head.append(f" {part.label}")
    columns = "".join(f"{part.column:>8}" for part in SPLIT)
    lines = [head, Text(f"{'procedure':<12}{'count':>8}{columns}{'execute':>9}{'p99':>9}  split", style="dim")]
    rows = [(name, p, split(p)) for name, p in by_proc.items()]
    rows.sort(key=lambda x: -(x[2]["execute_ns"] * x[1]["count"] if x[2] else 0))
    scale = max((x[2]["execute_ns"] for x in rows if x[2]), default=0)
    for name, p, means in rows[:limit]:
        if means is None:
            lines.append(Text(f"{name[:12]:<12}{0:>8}  ({p.get('outstanding', 0)} outstanding)"))
            continue
        out = f"  +{p['outstanding']} outstanding" if p.get("outstanding") else ""
        parts = "".join(f"{ms(means[part.key]):>8}" for part in SPLIT)
        lines.append(_line(f"{name[:12]:<12}{p['count']:>8,}{parts}{ms(means['execute_ns']):>9}"
                           f"{ms(p['p99_ns']):>9}  ", split_bar(means, scale), out))
    if len(rows) > limit:
        lines.append(Text(f"+{len(rows) - limit} more: {', '.join(n for n, _, _ in rows[limit:])}", style="dim"))
    return Text("\n").join(lines)


# ---- findings ----

def findings_text(result: dict) -> str:
    findings = result["findings"]
    if not findings:
        return "[b]Findings[/]  none" + ("" if result["verdict"] else " (nothing to assess yet)")
    out = [f"[b]Findings ({len(findings)})[/] [dim]f: evidence and checklist[/]"]
    for f in findings:
        who = f"  ranks {rank_ranges(f['ranks'])}" if f.get("ranks") else ""
        out.append(f"[{SEVERITY_STYLE.get(f['severity'], 'b')}]{f['severity']}[/] [b]{escape(f['kind'])}[/]"
                   f"[dim]{escape(who)}[/]: {escape(f['summary'])}")
        if f.get("fix"):
            out.append(f"  [green]fix:[/] {escape(f['fix'])}")
    return "\n".join(out)


class FindingsScreen(Screen):
    """Every finding with its evidence and fix, and the checklist (as `slotscope analyze`)."""

    BINDINGS = [Binding("escape,f", "app.pop_screen", "back"), Binding("q", "app.quit", "quit")]

    def __init__(self, result: Overview):
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="findings-full"):
            yield Static(self.text(self.result), id="findings-text")
        yield Footer()

    @staticmethod
    def text(view: Overview) -> str:
        result = view.analysis
        out = [f"[b]verdict: {escape(result['verdict'] or 'nothing to assess')}[/]  "
               f"[dim]as of the cursor, {seconds(view.timeline.cursor_ns, 1, unit=True)}[/]", ""]
        for f in result["findings"]:
            lines = finding_lines(f)
            out.append(f"[{SEVERITY_STYLE.get(f['severity'], 'b')}]{escape(lines[0])}[/]")
            out += [escape(line) for line in lines[1:]]
            out.append("")
        if not result["findings"]:
            out += ["no findings", ""]
        if result.get("checklist"):
            out.append("[b]checklist[/]")
            out += [f"  {escape(c['question'])}: [b]{escape(c['answer'] or '-')}[/] ({escape(c['value'])})"
                    for c in result["checklist"]]
        return "\n".join(out)

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

    def compose(self) -> ComposeResult:
        yield Static(id="rank-title")
        yield Static(id="rank-blocked")
        with Horizontal(id="rank-top"):
            yield DataTable(id="syscalls", cursor_type="row", zebra_stripes=True)
            with Vertical(id="rank-rpc-box"):
                yield Static(id="rank-rpc-title")
                yield DataTable(id="rpcs", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="files", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.show(self.rank, None)

    @staticmethod
    def fill(table: DataTable, titles: tuple[str, ...], rows: list[tuple]) -> None:
        """Replace a table's rows, its columns as wide as their widest cell (set here, not
        measured by the table as rows arrive: the same screen at every refresh)."""
        table.clear(columns=True)
        for i, title in enumerate(titles):
            table.add_column(title, width=max([len(title)] + [len(str(r[i])) for r in rows]))
        for r in rows:
            table.add_row(*r)

    def show(self, row: RankRow, detail: RankDetail | None) -> None:
        self.rank = row
        self.detail = detail
        r = row.entry
        who = f"rank {r['rank']}" if r["rank"] is not None else f"pid {r['pids'][0]} (no rank)"
        self.query_one("#rank-title", Static).update(
            f"[b]{who}[/] on {escape(r['host'])} · pids {', '.join(map(str, r['pids']))} · "
            f"{escape(r['comm'] or '?')} · written {size(r['bytes_written'])} in "
            f"{row.extras.write_calls} writes · {r['write_rpcs'] if r['write_rpcs'] is not None else '-'} "
            f"WRITE RPCs of {size(r['mean_rpc_bytes'])} · p99 {ms(row.extras.p99_ns)} ms · "
            f"blocked {seconds(r['blocked_ns'], unit=True)} · slot wait {seconds(r['slot_wait_ns'], unit=True)}   "
            f"[dim](escape: back)[/]")
        blocked = detail.blocked if detail else []
        if blocked:
            text = "[b red]blocked now:[/] " + "; ".join(
                f"tid {b.tid} in {escape(b.syscall)} for {seconds(b.age_ns, 1, unit=True)} "
                f"on {escape(b.path or '?')}"
                + (" (snapshot)" if b.source == "snapshot" else "") for b in blocked[:4])
        else:
            slow = row.extras.slowest_recent
            text = "[dim]not blocked at the cursor" + (
                f"; slowest in the 5 s before it: {escape(slow.syscall)} {ms(slow.latency_ns)} ms"
                if slow else "") + "[/]"
        self.query_one("#rank-blocked", Static).update(text)
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
        self.fill(self.query_one("#files", DataTable), ("file", "written", "calls", "total ms", "max ms"), [
            (f.path, size(f.bytes), f"{f.calls:,}", ms(f.total_ns), ms(f.max_ns))
            for f in (detail.files if detail else [])])


HELP = f"""[b]slotscope top[/]

  q        quit (ctrl+c too)
  p        pause / resume following a live capture (replay: play / pause)
  space    play / pause the replay (live: same as p)
  ← →      scrub the time cursor: every panel shows the capture as of it
  home end cursor to the start / the end (live: end follows again)
  [ ]      cursor to the start of the previous / next save
  /        filter ranks by text (rank, host, comm, pid); enter keeps it, escape clears
  s        sort by the next column (▲ ascending, ▼ largest first)
  enter    drill down into the selected rank: syscalls, RPCs, files; escape back
  f        findings with their evidence, and the checklist
  ?        this help

[b]save[/]: the one the cursor is in: what it wrote, how much, how long; a save is a burst
of file events on the written files, {Thresholds().save_gap_s:g} s (save_gap_s) or more from the next.
[b]slots & link[/]: slot-table occupancy against its limit (red where full) and the
RPCs waiting for a slot, then the link's rate against its capacity, over the whole
capture; ▼ and the reversed cell mark the cursor.
[b]blocked now[/]: the longest traced syscall in progress at the cursor: from the
agent's snapshots (calls over 1 s, taken every second) and, in replay, from the calls
recorded when they returned (over 0.1 s).
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")
