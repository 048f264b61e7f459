"""`slotscope top CAPTURE | head`: stdin the user's terminal, stdout a pipe. `top` prints the
analysis, as `analyze` does, and exits, instead of drawing escape codes into the pipe for ever."""
from __future__ import annotations

import os
import subprocess

import pytest

from unit_helpers import run_slotscope, slotscope_command

pytestmark = pytest.mark.unit

TIMEOUT_S = 60


@pytest.fixture
def terminal_stdin():
    """The slave side of a pseudo-terminal: what a shell gives `top` as stdin."""
    master, slave = os.openpty()
    yield slave
    os.close(master)
    os.close(slave)


def test_top_into_a_pipe_prints_the_analysis_and_ends(terminal_stdin):
    from slotscope.cli.demo import sample_path
    res = subprocess.run(slotscope_command() + ["top", sample_path()], stdin=terminal_stdin,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout
    assert res.stdout == run_slotscope("analyze", sample_path()).stdout


def test_top_into_head_ends_quietly(terminal_stdin):
    from slotscope.cli.demo import sample_path
    top = subprocess.Popen(slotscope_command() + ["top", sample_path()], stdin=terminal_stdin,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        head = subprocess.run(["head", "-n", "1"], stdin=top.stdout, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        top.stdout.close()
        assert top.wait(TIMEOUT_S) == 0
    finally:
        top.kill()
    assert head.stdout == run_slotscope("analyze", sample_path()).stdout.splitlines(keepends=True)[0]
    assert top.stderr.read() == b""
