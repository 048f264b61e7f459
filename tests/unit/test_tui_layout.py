"""How the TUI fits text to a width: the rank table's and RPC panel's columns (dropped whole,
lowest priority first, never the sorted one) and the panels' paragraphs (broken between
items, wrapped once, with a hanging indent)."""
from __future__ import annotations

import pytest
from rich.text import Text

from slotscope.tui.flow import Flow, Para
from slotscope.tui.panels import BAR_W, RpcPanel
from slotscope.tui.ranktable import Column, fit_columns, fit_path

pytestmark = pytest.mark.unit


def col(title, width, priority, min_width=0):
    return Column(title, width, str, priority=priority, min_width=min_width)


COLUMNS = [col("a", 5, 9), col("b", 4, 0), col("c", 6, 5), col("rest", 0, 8, min_width=10)]


def test_all_columns_fit_and_the_flexible_one_takes_the_rest():
    assert fit_columns(COLUMNS, 40) == [(0, 5), (1, 4), (2, 6), (3, 22)]


def test_columns_that_do_not_fit_are_dropped_lowest_priority_first():
    assert fit_columns(COLUMNS, 28) == [(0, 5), (1, 4), (2, 6), (3, 10)]     # just fits
    assert fit_columns(COLUMNS, 27) == [(0, 5), (2, 6), (3, 14)]            # b (priority 0) goes first
    assert fit_columns(COLUMNS, 20) == [(0, 5), (3, 14)]                    # then c


def test_the_kept_column_stays_and_the_next_lowest_goes_instead():
    assert fit_columns(COLUMNS, 27, keep=1) == [(0, 5), (1, 4), (3, 16)]


def test_too_narrow_for_even_one_column_the_last_is_narrowed_not_cut_silently():
    assert fit_columns(COLUMNS, 4) == [(0, 4)]


def test_para_breaks_between_parts_only_with_a_hanging_indent():
    p = Para.of("verdict: slot_saturation", "host node-17", "8 ranks", "0 events lost")
    assert [t.plain for t in p.lines(40)] == ["verdict: slot_saturation · host node-17",
                                             "  8 ranks · 0 events lost"]


def test_a_part_wider_than_the_line_is_word_wrapped_once_under_its_indent():
    p = Para.of("fix: raise the slot table or mount with nconnect=8", indent=2)
    assert [t.plain for t in p.lines(24)] == ["  fix: raise the slot", "    table or mount with", "    nconnect=8"]


def test_a_word_longer_than_the_line_ends_in_an_ellipsis():
    p = Para.of("see /a/very/long/path/to/a/checkpoint/file.pt")
    assert [t.plain for t in p.lines(16)] == ["see", "  /a/very/long/…"]


def test_styles_are_kept_across_the_breaks():
    p = Para((Text.from_markup("[red]slot wait[/] is long"),))
    first, second = p.lines(10)
    assert first.plain == "slot wait" and first.spans[0].style == "red" and second.plain == "  is long"


def test_flow_text_is_its_paragraphs_unbroken():
    f = Flow.of(Para.of("a", "b"), Para.of(), Para.of("c", indent=2))
    assert str(f) == "a · b\n\n  c"
    assert [t.plain for t in f.lines(80)] == ["a · b", "", "  c"]


BY_PROC = {
    "WRITE": {"count": 10, "slot_wait_ns": 10 * 120e6, "transmit_wait_ns": 10 * 1e6, "rtt_ns": 10 * 40e6,
              "execute_ns": 10 * 170e6, "p99_ns": 240e6, "outstanding": 2},
    "COMMIT": {"count": 2, "slot_wait_ns": 0, "transmit_wait_ns": 0, "rtt_ns": 2 * 20e6, "execute_ns": 2 * 25e6,
               "p99_ns": 30e6},
    "GETATTR": {"count": 0, "outstanding": 1},
}


@pytest.mark.parametrize("width", [60, 78, 118, 158])
def test_rpc_panel_rows_are_one_line_each_at_every_width(width):
    lines = RpcPanel(BY_PROC).lines(width)
    assert [line.plain.split()[0] for line in lines] == ["procedure", "WRITE", "COMMIT", "GETATTR"]
    assert all(line.cell_len <= width for line in lines)
    assert lines[1].plain.count("█") >= BAR_W[0] or lines[1].plain.endswith("…")


def test_rpc_panel_drops_p99_first_and_keeps_the_bar():
    wide, narrow = (RpcPanel(BY_PROC).lines(w)[0].plain.split() for w in (118, 78))
    assert wide == ["procedure", "count", "█slot", "█xmit", "█rtt", "█rest", "execute", "p99", "split"]
    assert narrow == ["procedure", "count", "█slot", "█xmit", "█rtt", "█rest", "execute", "split"]


def test_a_long_path_is_cut_from_the_left_to_keep_the_file_name():
    assert fit_path("/mnt/ckpt/rank0/model.bin", 40) == "/mnt/ckpt/rank0/model.bin"
    assert fit_path("/mnt/ckpt/rank0/model.bin", 12) == "…0/model.bin"
    assert len(fit_path("/a" * 50, 20)) == 20 and fit_path("/a" * 50 + "/model.bin", 20).endswith("/model.bin")


def test_drill_down_at_80_columns_keeps_every_file_column_whole(build_capture):
    """Paths longer than the screen: the numbers stay whole, the paths are cut from the left."""
    from test_tui_app import PROCS, SMALL, SYSCALLS, make_app, run, settle
    deep = "/mnt/" + "a-long-directory/" * 6
    cap = build_capture(syscalls=[dict(r, path=deep + r["path"].rsplit("/", 1)[-1]) if r.get("path") else r
                                  for r in SYSCALLS], procs=PROCS)

    async def scenario():
        app = make_app(cap)
        async with app.run_test(size=SMALL) as pilot:
            await settle(app, pilot)
            await pilot.press("enter")
            await settle(app, pilot)
            files = app.screen.query_one("#files")
            assert [c.label.plain for c in files.columns.values()] == ["file", "written", "calls", "total ms", "max ms"]
            assert sum(c.get_render_width(files) for c in files.columns.values()) <= SMALL[0]
            paths = [files.get_row_at(i)[0] for i in range(files.row_count)]
            assert paths and all(p.startswith("…") and p.endswith(("/optim", "/shard")) for p in paths), paths
    run(scenario())
