"""`slotscope top CAPTURE...`: the Textual app. One code path for live and replay: the capture is
read through analyzer.timeline.JobSource; a capture still being written (meta.json without a
stop record) is re-read every poll and the cursor follows its end; a finished one has a time
cursor to scrub. Reading and analysis run in a worker thread that posts its result."""
from __future__ import annotations

import sys
import threading
import time

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Footer, Input, Static

from slotscope.analyzer.capture import CaptureError
from slotscope.analyzer.job import Job
from slotscope.analyzer.timeline import JobSource, overview, rank_key

from .panels import (RANK_COLUMNS, HelpScreen, RankScreen, banner_text, findings_text, matches, nfs_text,
                     rank_cells)

MIN_STEP_NS = 100_000_000


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("slotscope")
    except PackageNotFoundError:
        return "0+unknown"


class Loaded(Message):
    def __init__(self, result: dict):
        super().__init__()
        self.result = result


class LoadFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error


class TopApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "slotscope top"

    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("p", "pause", "pause"),
        Binding("space", "play", "play/pause", priority=True),
        Binding("left", "scrub(-1)", "back", priority=True),
        Binding("right", "scrub(1)", "forward", priority=True),
        Binding("home", "jump(0)", "start", priority=True, show=False),
        Binding("end", "jump(1)", "end", priority=True, show=False),
        Binding("slash", "filter", "filter"),
        Binding("s", "sort", "sort"),
        Binding("escape", "escape", "clear filter", show=False),
        Binding("question_mark", "help", "help"),
    ]

    def __init__(self, job: Job, poll_seconds: float = 1.0, play_seconds: float = 0.5, clock=time.time):
        super().__init__()
        self.source = JobSource(job)
        self.lock = threading.Lock()
        self.poll_seconds = poll_seconds
        self.play_seconds = play_seconds
        self.result: dict | None = None
        self.cursor: int | None = None          # ns since capture start; None: the end (follow)
        self.playing = False
        self.sort_index = 0
        self.filter_text = ""
        self.error: str | None = None
        self._shown: list | None = None
        self.version = _version()
        self.clock = clock                      # wall clock of the capture-age display (tests fix it)

    # layout and data flow

    def compose(self) -> ComposeResult:
        yield Static("reading the capture...", id="banner")
        yield Static(id="nfs")
        yield DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
        yield Static(id="findings")
        yield Input(placeholder="filter ranks: rank, host, comm or pid (enter: keep, escape: clear)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#ranks", DataTable)
        for title, _, _ in RANK_COLUMNS:
            table.add_column(title, key=title)
        self.query_one("#filter", Input).display = False
        table.focus()
        self.load(refresh=False)
        self.set_interval(self.poll_seconds, self.poll)
        self.set_interval(self.play_seconds, self.tick)

    @work(thread=True, group="load")
    def load(self, refresh: bool) -> None:
        with self.lock:
            until = self.cursor
            try:
                if refresh:
                    self.source.refresh()
                result = overview(self.source, until, self.version)
            except (CaptureError, OSError) as exc:
                self.post_message(LoadFailed(str(exc)))
                return
        self.post_message(Loaded(result))

    def poll(self) -> None:
        if self.source.live:
            self.load(refresh=True)

    def tick(self) -> None:
        if not self.playing or self.result is None:
            return
        span = self.result["timeline"]["span_ns"]
        self.cursor = min(span, (self.cursor or 0) + self.step())
        if self.cursor >= span:
            self.playing = False
        self.load(refresh=False)

    def on_loaded(self, message: Loaded) -> None:
        self.result = message.result
        self.error = None
        self.render_all()

    def on_load_failed(self, message: LoadFailed) -> None:
        self.error = message.error
        self.render_all()

    # rendering

    def visible_ranks(self) -> list[dict]:
        if self.result is None:
            return []
        _, key, reverse = RANK_COLUMNS[self.sort_index]
        rows = [r for r in self.result["ranks"] if matches(r, self.filter_text)]
        return sorted(rows, key=key, reverse=reverse)

    def render_all(self) -> None:
        banner = self.query_one("#banner", Static)
        if self.result is None:
            banner.update(f"[red]{self.error}[/]" if self.error else "reading the capture...")
            return
        text = banner_text(self.result, following=self.cursor is None, playing=self.playing,
                           filter_text=self.filter_text, sort_title=RANK_COLUMNS[self.sort_index][0],
                           now=self.clock())
        if self.error:
            text += f"\n[red]cannot read: {self.error}[/]"
        banner.update(text)
        self.query_one("#nfs", Static).update(nfs_text(self.result))
        self.query_one("#findings", Static).update(findings_text(self.result))
        self.render_ranks()
        if isinstance(self.screen, RankScreen):
            fresh = self.rank_by_key(self.screen.key)
            if fresh is not None:
                self.screen.show(fresh)

    def render_ranks(self) -> None:
        table = self.query_one("#ranks", DataTable)
        ranks = self.visible_ranks()
        rows = [(str(rank_key(r)), rank_cells(r)) for r in ranks]
        if rows == self._shown:
            return
        selected = None
        if table.row_count and table.cursor_row < table.row_count:
            selected = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        if not rows:
            table.add_row("", "", "", "no traced syscalls" if not self.filter_text else "no rank matches",
                          *[""] * (len(RANK_COLUMNS) - 4), key="")
        self._shown = rows
        if selected is not None and any(k == selected for k, _ in rows):
            table.move_cursor(row=table.get_row_index(selected))

    def rank_by_key(self, key: tuple) -> dict | None:
        for r in (self.result or {}).get("ranks", []):
            if rank_key(r) == key:
                return r
        return None

    # actions

    def step(self) -> int:
        span = self.result["timeline"]["span_ns"] if self.result else 0
        return max(span // 40, MIN_STEP_NS)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # Keys that edit text belong to the filter input while it has focus.
        if action in ("scrub", "jump", "play") and isinstance(self.focused, Input):
            return False
        return True

    def action_scrub(self, direction: int) -> None:
        if self.result is None:
            return
        span = self.result["timeline"]["span_ns"]
        now = self.result["timeline"]["cursor_ns"] if self.cursor is None else self.cursor
        self.cursor = max(0, min(span, now + direction * self.step()))
        self.load(refresh=False)

    def action_jump(self, to_end: int) -> None:
        self.playing = False
        if to_end:
            # the end of a finished capture; a live one follows its end again
            self.cursor = None
        else:
            self.cursor = 0
        self.load(refresh=False)

    def action_pause(self) -> None:
        if self.result is None:
            return
        if self.source.live:
            self._toggle_follow()
        else:
            self.action_play()

    def action_play(self) -> None:
        if self.result is None:
            return
        if self.source.live:
            self._toggle_follow()
            return
        if not self.playing and (self.cursor is None or self.cursor >= self.result["timeline"]["span_ns"]):
            self.cursor = 0
        self.playing = not self.playing
        self.render_all()

    def _toggle_follow(self) -> None:
        self.cursor = self.result["timeline"]["cursor_ns"] if self.cursor is None else None
        self.load(refresh=self.cursor is None)

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(RANK_COLUMNS)
        self.render_all()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.render_all()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.query_one("#ranks", DataTable).focus()

    def action_escape(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display or self.filter_text:
            box.value = ""
            box.display = False
            self.filter_text = ""
            self.query_one("#ranks", DataTable).focus()
            self.render_all()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "ranks" or not event.row_key.value:
            return
        rank = next((r for r in self.visible_ranks() if str(rank_key(r)) == event.row_key.value), None)
        if rank is not None:
            self.push_screen(RankScreen(rank))


def run(paths: list[str]) -> int:
    try:
        job = Job.open(paths)
    except CaptureError as exc:
        print(f"slotscope: {exc}", file=sys.stderr)
        return 1
    TopApp(job).run()
    return 0
