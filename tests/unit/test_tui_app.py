"""`slotscope top` with Textual's Pilot: keys, sort, filter, drill-down, scrubbing, live follow."""
from __future__ import annotations

import asyncio

import pytest

from slotscope.agent.capture_writer import CaptureWriter
from slotscope.agent.tables import SCHEMAS
from slotscope.analyzer.job import Job
from test_tui_timeline import PROCS, SYSCALLS, at, grow
from unit_helpers import START_NS, meta, procs_table, run_slotscope, assert_one_line_error, sc

pytestmark = pytest.mark.unit

SIZE = (120, 40)
FIXED_NOW = START_NS / 1e9 + 3600        # the capture started an hour ago


def make_app(path, **kw):
    from slotscope.tui.app import TopApp
    return TopApp(Job.open([path]), poll_seconds=kw.pop("poll_seconds", 0.05), clock=lambda: FIXED_NOW, **kw)


async def settle(app, pilot) -> None:
    """Let the loading worker finish and its message be handled."""
    for _ in range(3):
        await pilot.pause()
        await app.workers.wait_for_complete()
    await pilot.pause()


def rows(app) -> list[tuple]:
    from textual.widgets import DataTable
    table = app.query_one("#ranks", DataTable)
    return [tuple(table.get_row_at(i)) for i in range(table.row_count)]


def column(app, title: str) -> list[str]:
    from slotscope.tui.panels import RANK_COLUMNS
    i = [t for t, _, _ in RANK_COLUMNS].index(title)
    return [r[i] for r in rows(app)]


def banner(app) -> str:
    return str(app.query_one("#banner").render())


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def cap(build_capture):
    return build_capture(syscalls=SYSCALLS, procs=PROCS)


def test_import():
    import slotscope.tui.app as app_module
    assert hasattr(app_module, "run")


def test_main_screen(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert column(app, "rank") == ["0", "1", "2", "-"]
            assert column(app, "comm") == ["python", "python", "zzz", "rsync"]
            assert column(app, "written")[:2] == ["12.0 KiB", "98.6 KiB"]
            assert column(app, "p99 ms")[0] == "50.0"
            assert column(app, "slowest recent (5 s)") == ["-"] * 4     # the cursor is at 61 s
            text = banner(app)
            assert "verdict: healthy" in text and "host node-a" in text and "REPLAY" in text
            assert "started 60 min ago" in text and "0 events lost" in text
            assert "no RPC data in this capture" in str(app.query_one("#nfs").render())
            assert "no findings" in str(app.query_one("#findings").render())
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0
    run(scenario())


def test_sort_cycles_columns(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            for _ in range(4):                      # rank, host, pids, comm -> written
                await pilot.press("s")
            await pilot.pause()
            assert column(app, "rank") == ["1", "0", "2", "-"]      # most bytes written first
            assert "sort: written" in banner(app)
            await pilot.press("s", "s", "s")        # -> p99 ms
            await pilot.pause()
            assert column(app, "rank")[0] == "0"
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
            assert column(app, "comm") == ["rsync"] and "filter: 'rsy'" in banner(app)
            await pilot.press("escape")             # clears it
            await pilot.pause()
            assert len(rows(app)) == 4
            await pilot.press("slash", "z", "z", "z", "z")
            await pilot.pause()
            assert column(app, "comm") == ["no rank matches"]
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
            await pilot.pause()
            assert isinstance(app.screen, RankScreen)
            calls = app.screen.query_one("#syscalls", DataTable)
            assert [tuple(calls.get_row_at(i)) for i in range(calls.row_count)] == [
                ("fsync", "1", "50.0", "50.0"), ("write", "2", "4.0", "3.0")]
            files = app.screen.query_one("#files", DataTable)
            assert [files.get_row_at(i)[:2] for i in range(files.row_count)] == [
                ["/mnt/ckpt/optim", "8.0 KiB"], ["/mnt/ckpt/shard", "4.0 KiB"]]
            assert "rank 0" in str(app.screen.query_one("#rank-title").render())
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, RankScreen)
            await pilot.press("down", "down", "down", "enter")     # the process without a rank
            await pilot.pause()
            assert "pid 13 (no rank)" in str(app.screen.query_one("#rank-title").render())
    run(scenario())


def test_scrub_changes_what_the_table_shows(cap):
    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert len(rows(app)) == 4
            await pilot.press("home")
            await settle(app, pilot)
            assert column(app, "comm") == ["no traced syscalls"]
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


def test_help(cap):
    async def scenario():
        from slotscope.tui.panels import HelpScreen
        app = make_app(cap)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen)
    run(scenario())


def test_live_follow_shows_a_new_rank_and_pause(tmp_path):
    path = str(tmp_path / "live")
    live_meta = meta()
    del live_meta["stop"]
    w = CaptureWriter(path, SCHEMAS)
    w.write_meta(live_meta)
    w.append("procs", procs_table([p for p in PROCS]))
    w.tables["procs"].close_segment()
    grow(w, [sc(10, "write", 1000, 100, ts=at(1))])

    async def wait_for(app, pilot, cond):
        for _ in range(100):
            await settle(app, pilot)
            if cond():
                return
            await pilot.pause(0.05)
        raise AssertionError(rows(app))

    async def scenario():
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(app, pilot, lambda: column(app, "rank") == ["0"])
            assert "LIVE" in banner(app) and "following" in banner(app)
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


def test_cli_bad_capture(tmp_path):
    res = run_slotscope("top", str(tmp_path / "missing"))
    assert_one_line_error(res, "no such capture directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_slotscope("top", str(tmp_path / "empty")), "empty directory")


def test_snapshot_main_screen(cap, snap_compare):
    app = make_app(cap, poll_seconds=60)

    async def loaded(pilot):
        await settle(app, pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)
