"""`slotscope top` with Textual's Pilot: keys, sort, filter, drill-down, scrubbing, live follow,
the panels on the shipped sample, and snapshots of the main screens at a fixed size."""
from __future__ import annotations

import asyncio
import io
from itertools import takewhile

import pytest
from rich.console import Console

from slotscope.capture.writer import CaptureWriter
from slotscope.analyzer.job import Job
from test_tui_timeline import (NFS_META, PROCS, S, SAVE_STARTS, SYSCALLS, T0, at, grow,  # noqa: F401
                               nfs_cap, saves_cap, write_capture)     # (nfs_cap, saves_cap: fixtures)
from unit_helpers import START_NS, assert_one_line_error, meta, procs_table, run_slotscope, save_writes, sc

pytestmark = pytest.mark.unit

SIZE = (120, 40)
SMALL, LARGE = (80, 24), (160, 45)
FIXED_NOW = START_NS / 1e9 + 3600        # the capture started an hour ago
SAMPLE_NOW = 1796446545.167 + 2 * 86400  # the sample was recorded two days before (meta.json start)


def make_app(path, **kw):
    from slotscope.tui.app import TopApp
    return TopApp(Job.open([path]), poll_seconds=kw.pop("poll_seconds", 0.05),
                  clock=kw.pop("clock", lambda: FIXED_NOW), **kw)


def sample_app(**kw):
    from slotscope.cli.demo import sample_path
    return make_app(sample_path(), poll_seconds=60, clock=lambda: SAMPLE_NOW, **kw)


def sample_at(size, *keys: str, check) -> None:
    """The sample at a terminal size, after keys (each let to take effect): check(app)."""
    async def scenario():
        app = sample_app()
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            for key in keys:
                await pilot.press(key)
                await settle(app, pilot)
            check(app)
    run(scenario())


async def loaded(app, pilot) -> None:
    """Let the loading worker finish and its message be handled (and any load it queued)."""
    for _ in range(4):
        await pilot.pause()
        await app.workers.wait_for_complete()
    await pilot.pause()


async def settle(app, pilot) -> None:
    """loaded(), and after a move of the cursor, the whole analysis as of it (the app asks for
    it once the cursor has rested a moment; while playing, it does not rest)."""
    for _ in range(200):
        await loaded(app, pilot)
        if app.result is None or app.result.settled or app.playing:
            return
        await pilot.pause(0.05)


async def wait_for(app, pilot, cond) -> None:
    """Until cond() holds, as a live capture is re-read."""
    for _ in range(100):
        await settle(app, pilot)
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(rows(app))


def table(app):
    from slotscope.tui.ranktable import RankTable
    return app.query_one("#ranks", RankTable)


def rows(app) -> list[tuple]:
    return table(app).row_texts()


def column(app, title: str) -> list[str]:
    from slotscope.tui.panels import RANK_COLUMNS
    i = [c.title for c in RANK_COLUMNS].index(title)
    return [r[i] for r in rows(app)]


def text(app, selector: str) -> str:
    """A panel's text, plain; laid out at the panel's width it is in screen_lines()."""
    content = app.screen.query_one(selector).content
    return str(app.screen.query_one(selector).render()) if isinstance(content, str) else str(content)


def title(app, selector: str) -> str:
    return str(app.screen.query_one(selector).border_title)


def screen_lines(app) -> list[str]:
    """The screen as it is drawn (the text of app.export_screenshot()), a string a row."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), force_terminal=True, record=True,
                      legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text().splitlines()


def region_lines(app, selector: str) -> list[str]:
    """The rows of the screen a widget's content covers, cut to its columns."""
    r = app.screen.query_one(selector).content_region
    return [line[r.x:r.right].ljust(r.width) for line in screen_lines(app)[r.y:r.bottom]]


def assert_wrapped_once(lines: list[str], width: int) -> None:
    """Lines of one paragraph wrapped once, to `width`: none could have taken the next line's
    first word (a text wrapped at 100 columns, then again at 80, leaves a stub every other line)."""
    for line, following in zip(lines, lines[1:]):
        assert len(line.rstrip()) + 1 + len(following.split()[0]) > width, (line, following)


