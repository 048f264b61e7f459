"""A stop by the user ends the traced command: `record --tui -- COMMAND` in a real terminal (tmux)
then q, and plain `record -- COMMAND` then SIGTERM. The command and the child it started are
gone (SIGTERM to its process group), the exit status is the command's (143: SIGTERM), and the
capture's stop reason says who stopped it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from livehelp import start_slotscope, wait_recording
from slotscope.capture.reader import Capture

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from unit_helpers import slotscope_command  # noqa: E402

pytestmark = pytest.mark.live

SIGTERM_STATUS = 128 + signal.SIGTERM


def command(pids: Path, ignore_sigterm: bool = False) -> list[str]:
    """A shell that starts a child in its process group, writes both pids and waits (both
    ignoring SIGTERM, if asked: an ignored signal stays ignored across fork and exec)."""
    trap = "trap '' TERM; " if ignore_sigterm else ""
    return ["sh", "-c", f"{trap}sleep 600 & echo $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"]


def running(pid: int) -> bool:
    """Alive and not a zombie (a child reparented to a pid 1 that does not reap stays one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_for_pids(path: Path, timeout: float = 30) -> list[int]:
    """The shell's and its child's pids, once the traced command has started and written them."""
    end = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    pids = read_pids(path)
    assert len(pids) == 2 and all(running(p) for p in pids), pids
    return pids


def assert_stopped(pids: Path, cap: Path, reason: str) -> None:
    """The command and its child are gone; the capture says who stopped the recording."""
    assert [p for p in read_pids(pids) if running(p)] == []
    assert Capture.open(str(cap)).meta["stop_reason"] == reason


def kill_what_is_left(pids: Path) -> None:
    for pid in read_pids(pids):
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def test_q_in_record_tui_stops_the_traced_command(bpf_ready, tmux, tmp_path):
    pids, cap = tmp_path / "pids", tmp_path / "cap"
    try:
        tmux.start(*slotscope_command(), "record", "--tui", "-o", str(cap), "--path", str(tmp_path),
                   "--", *command(pids))
        tmux.wait_for("LIVE", timeout=120)
        wait_for_pids(pids)
        tmux.keys("q")
        assert tmux.exit_status(timeout=60) == f"EXIT={SIGTERM_STATUS}"
        screen = tmux.screen()
        assert "stopped the traced command" in screen and "stopped (q)" in screen
        assert_stopped(pids, cap, "q")
    finally:
        tmux.close()
        kill_what_is_left(pids)


@pytest.mark.parametrize("ignore_sigterm, status, said", [
    (False, SIGTERM_STATUS, "stopped the traced command: SIGTERM to its process group (pid "),
    (True, 128 + signal.SIGKILL, "stopped the traced command: SIGKILL to its process group (pid "),
])
def test_sigterm_to_record_stops_the_traced_command(bpf_ready, tmp_path, ignore_sigterm, status, said):
    pids, cap = tmp_path / "pids", tmp_path / "cap"
    # stdin not a terminal: the command is not the terminal's job, it gets a process group of its own
    agent = start_slotscope("record", "-o", str(cap), "--path", str(tmp_path), "-q",
                            "--", *command(pids, ignore_sigterm), stdin=subprocess.DEVNULL)
    try:
        wait_recording(agent)
        wait_for_pids(pids)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == status
        err = agent.stderr.read()
        assert said in err, err
        assert_stopped(pids, cap, "SIGTERM")
    finally:
        agent.kill()
        kill_what_is_left(pids)


def test_duration_stops_the_traced_command(bpf_ready, tmp_path):
    """--duration before the command's end: the command is stopped too, never left running."""
    pids, cap = tmp_path / "pids", tmp_path / "cap"
    agent = start_slotscope("record", "-o", str(cap), "--path", str(tmp_path), "-q", "--duration", "3",
                            "--", *command(pids), stdin=subprocess.DEVNULL)
    try:
        wait_recording(agent)
        wait_for_pids(pids)
        assert agent.wait(60) == SIGTERM_STATUS
        assert "stopped the traced command: SIGTERM to its process group" in agent.stderr.read()
        assert_stopped(pids, cap, "duration reached")
    finally:
        agent.kill()
        kill_what_is_left(pids)
