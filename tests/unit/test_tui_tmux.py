"""`slotscope top` in a real terminal: tmux runs it at 120x40 on the shipped sample; the test
waits for the rank table, sends keys, reads the screen with capture-pane, asserts what it
shows, quits with q and checks the exit status; at 80x24, what must be on the first screen is.
`slotscope demo --sample` on a terminal opens the same screen. Needs the tmux binary (dev.sh
installs it); skipped without it, except in CI."""
from __future__ import annotations

import pytest

from terminal import WIDTH, rank_rows
from unit_helpers import slotscope_command

pytestmark = pytest.mark.unit


def test_top_in_a_real_terminal(tmux):
    from slotscope.cli.demo import sample_path
    try:
        tmux.start(*slotscope_command(), "top", sample_path())
        screen = tmux.wait_for("rank▲", "verdict: slot_saturation", "Findings (2)", rows=8)
        assert rank_rows(screen) == [str(i) for i in range(8)]
        assert "REPLAY" in screen and "cursor 25.4 s / 25.4 s" in screen
        assert "slots & link" in screen and "10.0.0.1:2049 in use" in screen and "limit 2" in screen
        assert "RPC latency per procedure" in screen and "WRITE         1,024" in screen
        assert "fix: raise the transport slot table" in screen
        assert len(max(screen.splitlines(), key=len)) <= WIDTH

        tmux.keys("s", "s", "s", "s")                       # rank, host, pid, comm -> written
        tmux.wait_for("sort: written", "written▼")

        tmux.keys("/", "3", "Enter")                        # filter: rank 3, and rank 1 by its pid 203
        screen = tmux.wait_for("filter: '3'")
        assert rank_rows(screen) == ["1", "3"]
        tmux.keys("Escape")                                 # clear the filter: until all 8 are back
        screen = tmux.wait_for("sort: written", rows=8)     # ("sort: written" shows before it clears)
        assert "filter:" not in screen

        tmux.keys(*["Left"] * 8)                            # scrub back into the save
        screen = tmux.wait_for("cursor 20.3 s / 25.4 s")
        assert "blocked now" in screen and "write 0." in screen

        tmux.keys("Enter")                                  # drill down into the first row
        screen = tmux.wait_for("RPCs (ms per RPC; attributed:", "/mnt/nfs/ckpt/rank")
        assert " on vm · pids " in screen and "WRITE" in screen
        tmux.keys("Escape")
        tmux.wait_for("Findings (2)")

        tmux.keys("?")
        tmux.wait_for("drill down into the selected rank")
        tmux.keys("Escape")
        tmux.wait_for("Findings (2)")

        tmux.keys("[")                                      # back to the start of the sample's one save
        screen = tmux.wait_for("cursor 7.5 s / 25.4 s", "save 1 of 1 · 4.0 MiB in 17.6 s · ckpt/: 8 files")
        assert "[] saves" in screen
        tmux.keys("]")                                      # no save after it: one line says so
        tmux.wait_for("save 1 of 1 is the last")

        tmux.keys("q")
        assert tmux.exit_status() == "EXIT=0"
    finally:
        tmux.close()


def test_top_at_80x24_shows_the_verdict_rpc_split_and_first_ranks(tmux):
    from slotscope.cli.demo import sample_path
    try:
        tmux.start(*slotscope_command(), "top", sample_path(), size=(80, 24))
        # the first four ranks: rank, pid, comm (the host is left out at 80 columns)
        screen = tmux.wait_for("rank▲", "verdict: slot_saturation", "Findings (2)", rows=4)
        lines = screen.splitlines()
        assert lines[0].startswith(" verdict: slot_saturation (critical)")
        assert rank_rows(screen) == ["0", "1", "2", "3"]
        header = next(line for line in lines if line.startswith("rank▲"))
        assert header.split() == ["rank▲", "pid", "comm", "written", "WRITEs", "p99", "ms", "slot", "wait",
                                  "blocked", "now"]
        write = next(i for i, line in enumerate(lines) if line.startswith(" WRITE "))
        assert "█" * 12 in lines[write] and lines[write + 1].startswith(" ACCESS ")     # by cost, then CREATE
        assert lines[write + 2].startswith(" CREATE ")
        assert "? help" in lines[-1] and "f findings" in lines[-1]
        tmux.keys("q")
        assert tmux.exit_status() == "EXIT=0"
    finally:
        tmux.close()


def test_demo_sample_opens_the_tui_on_a_terminal(tmux):
    try:
        tmux.start(*slotscope_command(), "demo", "--sample")
        screen = tmux.wait_for("rank▲", "verdict: slot_saturation")
        assert len(rank_rows(screen)) == 8
        tmux.keys("q")
        assert tmux.exit_status() == "EXIT=0"
    finally:
        tmux.close()
