"""The view model of `slotscope top`, computed headless: analyze() as of the time cursor with
what the TUI shows beside it (per-rank extras, what each rank is blocked in, the transports'
series, the recording's saves, a rank's drill-down). The TUI only formats it.

overview() is all of it, as of the cursor. moved() is what a cursor move costs: the rank rows
as of the new cursor (rank_rows.RankIndex), the rest of an earlier overview as it was (the
findings then follow when the cursor settles: tui/worker.py)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .analysis import analyze
from .in_progress import blocked_now, in_progress
from .rank_detail import RankDetail, rank_detail
from .rank_extras import rank_extras
from .rank_rows import RankIndex, RankRow, Unsupported, rank_rows
from .series import TransportSeries
from .thresholds import Thresholds
from .timeline import JobSource

__all__ = ["Overview", "RankRow", "SaveSpan", "Timeline", "moved", "next_save", "overview", "save_at"]


@dataclass(frozen=True)
class Timeline:
    """Where the cursor stands on the capture's time axis."""
    cursor_ns: int                   # since the capture's start
    span_ns: int                     # how far the capture reaches
    live: bool                       # it is still being written
    updated_at: float | None         # wall-clock time of its newest segment read


@dataclass(frozen=True)
class SaveSpan:
    """A save of the recording (analyzer.saves.Save) on the time axis."""
    number: int                      # 1, 2, ... in time order
    start_ns: int                    # since the capture's start: its first file event's entry
    end_ns: int                      # its last one's return
    bytes: int
    files: int
    what: str                        # checkpoints.describe()'s text: "DCP checkpoint step_2/: ..."
    ongoing: bool                    # it may go on: the capture is live and its end is less than
                                     # save_gap_s after the save's last event (a pause that short
                                     # is inside a save), so up to that end the cursor is in it


@dataclass(frozen=True)
class Overview:
    """What `slotscope top` shows as of the cursor."""
    analysis: dict                   # analyze() as of the cursor (or analysis_ns): the JSON of `analyze --json`,
                                     # untouched, without the per-save analyses (`saves` below: the whole capture's)
    ranks: list[RankRow]             # rank_rows() of analyze() as of the cursor, always
    timeline: Timeline
    series: list[TransportSeries]    # on the bins asked for (none: empty)
    detail: RankDetail | None        # the drill-down asked for
    has_rpc: bool                    # the capture has RPC rows, at any time
    saves: list[SaveSpan]            # every save read so far, after the cursor too (to jump to)
    analysis_ns: int | None = None   # None: `analysis` is as of the cursor; else the earlier cursor it is as of
                                     # (a move answered by moved(), before the cursor settles)

    @property
    def settled(self) -> bool:
        return self.analysis_ns is None


def save_at(saves: list[SaveSpan], cursor_ns: int) -> SaveSpan | None:
    """The save the cursor is in, from its start to its end (an ongoing one: on)."""
    return next((s for s in saves if s.start_ns <= cursor_ns and (cursor_ns <= s.end_ns or s.ongoing)), None)


def next_save(saves: list[SaveSpan], cursor_ns: int, direction: int) -> SaveSpan | None:
    """The save to jump to: the first that starts after the cursor (direction 1), or the last
    that starts before it (-1; inside a save that is its own start, as a player's previous
    track, and pressed again the save before)."""
    if direction > 0:
        return next((s for s in saves if s.start_ns > cursor_ns), None)
    return next((s for s in reversed(saves) if s.start_ns < cursor_ns), None)


def overview(source: JobSource, until_ns: int | None, version: str, bins: int = 0,
             detail: tuple[str, list[int]] | None = None) -> Overview:
    """analyze() as of the cursor with rank_extras() and blocked_now() per rank, the time axis,
    the transports' series on `bins` bins (0: none), the saves, and, for `detail` (host, pids),
    that rank's drill-down."""
    job = source.at(until_ns)
    span = source.span_ns()
    cursor = span if until_ns is None else min(until_ns, span)
    # Not each save analysed again as of every cursor move (4x the cost): the TUI shows the saves of
    # the whole capture, found once per growth (source.saves).
    analysis = analyze(job, version, each_save=False)
    calls = in_progress(job, source.at(None) if until_ns is not None else None, cursor)
    ranks = rank_rows(analysis["ranks"], rank_extras(job, now_ns=cursor), blocked_now(calls))
    return Overview(analysis, ranks, Timeline(cursor, span, source.live, source.updated_at()),
                    series=source.series(bins) if bins else [],
                    detail=rank_detail(job, detail[0], detail[1], calls) if detail else None,
                    has_rpc=any(v.full("rpc") is not None for v in source.views),
                    saves=save_spans(source, span))


def moved(source: JobSource, until_ns: int, last: Overview, bins: int = 0) -> Overview | None:
    """overview() after the cursor moved to `until_ns`, from `last` (an overview of the same data
    at an earlier cursor): the rank rows as of the new cursor, exactly overview()'s, at the cost of
    what changed (source's RankIndex); the analysis as of last's cursor (analysis_ns). None where
    the index declines the captures (then overview() it is)."""
    index = source.of_whole("rank_index", lambda: _rank_index(source))
    if index is None:
        return None
    span = source.span_ns()
    cursor = min(until_ns, span)
    since = last.timeline.cursor_ns if last.analysis_ns is None else last.analysis_ns
    return replace(last, ranks=index.rows(cursor), timeline=Timeline(cursor, span, source.live, source.updated_at()),
                   series=source.series(bins) if bins else [], detail=None,
                   analysis_ns=None if since == cursor else since)


def _rank_index(source: JobSource) -> RankIndex | None:
    try:
        return RankIndex(source.at(None), source.at)
    except Unsupported:
        return None


def save_spans(source: JobSource, span_ns: int) -> list[SaveSpan]:
    """The saves of everything read so far, on the time axis (which reaches span_ns); the gap
    that parts them is analyze()'s (the default thresholds, as the TUI's analysis)."""
    gap_s = Thresholds().save_gap_s
    zero, saves = source.zero_utc_ns(), source.saves(gap_s)
    return [SaveSpan(s.number, s.start_ns - zero, s.end_ns - zero, s.bytes, len(s.files), s.what["text"],
                     ongoing=s is saves[-1] and source.live and span_ns - (s.end_ns - zero) < gap_s * 1e9)
            for s in saves]
