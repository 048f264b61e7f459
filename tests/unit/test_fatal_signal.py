"""A fatal signal in the agent (a SIGSEGV in a C extension killed it once on 7.3, leaving no
trace) prints each thread's Python stack to stderr, which the agent's log keeps."""
import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_a_segfault_leaves_the_python_stacks(tmp_path):
    agent = subprocess.Popen([sys.executable, "-m", "slotscope.cli", "record", "--no-bpf", "--fs", "any",
                              "-o", str(tmp_path / "cap"), "--duration", "60"],
                             stderr=subprocess.PIPE, text=True)
    try:
        for line in agent.stderr:       # until it records
            if "recording" in line:
                break
        agent.send_signal(signal.SIGSEGV)
        err = agent.stderr.read()
        assert agent.wait(timeout=30) == -signal.SIGSEGV
    finally:
        agent.kill()
    assert "Fatal Python error: Segmentation fault" in err, err
    assert os.path.join("cli", "main.py") in err, err      # every thread's stack, the main one's too
