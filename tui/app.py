"""`slotscope top CAPTURE...`: the Textual app. One code path for live and replay: the capture is
read through analyzer.timeline.JobSource; a capture still being written (meta.json without a
stop record) is re-read every poll (its new segments only) and the cursor follows its end; a
finished one has a time cursor to scrub.

Work is split so the screen stays responsive with 1,000 ranks at 10 refreshes a second: the
capture is read and analysed (analyzer.view.overview) in a separate process (worker.py: no
GIL shared with the screen), a worker thread waits for its answer and posts it; requests that
arrive meanwhile are merged into one more run with the latest state (a held-down arrow key
costs one analysis, not one per repeat); results are kept per (data generation, cursor) so
scrubbing back is free. A cursor move asks for the rank rows as of the new cursor only (the
findings stay those of an earlier cursor, and the banner says which); once the cursor rests
SETTLE_SECONDS the whole analysis follows. The UI thread only formats: each panel is
re-rendered when its text changed, and the rank table formats the rows on screen only
(ranktable.py).
"""
from __future__ import annotations

import gc
import time

from rich.markup import escape
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Input, Static

from slotscope.analyzer.job import Job
from slotscope.analyzer.view import Overview, RankRow, next_save

from .panels import (MAX_PROCS, RANK_COLUMNS, SHORT_SCREEN, FindingsScreen, HelpScreen, RankScreen, RpcPanel,
                     banner_text, findings_text, findings_title, matches, nfs_text, no_jump_text, save_text,
                     series_bins, sort_title)
from .flow import Flow, Para
from .ranktable import RankTable
from .worker import AnalysisError, ProcessAnalyst, ThreadAnalyst

MIN_STEP_NS = 100_000_000
SETTLE_SECONDS = 0.3        # the cursor at rest this long: the whole analysis as of it
STEPS = 40                  # a scrub step is 1/40 of the capture
RANK_LINES = 6              # the rank table keeps its border, header and 4 rows on any screen


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("slotscope")
    except PackageNotFoundError:
        return "0+unknown"


class Loaded(Message):
    def __init__(self, result: Overview, seconds: float):
        super().__init__()
        self.result = result
        self.seconds = seconds


class LoadFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error


class Lower(Vertical):
    """The rank table above the findings, shared anew when its height changes (the terminal's,
    the filter box's)."""

    def on_resize(self) -> None:
        self.app.share_lower()


class TopApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "slotscope top"
    ENABLE_COMMAND_PALETTE = False

    SCRUB = Binding.Group("scrub", compact=True)
    SAVES = Binding.Group("saves", compact=True)
    # The footer is compact, the scrub and the save keys one entry each: at 80 columns it holds
    # every key it shows; the help (?) lists them all.
    BINDINGS = [
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("left", "scrub(-1)", "back", priority=True, group=SCRUB),
        Binding("right", "scrub(1)", "forward", priority=True, group=SCRUB),
        Binding("left_square_bracket", "save(-1)", "prev save", priority=True, group=SAVES),
        Binding("right_square_bracket", "save(1)", "next save", priority=True, group=SAVES),
        Binding("home", "jump(0)", "start", priority=True, show=False),
        Binding("end", "jump(1)", "end", priority=True, show=False),
        Binding("p", "pause", "pause"),
        Binding("space", "play", "play", priority=True, show=False),     # the footer has p, the same
        Binding("slash", "filter", "filter"),
        Binding("s", "sort(1)", "sort"),
        Binding("S", "sort(-1)", "sort back", show=False),
        Binding("r", "reverse", "reverse", show=False),
        Binding("f", "findings", "findings"),
        Binding("escape", "escape", "clear filter", show=False),
    ]

    def __init__(self, job: Job, poll_seconds: float = 1.0, play_seconds: float = 0.5, clock=time.time,
                 analysis: str = "process", incremental: bool = True):
        super().__init__()
        self.job = job
        self.analysis = analysis                # "process" (the default) or "thread": see worker.py
        self.incremental = incremental          # False: a full analysis at every move (bench/tui.py's baseline)
        self.analyst = None
        self.live = any(c.live for c in job.captures)
        self.poll_seconds = poll_seconds
        self.play_seconds = play_seconds
        self.result: Overview | None = None
        self.cursor: int | None = None          # ns since capture start; None: the end (follow)
        self.playing = False
        self.sort_index = 0
        self.sort_reversed = False              # r: the other way than the column's own
        self.filter_text = ""
        self.error: str | None = None
        self.detail_for: tuple[str, list[int]] | None = None     # the drilled-down rank: (host, pids)
        self.version = _version()
        self.clock = clock                      # wall clock of the capture-age display (tests fix it)
        self.bins = 0
        self._busy = False
        self._again = False
        self._again_moving = True
        self._need_refresh = False
        self._settle_timer = None
        self._texts: dict = {}
        self._rows_state = None
        # what the worker and the UI spent, for bench/tui.py
        self.load_seconds: list[float] = []
        self.frame_seconds: list[float] = []

    # layout and data flow

    def compose(self) -> ComposeResult:
        yield Static("reading the capture...", id="banner")
        yield Static(id="save")
        yield Static(id="nfs")
        yield Static(id="rpc")
        with Lower(id="lower"):
            yield RankTable(RANK_COLUMNS, id="ranks")
            with VerticalScroll(id="findings-box"):
                yield Static(id="findings")
        yield Input(placeholder="filter ranks: rank, host, comm or pid (enter: keep, escape: clear)", id="filter")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._title("rpc", "RPC latency per procedure, ms per RPC")
        self.query_one("#filter", Input).display = False
        self.query_one("#ranks", RankTable).focus()
        self.bins = series_bins(self.size.width - 2)
        self.request()
        self.set_interval(self.poll_seconds, self.poll)
        self.set_interval(self.play_seconds, self.tick)

    def on_resize(self) -> None:
        bins = series_bins(self.size.width - 2)
        if bins != self.bins:
            self.bins = bins
            self.request()
        self.render_all()          # the RPC panel's rows follow the height

    def request(self, refresh: bool = False, moving: bool = False) -> None:
        """Ask for a fresh overview with the current cursor, width and drill-down (`moving`: the
        cursor moved, the rank rows are what must follow at once). One load runs at a time;
        requests made meanwhile become one more load when it is done."""
        self._need_refresh |= refresh
        if self._busy:
            self._again_moving = (self._again_moving if self._again else True) and moving
            self._again = True
            return
        self._busy = True
        refresh, self._need_refresh = self._need_refresh, False
        detail = (self.detail_for[0], list(self.detail_for[1])) if self.detail_for else None
        self.load(self.cursor, self.bins, detail, refresh, moving)

    @work(thread=True, group="load", exit_on_error=False)
    def load(self, until: int | None, bins: int, detail, refresh: bool, moving: bool) -> None:
        started = time.perf_counter()
        try:
            if self.analyst is None:
                self.analyst = (ProcessAnalyst if self.analysis == "process" else ThreadAnalyst)(
                    self.job, self.version, self.incremental)
            result = self.analyst.overview(until, bins, detail, refresh, moving)
        except AnalysisError as exc:
            self.post_message(LoadFailed(str(exc)))
            return
        except Exception as exc:        # the analysis process cannot start...: say so, keep the keys working
            self.post_message(LoadFailed(f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(Loaded(result, time.perf_counter() - started))

    def on_unmount(self) -> None:
        if self.analyst is not None:
            self.analyst.close()

    def _done(self) -> None:
        self._busy = False
        if self._again:
            self._again = False
            self.request(moving=self._again_moving)

    def _settled(self) -> None:
        """The cursor rested: the whole analysis as of it (the findings of the rank rows shown).
        Playing is not resting: its ticks come every play_seconds."""
        if self.result is not None and not self.result.settled and not self.playing:
            self.request()

    def poll(self) -> None:
        if self.live:
            self.request(refresh=True)

    def tick(self) -> None:
        if not self.playing or self.result is None:
            return
        span = self.result.timeline.span_ns
        self.cursor = min(span, (self.cursor or 0) + self.step())
        if self.cursor >= span:
            self.playing = False
        self.request(moving=True)

    def on_loaded(self, message: Loaded) -> None:
        self.load_seconds.append(message.seconds)
        first = self.result is None
        self.result = message.result
        self.live = message.result.timeline.live
        self.error = None
        if self._settle_timer is not None:
            self._settle_timer.stop()
        self._settle_timer = None if message.result.settled else self.set_timer(SETTLE_SECONDS, self._settled)
        self.render_all()
        if first:
            # What exists now (modules, Textual's widgets and caches: ~70,000 objects) lives as
            # long as the app: out of the collector's full passes, which otherwise scan it all
            # every few refreshes (50-150 ms with the UI stopped, measured by bench/tui.py).
            gc.freeze()
        self._done()

    def on_load_failed(self, message: LoadFailed) -> None:
        self.error = message.error
        self.render_all()
        self._done()

    # rendering: only what changed

    def _set(self, widget_id: str, text) -> None:
        """Update a panel when its text (markup, or rich Text with its styles) changed."""
        if self._texts.get(widget_id) != text:
            self._texts[widget_id] = text
            self.query_one(f"#{widget_id}", Static).update(text)

    def _title(self, widget_id: str, title: str) -> None:
        """A panel's title, in its top border, when it changed."""
        if self._texts.get((widget_id, "title")) != title:
            self._texts[(widget_id, "title")] = title
            self.query_one(f"#{widget_id}").border_title = f" {title} "

    @property
    def descending(self) -> bool:
        return RANK_COLUMNS[self.sort_index].reverse != self.sort_reversed

    def visible_ranks(self) -> list[RankRow]:
        if self.result is None:
            return []
        col = RANK_COLUMNS[self.sort_index]
        rows = [r for r in self.result.ranks if matches(r, self.filter_text)]
        return sorted(rows, key=col.sort, reverse=self.descending)

    def render_all(self) -> None:
        started = time.perf_counter()
        if self.result is None:
            self._set("banner", f"[red]{self.error}[/]" if self.error else "reading the capture...")
            return
        text = banner_text(self.result, following=self.cursor is None, playing=self.playing, now=self.clock())
        if self.error:
            text = Flow((*text.paras, Para.of(f"[red]cannot read: {escape(self.error)}[/]")))
        self._set("banner", text)
        self._set("save", save_text(self.result))
        self._set("nfs", nfs_text(self.result))
        procs = MAX_PROCS if self.size.height >= SHORT_SCREEN else 3
        self._set("rpc", RpcPanel(self.result.analysis["rpc"]["by_proc"], procs) if self.result.has_rpc else "")
        self.query_one("#rpc").display = self.result.has_rpc
        self._set("findings", findings_text(self.result.analysis))
        self._title("findings-box", findings_title(self.result.analysis, self.result.analysis_ns))
        self.render_ranks()
        screen = self.screen
        if isinstance(screen, RankScreen):
            fresh = self.rank_by_key(screen.key)
            detail = self.result.detail if self.detail_for else None
            if fresh is not None and (fresh is not screen.rank or detail is not screen.detail):
                screen.show(fresh, detail)
        elif isinstance(screen, FindingsScreen) and screen.result is not self.result:
            screen.show(self.result)
        self.frame_seconds.append(time.perf_counter() - started)

    def render_ranks(self) -> None:
        state = (id(self.result), self.sort_index, self.sort_reversed, self.filter_text)
        if state == self._rows_state:
            return
        self._rows_state = state
        empty = "no rank matches" if self.filter_text else "no traced syscalls (yet)"
        table = self.query_one("#ranks", RankTable)
        table.set_rows(self.visible_ranks(), self.sort_index, self.descending, empty)
        self._title("ranks", " · ".join(
            [f"ranks ({table.row_count})", sort_title(self.sort_index, self.descending)]
            + ([f"filter: {escape(repr(self.filter_text))}"] if self.filter_text else []) + ["s S r: sort"]))
        self.call_after_refresh(self.share_lower)

    def share_lower(self) -> None:
        """Below the fixed panels, the findings get at least 40% of the lines and whatever the
        ranks do not need; the ranks the rest, at least their border, header and 4 rows (or as
        many as there are)."""
        lower = self.query_one("#lower").size.height
        ranks = self.query_one("#ranks", RankTable)
        need = max(ranks.row_count, 1) + 2
        share = (max(lower - need, lower * 2 // 5, 1), min(need, RANK_LINES))
        if self._texts.get("lower") != share:
            self._texts["lower"] = share
            self.query_one("#findings-box").styles.max_height, ranks.styles.min_height = share

    def rank_by_key(self, key: tuple) -> RankRow | None:
        for r in (self.result.ranks if self.result else []):
            if r.key == key:
                return r
        return None

    # actions

    def step(self) -> int:
        span = self.result.timeline.span_ns if self.result else 0
        return max(span // STEPS, MIN_STEP_NS)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # Keys that edit text belong to the filter input while it has focus.
        if action in ("scrub", "jump", "save", "play") and isinstance(self.focused, Input):
            return False
        return True

    def action_scrub(self, direction: int) -> None:
        if self.result is None:
            return
        span = self.result.timeline.span_ns
        now = self.result.timeline.cursor_ns if self.cursor is None else self.cursor
        self.cursor = max(0, min(span, now + direction * self.step()))
        self.request(moving=True)

    def action_save(self, direction: int) -> None:
        """The cursor to the start of the next (1) or previous (-1) save; where there is none,
        a one-line notice and nothing else (a live capture keeps following)."""
        if self.result is None:
            return
        now = self.result.timeline.cursor_ns if self.cursor is None else self.cursor
        target = next_save(self.result.saves, now, direction)
        if target is None:
            self.notify(no_jump_text(self.result, direction), timeout=3)
            return
        self.cursor = target.start_ns
        self.request(moving=True)

    def action_jump(self, to_end: int) -> None:
        self.playing = False
        # the end of a finished capture; a live one follows its end again
        self.cursor = None if to_end else 0
        self.request(refresh=bool(to_end) and self.live, moving=True)

    def action_pause(self) -> None:
        if self.result is None:
            return
        if self.live:
            self._toggle_follow()
        else:
            self.action_play()

    def action_play(self) -> None:
        if self.result is None:
            return
        if self.live:
            self._toggle_follow()
            return
        if not self.playing and (self.cursor is None or self.cursor >= self.result.timeline.span_ns):
            self.cursor = 0
            self.request(moving=True)
        self.playing = not self.playing
        if not self.playing:
            self._settled()
        self.render_all()

    def _toggle_follow(self) -> None:
        self.cursor = self.result.timeline.cursor_ns if self.cursor is None else None
        self.request(refresh=self.cursor is None)
        self.render_all()

    def action_sort(self, step: int) -> None:
        """The next (1) or previous (-1) column, in its own order (largest first for figures)."""
        self.sort_index = (self.sort_index + step) % len(RANK_COLUMNS)
        self.sort_reversed = False
        self.render_all()

    def action_reverse(self) -> None:
        self.sort_reversed = not self.sort_reversed
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
        self.query_one("#ranks", RankTable).focus()

    def action_escape(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display or self.filter_text:
            box.value = ""
            box.display = False
            self.filter_text = ""
            self.query_one("#ranks", RankTable).focus()
            self.render_all()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_findings(self) -> None:
        if self.result is not None and not isinstance(self.screen, FindingsScreen):
            self.push_screen(FindingsScreen(self.result))

    def on_rank_table_selected(self, event: RankTable.Selected) -> None:
        row = event.row
        self.detail_for = (row.entry["host"], list(row.entry["pids"]))
        screen = RankScreen(row)
        self.push_screen(screen, callback=lambda _: self._close_detail())
        self.request()

    def _close_detail(self) -> None:
        self.detail_for = None


def run_app(job: Job, poll_seconds: float = 1.0) -> int:
    TopApp(job, poll_seconds=poll_seconds).run()
    return 0