def header_titles_whole(header: str) -> None:
    """Every column title in the rank table's header is whole (no 'slo' of 'slot wait')."""
    from slotscope.tui.panels import RANK_COLUMNS
    rest = header
    for c in RANK_COLUMNS:
        rest = rest.replace(c.title, "", 1)
    assert set(rest) <= set(" ▲▼"), header


def banner(app) -> str:
    return text(app, "#banner")


def run(coro):
    return asyncio.run(coro)


def heard(app) -> list[str]:
    """What the app notifies from now on (the notices are shown as well)."""
    said, notify = [], app.notify
    app.notify = lambda message, **kw: (said.append(message), notify(message, **kw))[1]
    return said


@pytest.fixture
def cap(build_capture):
    return build_capture(syscalls=SYSCALLS, procs=PROCS)


def test_import():
    import slotscope.tui.app as app_module
    assert hasattr(app_module, "run_app")     # what `top` and `demo` open on a terminal (cli/show.py)


def test_main_screen(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert column(app, "rank") == ["0", "1", "2", "-"]
            assert column(app, "comm") == ["python", "python", "zzz", "rsync"]
            assert column(app, "written")[:2] == ["12.0 KiB", "98.6 KiB"]
            assert column(app, "p99 ms")[0] == "50.0"
            assert column(app, "WRITEs") == ["-"] * 4                # no RPC rows in this capture
            assert column(app, "blocked now") == [""] * 4            # nothing in progress at the end
            t = banner(app)
            assert "verdict: healthy" in t and "host node-a" in t and "REPLAY" in t
            assert "2023-11-14 22:14:20 UTC, 59 min ago" in t and "0 events lost" in t and "4 ranks" in t
            assert "no RPC data in this capture" in text(app, "#nfs")
            assert title(app, "#findings-box").strip() == "Findings" and text(app, "#findings") == "none"
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0
    run(scenario())


def test_sort_cycles_columns_both_ways_reverses_and_says_which_way(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert "sort: rank ▲ ascending" in title(app, "#ranks")
            await pilot.press("r")                  # the other way
            await pilot.pause()
            assert column(app, "rank") == ["-", "2", "1", "0"]
            assert "sort: rank ▼ descending" in title(app, "#ranks") and "rank▼" in region_lines(app, "#ranks")[0]
            await pilot.press("S")                  # back one column, from the first to the last
            await pilot.pause()
            assert "sort: blocked now ▼ descending" in title(app, "#ranks")     # its own way again
            await pilot.press("S", "S", "r")        # p99 ms, the smallest first
            await pilot.pause()
            assert column(app, "p99 ms") == sorted(column(app, "p99 ms"), key=float)
            assert "sort: p99 ms ▲ ascending" in title(app, "#ranks") and "p99 ms▲" in region_lines(app, "#ranks")[0]
            await pilot.press("S", "S", "S")        # mean WRITE, WRITEs, written
            await pilot.pause()
            assert column(app, "rank") == ["1", "0", "2", "-"]      # most bytes written first
            assert "sort: written ▼ descending" in title(app, "#ranks")
            await pilot.press("s", "s", "s")        # -> p99 ms
            await pilot.pause()
            assert column(app, "rank")[0] == "0"
            assert "sort: p99 ms ▼ descending" in title(app, "#ranks")
    run(scenario())


def test_filter(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            await pilot.press("slash", "r", "s", "y")
            await pilot.pause()
            assert column(app, "comm") == ["rsync"]
            await pilot.press("enter")              # keeps the filter, back to the table
            await pilot.pause()
            assert column(app, "comm") == ["rsync"] and "filter: 'rsy'" in title(app, "#ranks")
            await pilot.press("escape")             # clears it
            await pilot.pause()
            assert len(rows(app)) == 4
            await pilot.press("slash", "z", "z", "z", "z")
            await pilot.pause()
            assert rows(app) == [] and table(app).empty_text == "no rank matches"
            await pilot.press("escape")
            await pilot.pause()
            assert len(rows(app)) == 4
    run(scenario())


def test_drill_down_and_back(cap):
    async def scenario():
        from textual.widgets import DataTable

        from slotscope.tui.panels import RankScreen
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            await pilot.press("enter")              # rank 0, the first row
            await settle(app, pilot)
            assert isinstance(app.screen, RankScreen)
            calls = app.screen.query_one("#syscalls", DataTable)
            assert [tuple(calls.get_row_at(i)) for i in range(calls.row_count)] == [
                ("fsync", "1", "50.0", "50.0"), ("write", "2", "4.0", "3.0")]
            files = app.screen.query_one("#files", DataTable)
            assert [files.get_row_at(i)[:2] for i in range(files.row_count)] == [
                ["/mnt/ckpt/optim", "8.0 KiB"], ["/mnt/ckpt/shard", "4.0 KiB"]]
            assert "rank 0" in text(app, "#rank-title")
            assert app.detail_for == ("node-a", [10])
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, RankScreen) and app.detail_for is None
            await pilot.press("down", "down", "down", "enter")     # the process without a rank
            await settle(app, pilot)
            assert "pid 13 (no rank)" in text(app, "#rank-title")
    run(scenario())


def test_drill_down_shows_the_ranks_rpcs_and_what_it_is_blocked_in(nfs_cap):  # noqa: F811
    async def scenario():
        from textual.widgets import DataTable
        app = make_app(nfs_cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert column(app, "WRITEs") == ["2", "1"]
            assert column(app, "mean WRITE") == ["4.0 KiB", "4.0 KiB"]
            assert column(app, "blocked now") == ["", ""]           # the end: the snapshot is 20 s old
            for _ in range(13):                                     # 1.5 s a step: 19.5 s back, to 40.5 s
                await pilot.press("left")
            await settle(app, pilot)
            assert column(app, "blocked now")[1] == "close 1.5 s +1 ckpt/rank11"
            await pilot.press("down", "enter")
            await settle(app, pilot)
            rpcs = app.screen.query_one("#rpcs", DataTable)
            got = [tuple(rpcs.get_row_at(i))[:3] for i in range(rpcs.row_count)]
            assert got == [("COMMIT", "1", "0 B"), ("WRITE", "1", "4.0 KiB")]
            assert "attributed: 2 direct" in text(app, "#rank-rpc-title")
            blocked = text(app, "#rank-blocked")
            assert "in close for 1.5 s on /mnt/ckpt/rank11 (snapshot)" in blocked and "fsync" in blocked
    run(scenario())


def test_scrub_changes_what_the_table_shows(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert len(rows(app)) == 4
            await pilot.press("home")
            await settle(app, pilot)
            assert rows(app) == [] and "no traced syscalls" in table(app).empty_text
            assert "cursor 0.0 s / 61.0 s" in banner(app)
            await pilot.press("right")              # one step is 1/40 of the span: 1.5 s
            await settle(app, pilot)
            assert column(app, "rank") == ["0", "1"]
            assert column(app, "written") == ["4.0 KiB", "1,000 B"]
            for _ in range(5):                      # 9 s: rank 1's second write and rank 2 are in
                await pilot.press("right")
            await settle(app, pilot)
            assert column(app, "rank") == ["0", "1", "2", "-"]
            await pilot.press("left", "left", "left")
            await settle(app, pilot)
            assert column(app, "rank") == ["0", "1", "-"]
            await pilot.press("end")
            await settle(app, pilot)
            assert len(rows(app)) == 4 and "cursor 61.0 s / 61.0 s" in banner(app)
    run(scenario())


def test_a_move_shows_the_ranks_at_once_and_the_findings_once_the_cursor_rests(cap, monkeypatch):
    """A cursor move is answered with the rank rows as of the new cursor; the findings stay those
    of the cursor before, and the banner and the findings' title say so, until the cursor rests."""
    import slotscope.tui.app as app_module
    from slotscope.tui import worker
    monkeypatch.setattr(app_module, "SETTLE_SECONDS", 3600)     # it rests when the test says
    monkeypatch.setattr(worker, "FULL_SHARE", 1e-9)              # no full analysis between moves

    async def scenario():
        app = make_app(cap, analysis="thread")
        async with app.run_test(size=SIZE) as pilot:
            await loaded(app, pilot)
            assert len(rows(app)) == 4 and "findings as of" not in banner(app)
            await pilot.press("home")
            await loaded(app, pilot)
            assert rows(app) == [] and not app.result.settled
            assert "cursor 0.0 s / 61.0 s (findings as of 61.0 s)" in banner(app)
            assert "as of 61.0 s" in title(app, "#findings-box")
            app._settled()                                          # the cursor rested
            await loaded(app, pilot)
            assert app.result.settled and rows(app) == []
            assert "findings as of" not in banner(app) and "as of" not in title(app, "#findings-box")
    run(scenario())


def test_a_job_of_many_nodes_shows_its_busiest_transports_and_counts_its_hosts(tmp_path):
    """One transport per node: the panel shows the busiest two and counts the rest, the banner
    counts the hosts (before, a line per host and three per transport pushed the ranks off the
    screen; at 1,000 nodes building those lines took 360 ms a refresh)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import synth

    paths = [synth.save(tmp_path / f"n{i}", host=f"node-{i}", ranks=2, first_rank=2 * i, world_size=10,
                        file_bytes=(16 << 10) * (1 + (i == 3)), slots=2)["path"] for i in range(5)]

    async def scenario():
        from slotscope.tui.app import TopApp
        app = TopApp(Job.open(paths), poll_seconds=60, clock=lambda: FIXED_NOW)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert "host node-0 … node-4 (5 hosts) · 10 ranks" in banner(app)
            nfs = text(app, "#nfs")
            assert nfs.count("→10.0.0.1") == 2 and "+ 3 more transports, less busy" in nfs
            assert "node-3→" in nfs                        # writes twice as much: the busiest
            assert len(rows(app)) >= 4                     # the ranks are on the screen
    run(scenario())


def test_keys_pressed_while_loading_merge_into_one_more_load(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            before = len(app.load_seconds)
            await pilot.press(*["left"] * 12)       # as fast as the keyboard repeats
            await settle(app, pilot)
            assert app.cursor == 61 * 10**9 - 1000 - 12 * app.step()
            assert len(app.load_seconds) - before <= 12 + 1      # and the whole analysis once it rests
            assert banner(app).count(f"cursor {app.cursor / 1e9:,.1f} s") == 1
    run(scenario())


def test_play_advances_the_cursor(cap):
    async def scenario():
        app = make_app(cap, play_seconds=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            await pilot.press("space")              # at the end: plays from the start
            assert app.playing
            for _ in range(200):
                await pilot.pause(0.05)
                if app.cursor and app.cursor > 9 * 10**9:
                    break
            await pilot.press("space")
            assert not app.playing
            assert 0 < app.cursor < 61 * 10**9
    run(scenario())


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=lambda s: f"{s[0]}x{s[1]}")
def test_help_and_findings_screens(cap, size):
    async def scenario():
        from slotscope.tui.panels import FindingsScreen, HelpScreen
        app = make_app(cap)
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            box = app.screen.query_one("#help").region            # within the screen, whole
            assert box.x >= 0 and box.right <= size[0] and box.bottom <= size[1]
            assert "drill down into the selected rank" in "\n".join(screen_lines(app))
            app.screen.query_one("#help").scroll_end(animate=False, immediate=True)
            await pilot.pause()                                    # where it is taller, it scrolls to its end
            assert "a cell cut short ends in …" in "\n".join(screen_lines(app))
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen)
            await pilot.press("f")
            await pilot.pause()
            assert isinstance(app.screen, FindingsScreen)
            assert "no findings" in text(app, "#findings-text") and "checklist" in text(app, "#findings-text")
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, FindingsScreen)
    run(scenario())


def test_panels_on_the_sample():
    async def scenario():
        app = sample_app()
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert column(app, "rank") == [str(i) for i in range(8)]
            assert set(column(app, "WRITEs")) == {"128"} and set(column(app, "mean WRITE")) == {"4.0 KiB"}
            t = banner(app)
            assert "verdict: slot_saturation (critical)" in t and "2026-12-05 04:56:10 UTC, 48 h ago" in t
            nfs = text(app, "#nfs").splitlines()
            assert nfs[0].startswith("slots & link") and "25.4 s" in nfs[0] and "▼" in nfs[0]
            assert nfs[1].startswith("10.0.0.1:2049 in use") and "█" in nfs[1] and "limit 2 · peak 2" in nfs[1]
            assert "waiting for a slot" in nfs[2] and "peak 6 waiting" in nfs[2]
            assert "link veth1" in nfs[3] and "of 10 Gb/s" in nfs[3]
            rpc = text(app, "#rpc").splitlines()
            assert title(app, "#rpc").strip() == "RPC latency per procedure, ms per RPC"
            assert rpc[1].split()[:8] == ["WRITE", "1,024", "94.6", "0.2", "32.1", "0.9", "127.8", "210.3"]
            f = text(app, "#findings")
            assert "critical slot_saturation" in f and "fix: raise the transport slot table" in f
            for _ in range(8):                       # into the save: ranks blocked in write
                await pilot.press("left")
            await settle(app, pilot)
            assert any(c.startswith("write 0.") for c in column(app, "blocked now"))
            assert text(app, "#nfs").splitlines()[0].count("▼") == 1
    run(scenario())


def test_rank_table_formats_only_what_is_on_screen(build_capture):
    """1,000 ranks: a refresh formats the visible rows, not all of them."""
    from slotscope.tui import panels
    rows_ = [sc(100 + i, "write", 1000, 10, ts=at(1)) for i in range(1000)]
    procs_ = [dict(PROCS[0], tgid=100 + i, rank=i) for i in range(1000)]
    path = build_capture(syscalls=rows_, procs=procs_)
    calls = []
    col = panels.RANK_COLUMNS[0]
    original = col.cell

    async def scenario():
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert table(app).row_count == 1000
            object.__setattr__(col, "cell", lambda r: calls.append(r.entry["rank"]) or original(r))
            try:
                app.cursor = 30 * 10**9
                app.request()
                await settle(app, pilot)
                await pilot.press("down")
                await pilot.pause()
            finally:
                object.__setattr__(col, "cell", original)
            assert 0 < len(calls) <= 6 * table(app).size.height
            assert set(calls) <= set(range(40))
    run(scenario())


def test_live_follow_shows_a_new_rank_and_pause(tmp_path):
    path = str(tmp_path / "live")
    live_meta = meta()
    del live_meta["stop"]
    w = CaptureWriter(path)
    w.write_meta(live_meta)
    w.append("procs", procs_table([p for p in PROCS]))
    w.tables["procs"].close_segment()
    grow(w, [sc(10, "write", 1000, 100, ts=at(1))])

    async def scenario():
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(app, pilot, lambda: column(app, "rank") == ["0"])
            assert "LIVE" in banner(app) and "following" in banner(app) and "recording for" in banner(app)
            grow(w, [sc(11, "write", 1000, 100, ts=at(2))])
            await wait_for(app, pilot, lambda: column(app, "rank") == ["0", "1"])
            await pilot.press("p")                  # pause: new data beyond the cursor is not shown
            await settle(app, pilot)
            assert "paused" in banner(app)
            grow(w, [sc(12, "write", 1000, 100, ts=at(3))])
            await pilot.pause(0.3)
            await settle(app, pilot)
            assert column(app, "rank") == ["0", "1"]
            await pilot.press("p")                  # follow again
            await wait_for(app, pilot, lambda: column(app, "rank") == ["0", "1", "2"])
            w.write_meta(meta())                    # the recording stops: replay
            await wait_for(app, pilot, lambda: "REPLAY" in banner(app))
    run(scenario())
    w.close()


def test_live_banner_says_when_the_capture_stopped_growing(tmp_path):
    from slotscope.analyzer.view import Overview, Timeline
    from slotscope.tui.panels import banner_text
    analysis = {"captures": [{"host": "h", "start": "2023-11-14T22:13:20+00:00", "lost_events": 7}],
                "verdict": "healthy", "findings": [], "ranks": [], "notes": [], "problems": []}
    result = Overview(analysis, ranks=[], series=[], detail=None, has_rpc=False, saves=[],
                      timeline=Timeline(cursor_ns=5 * 10**9, span_ns=5 * 10**9, live=True, updated_at=1000.0))
    fresh = str(banner_text(result, True, False, now=1002.0))
    assert "newest data 2 s ago" in fresh and "7 events lost" in fresh
    stale = str(banner_text(result, True, False, now=1030.0))
    assert "no new data for 30 s: is the recorder still running?" in stale


def test_save_keys_move_the_cursor_from_save_to_save(saves_cap):  # noqa: F811
    starts = [t * S - T0 for t in SAVE_STARTS]        # each save's first call, on the time axis
    lines = [f"save {k} of 3 · {mib} MiB in {secs} s · torch.save checkpoint step_{k}/: 2 files (r10.pt, r11.pt)"
             for k, mib, secs in ((1, "8.0", "5.0"), (2, "8.0", "5.0"), (3, "16.0", "9.0"))]

    async def scenario():
        app = make_app(saves_cap)
        said = heard(app)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert text(app, "#save") == "after save 3 of 3 (save 3 ended at 49.0 s)"
            await pilot.press("home")
            await settle(app, pilot)
            assert text(app, "#save") == "before save 1 of 3 (it starts at 5.0 s)"
            for start, line in zip(starts, lines):
                await pilot.press("right_square_bracket")
                await settle(app, pilot)
                assert app.cursor == start and text(app, "#save") == line
                assert f"cursor {start / 1e9:.1f} s / 61.0 s" in banner(app)
            await pilot.press("right_square_bracket")            # nowhere to go: said, nothing done
            await settle(app, pilot)
            assert said == ["save 3 of 3 is the last"] and app.cursor == starts[2]
            await pilot.press("right")                          # 1.5 s into save 3: [ goes to its start
            await settle(app, pilot)
            assert app.cursor > starts[2] and text(app, "#save") == lines[2]
            for start, line in zip(starts[::-1], lines[::-1]):
                await pilot.press("left_square_bracket")
                await settle(app, pilot)
                assert app.cursor == start and text(app, "#save") == line
            await pilot.press("left_square_bracket")
            await settle(app, pilot)
            assert said[1:] == ["save 1 of 3 is the first"] and app.cursor == starts[0]
            await pilot.press(*["right"] * 4)                   # 11 s: save 1 ended at 10 s
            await settle(app, pilot)
            assert text(app, "#save") == ("between saves 1 and 2 of 3 (save 1 ended at 10.0 s, "
                                          "save 2 starts at 22.0 s)")
            await pilot.press("slash", "right_square_bracket")  # typed into the filter, not a jump
            await settle(app, pilot)
            assert app.filter_text == "]" and app.cursor == starts[0] + 4 * app.step()
    run(scenario())


@pytest.mark.parametrize("live", [False, True])
def test_save_keys_without_a_save_say_so(tmp_path, live):
    path = str(tmp_path / "cap")
    w = write_capture(path, {"procs": PROCS[:1], "syscall": [sc(10, "openat", ts=at(1)), sc(10, "read", ts=at(2))]},
                      live=live)
    none = "no save yet" if live else "no save in this capture"

    async def scenario():
        app = make_app(path)
        said = heard(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(app, pilot, lambda: text(app, "#save").startswith(none))
            assert text(app, "#save") == none + (": no traced file written so far" if live
                                                 else ": no traced file written")
            loads = len(app.load_seconds)
            await pilot.press("right_square_bracket", "left_square_bracket")
            await settle(app, pilot)
            assert said == [none, none]
            assert app.cursor is None                           # at the end; live: still following
            if not live:
                assert len(app.load_seconds) == loads           # and nothing asked of the analysis
            assert ("following" in banner(app)) == live
            if live:                                            # stopped, so no load is running at the exit
                w.write_meta(meta(**NFS_META))
                w.close()
                await wait_for(app, pilot, lambda: "REPLAY" in banner(app))
    run(scenario())


def test_live_save_line_while_a_save_goes_on(tmp_path):
    path = str(tmp_path / "live")
    w = write_capture(path, {"procs": PROCS[:1], "syscall": [sc(10, "openat", ts=at(1))]}, live=True)

    async def scenario():
        app = make_app(path)
        said = heard(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(app, pilot, lambda: text(app, "#save").startswith("no save yet"))
            grow(w, save_writes(5, 10, "/mnt/ckpt/step_1/r10.pt"))         # 5 s to 10 s, the capture's end
            await wait_for(app, pilot, lambda: text(app, "#save").startswith("save 1 of 1"))
            what = "torch.save checkpoint step_1/: 1 file (r10.pt)"
            assert text(app, "#save") == f"save 1 of 1 · 4.0 MiB in 5.0 s so far · {what}"
            await pilot.press("right_square_bracket")
            await settle(app, pilot)
            assert said == ["save 1 of 1 is the last so far"] and app.cursor is None
            await pilot.press("left_square_bracket")                    # to its start: following stops
            await settle(app, pilot)
            assert app.cursor == 5 * S - T0 and "LIVE paused" in banner(app)
            w.write_meta(meta(**NFS_META))                              # the recording stops at 61 s
            w.close()
            await wait_for(app, pilot, lambda: "REPLAY" in banner(app))
            assert text(app, "#save") == f"save 1 of 1 · 4.0 MiB in 5.0 s · {what}"
    run(scenario())


def test_cli_bad_capture(tmp_path):
    res = run_slotscope("top", str(tmp_path / "missing"))
    assert_one_line_error(res, "no such capture directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_slotscope("top", str(tmp_path / "empty")), "empty directory")


# ---- the layout at 80x24 first, and at 120x40 and 160x45: read off the screen as drawn ----

@pytest.mark.parametrize("size", [SMALL, SIZE, LARGE], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_main_screen_fits_without_scrolling(size):
    """The verdict, the RPC split (a line a procedure, its bar whole) and the rank table's first
    rows (its titles whole, every cell shown whole or ending in an ellipsis) are on screen."""
    from slotscope.tui.panels import BAR_W

    def check(app):
        lines = screen_lines(app)
        assert len(lines) == size[1] and app.screen.max_scroll_y == 0
        assert lines[0].startswith(" verdict: slot_saturation (critical) · host vm")
        rpc = region_lines(app, "#rpc")
        procs = 3 if size == SMALL else 5
        # the costliest first (count x execute: WRITE 131 s, ACCESS 1.7 s, CREATE 0.9 s, GETACL, LOOKUP)
        assert [line.split()[0] for line in rpc[1:1 + procs]] == ["WRITE", "ACCESS", "CREATE", "GETACL",
                                                                  "LOOKUP"][:procs]
        assert rpc[1 + procs].startswith("+")                   # "+3 more: ...", on its own line
        bars = {line.split()[0]: line.count("█") for line in rpc[1:1 + procs]}
        assert all("…" not in line for line in rpc[1:1 + procs])   # no bar cut short
        # the slowest per RPC (WRITE 127.8 ms) has the whole bar, the others theirs in proportion
        assert bars["WRITE"] >= BAR_W[0] and bars["WRITE"] > bars["CREATE"] > bars["ACCESS"] > 0
        ranks = region_lines(app, "#ranks")
        header_titles_whole(ranks[0])
        assert "rank▲" in ranks[0] and "slot wait" in ranks[0] and "blocked now" in ranks[0]
        shown = 4 if size == SMALL else 8
        assert [line.split()[0] for line in ranks[1:1 + shown]] == [str(i) for i in range(shown)]
        for line, wait in zip(ranks[1:1 + shown], column(app, "slot wait")):
            assert f" {wait}" in line, line
        box = app.query_one("#findings-box").content_region
        assert box.height >= 3 and box.bottom <= size[1] - 1      # above the footer
        findings = region_lines(app, "#findings")[:box.height]
        assert findings[0].startswith("critical slot_saturation  ranks 0-7: slot table toward")
        summary = findings[:1] + list(takewhile(lambda line: line.startswith("  ") and "fix:" not in line,
                                                findings[1:]))
        assert len(summary) >= 2 and summary[1].startswith("  ")  # hanging under the finding's first line
        assert_wrapped_once(summary, app.query_one("#findings").content_region.width)

    sample_at(size, check=check)


def test_at_80_columns_the_lowest_columns_are_dropped_never_the_sorted_one():
    async def scenario():
        app = sample_app()
        async with app.run_test(size=SMALL) as pilot:
            await settle(app, pilot)
            header = region_lines(app, "#ranks")[0]
            assert header.split() == ["rank▲", "pid", "comm", "written", "WRITEs", "p99", "ms", "slot", "wait",
                                      "blocked", "now"]
            await pilot.press("s")                  # sorted by host: it is shown, the next lowest goes
            await pilot.pause()
            header = region_lines(app, "#ranks")[0]
            header_titles_whole(header)
            assert "host▲" in header and "pid" not in header and "mean WRITE" not in header
    run(scenario())


def test_the_findings_screen_wraps_once_to_its_width():
    def check(app):
        lines = region_lines(app, "#findings-text")
        start = next(i for i, line in enumerate(lines) if "slot table toward" in line)
        end = next(i for i, line in enumerate(lines) if line.strip().startswith("evidence:"))
        summary = app.result.analysis["findings"][0]["summary"]
        assert " ".join(w for line in lines[start:end] for w in line.split()) == " ".join(summary.split())
        assert end - start >= 3
        assert_wrapped_once(lines[start:end], app.screen.query_one("#findings-text").content_region.width)

    sample_at(SMALL, "f", check=check)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=lambda s: f"{s[0]}x{s[1]}")
def test_drill_down_header_breaks_between_items_only(size):
    def check(app):
        lines = [line.strip() for line in region_lines(app, "#rank-title")]
        assert " · ".join(lines) == text(app, "#rank-title")
        assert lines[0].startswith("rank 0 on vm · pids 202") and lines[-1].endswith("slot wait 12.05 s")
        assert len(lines) == (1 if size == LARGE else 3)
        # and the three tables are on screen: the files' last row above the footer
        files = app.screen.query_one("#files").region
        assert files.bottom <= size[1] - 1 and app.screen.max_scroll_y == 0

    sample_at(size, "enter", check=check)


# ---- snapshots at 80x24, 120x40 and 160x45 ----

def test_snapshot_main_screen(cap, snap_compare):
    app = make_app(cap, poll_seconds=60)

    async def loaded(pilot):
        await settle(app, pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


SIZES = [SMALL, SIZE, LARGE]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_sample_main_screen(snap_compare, size):
    app = sample_app()

    async def into_the_save(pilot):
        await settle(app, pilot)
        await pilot.press(*["left"] * 8)             # 20.3 s: ranks 1 and 5 blocked in write
        await settle(app, pilot)

    assert snap_compare(app, terminal_size=size, run_before=into_the_save)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_sample_drill_down(snap_compare, size):
    app = sample_app()

    async def drill(pilot):
        await settle(app, pilot)
        await pilot.press(*["left"] * 8)
        await settle(app, pilot)
        await pilot.press("down", "enter")           # rank 1, blocked in write at 20.3 s
        await settle(app, pilot)

    assert snap_compare(app, terminal_size=size, run_before=drill)


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_help(cap, snap_compare, size):
    app = make_app(cap, poll_seconds=60)

    async def help_(pilot):
        await settle(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=help_)


def test_snapshot_in_a_save_at_80x24(saves_cap, snap_compare):  # noqa: F811
    app = make_app(saves_cap, poll_seconds=60)

    async def to_save_2(pilot):
        await settle(app, pilot)
        await pilot.press("home")
        await settle(app, pilot)
        await pilot.press("right_square_bracket", "right_square_bracket")
        await settle(app, pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=to_save_2)


def test_snapshot_no_save_at_80x24(tmp_path, snap_compare):
    path = str(tmp_path / "cap")
    write_capture(path, {"procs": PROCS[:1], "syscall": [sc(10, "openat", ts=at(1)), sc(10, "read", ts=at(2))]})
    app = make_app(path, poll_seconds=60)

    async def next_save(pilot):
        await settle(app, pilot)
        await pilot.press("right_square_bracket")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=next_save)


def test_a_sampled_capture_shows_its_ranks_slots_and_waits(tmp_path):
    """record --no-bpf's capture (tests/synth.py, a storm through 4 slots): the ranks from
    /proc/PID/io, the slots from mountstats' counters, a rank's drill-down from its samples
    (before, the TUI showed 0 ranks and no slot data on such a capture)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import synth

    man = synth.save(tmp_path / "cap", ranks=16, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096,
                     stagger_ms=25, sampled_s=0.1)

    async def scenario():
        from textual.widgets import DataTable
        app = make_app(man["path"])
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert "16 ranks" in banner(app) and len(rows(app)) >= 8
            assert column(app, "written")[0] == "256.0 KiB"
            nfs = text(app, "#nfs")
            assert "limit 4 · peak 4" in nfs and "mountstats" in nfs and "no RPC data" not in nfs
            await pilot.press("enter")
            await settle(app, pilot)
            assert "written 256.0 KiB (/proc/PID/io)" in text(app, "#rank-title")
            waits = app.screen.query_one("#syscalls", DataTable)
            kinds = [waits.get_row_at(i)[0] for i in range(waits.row_count)]
            assert "writeback" in kinds or "rpc" in kinds
            files = app.screen.query_one("#files", DataTable)
            assert files.row_count == 1 and files.get_row_at(0)[0].endswith("rank0.pt")
    run(scenario())
