"""The widgets of `slotscope top`: they format what analyzer.timeline.overview() computed."""
from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static

from slotscope.analyzer.timeline import rank_key


def ms(ns) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.1f}"


def size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def secs(ns) -> str:
    return f"{ns / 1e9:,.1f} s"


def ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


# (title, sort key, reverse) of the rank table's columns, in order; s cycles the sort through them.
RANK_COLUMNS = [
    ("rank", lambda r: (r["rank"] is None, r["rank"] or 0, r["host"], r["pids"]), False),
    ("host", lambda r: r["host"], False),
    ("pids", lambda r: r["pids"], False),
    ("comm", lambda r: r["comm"] or "", False),
    ("written", lambda r: r["bytes_written"], True),
    ("writes", lambda r: r["write_calls"], True),
    ("mean write", lambda r: r["mean_write"] or 0, True),
    ("p99 ms", lambda r: r["p99_ns"] or 0, True),
    ("blocked ms", lambda r: r["blocked_ns"], True),
    ("slowest recent (5 s)", lambda r: (r["slowest_recent"] or {}).get("latency_ns", 0), True),
]


def rank_cells(r: dict) -> tuple:
    pids = ",".join(map(str, r["pids"][:3])) + ("..." if len(r["pids"]) > 3 else "")
    slow = r["slowest_recent"]
    recent = f"{slow['syscall']} {ms(slow['latency_ns'])} ms" if slow else "-"
    return ("-" if r["rank"] is None else str(r["rank"]), r["host"], pids, r["comm"] or "?",
            size(r["bytes_written"]), str(r["write_calls"]), size(r["mean_write"]), ms(r["p99_ns"]),
            ms(r["blocked_ns"]), recent)


def matches(r: dict, text: str) -> bool:
    if not text:
        return True
    hay = " ".join(str(x) for x in ("rank", r["rank"], r["host"], r["comm"], *r["pids"])).lower()
    return all(word in hay for word in text.lower().split())


def banner_text(result: dict, following: bool, playing: bool, filter_text: str, sort_title: str,
                now: float | None = None) -> str:
    tl = result["timeline"]
    hosts = ", ".join(sorted({c["host"] or "?" for c in result["captures"]}))
    lost = sum(c["lost_events"] for c in result["captures"])
    if tl["live"]:
        state = "[b green]LIVE[/] following" if following else "[b yellow]LIVE[/] paused"
    else:
        state = "[b]REPLAY[/]" + (" playing" if playing else "")
    starts = [c["start"] for c in result["captures"] if c["start"]]
    age = ""
    if starts:
        from datetime import datetime
        started = min(datetime.fromisoformat(s).timestamp() for s in starts)
        age = f" · started {ago(max(0.0, (time.time() if now is None else now) - started))} ago"
    verdict = result["verdict"] or "nothing to assess"
    style = {"healthy": "green", "nothing to assess": "yellow"}.get(verdict, "red")
    lines = [f"[b {style}]verdict: {verdict}[/]  host {hosts} · {state} · "
             f"cursor {secs(tl['cursor_ns'])} / {secs(tl['span_ns'])}{age} · "
             f"[{'red' if lost else 'dim'}]{lost} events lost[/]"]
    lines += [f"[dim]note: {n}[/]" for n in result["notes"]]
    lines += [f"[red]problem: {p}[/]" for p in result["problems"]]
    extra = f"sort: {sort_title}"
    if filter_text:
        extra += f" · filter: {filter_text!r}"
    lines.append(f"[dim]{extra}[/]")
    return "\n".join(lines)


def findings_text(result: dict) -> str:
    if not result["findings"]:
        return "[b]Findings[/]  no findings"
    out = ["[b]Findings[/]"]
    for f in result["findings"]:
        out.append(f"  [{f['severity']}] {f['summary']}" + (f" — fix: {f['fix']}" if f.get("fix") else ""))
    return "\n".join(out)


def nfs_text(result: dict) -> str:
    if not result.get("has_rpc"):
        return ("[b]Slots / link / RPC latency[/]  no RPC data in this capture "
                "(needs the sunrpc/NFS probes on a kernel with NFS)")
    return "[b]Slots / link / RPC latency[/]  RPC panels are not built yet"


class RankScreen(Screen):
    """Drill-down: one rank's syscalls and files, as of the cursor."""

    BINDINGS = [Binding("escape", "app.pop_screen", "back"), Binding("q", "app.quit", "quit")]

    def __init__(self, rank: dict):
        super().__init__()
        self.key = rank_key(rank)
        self.rank = rank

    def compose(self) -> ComposeResult:
        yield Static(id="rank-title")
        with Vertical():
            yield DataTable(id="syscalls", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="files", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#syscalls", DataTable).add_columns("syscall", "count", "total ms", "max ms")
        self.query_one("#files", DataTable).add_columns("file", "written", "calls", "total ms")
        self.show(self.rank)

    def show(self, r: dict) -> None:
        self.rank = r
        who = f"rank {r['rank']}" if r["rank"] is not None else f"pid {r['pids'][0]} (no rank)"
        self.query_one("#rank-title", Static).update(
            f"[b]{who}[/] on {r['host']} · pids {', '.join(map(str, r['pids']))} · {r['comm'] or '?'} · "
            f"written {size(r['bytes_written'])} · blocked {ms(r['blocked_ns'])} ms   [dim](escape: back)[/]")
        calls = self.query_one("#syscalls", DataTable)
        calls.clear()
        for name, s in sorted(r["syscalls"].items(), key=lambda kv: -kv[1]["total_ns"]):
            calls.add_row(name, str(s["count"]), ms(s["total_ns"]), ms(s["max_ns"]), key=name)
        files = self.query_one("#files", DataTable)
        files.clear()
        for f in r["files"]:
            files.add_row(f["path"], size(f["bytes"]), str(f["calls"]), ms(f["total_ns"]))


HELP = """[b]slotscope top[/]

  q        quit
  p        pause / resume following a live capture
  space    play / pause the replay (live: same as p)
  ← →      scrub the time cursor (tables show data up to it)
  home end cursor to the start / the end (live: end follows again)
  /        filter ranks by text (rank, host, comm, pid); escape clears
  s        sort by the next column
  enter    drill down into the selected rank; escape back
  ?        this help

"slowest recent" is the slowest syscall that ended in the 5 s before the cursor:
rows are recorded when a syscall returns, so one still blocked is not shown yet.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")
