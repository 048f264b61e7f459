"""Helpers of the live tier: run the CLI as a user would, in a fresh interpreter; load the
syscall probes on a child process that a test drives line by line."""
import select
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from slotscope.agent.probes import Filters, SyscallProbes, load


def slotscope(*args, **kw):
    """Run the CLI as a user would, in a fresh interpreter."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run([sys.executable, "-m", "slotscope.cli", *args], **kw)


def start_slotscope(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "slotscope.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_recording(proc, timeout=60.0):
    """Block until the agent says it is recording (its first stderr line)."""
    end = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            seen += line
            if "recording to" in line:
                return
            if not line and proc.poll() is not None:
                break
    raise AssertionError(f"agent did not start recording: {seen}")


@contextmanager
def python_child(script: str):
    """A Python child running `script`, which reads commands from stdin (see ask)."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def ask(child, command) -> str:
    """Send a command line to a python_child; its one-line answer."""
    child.stdin.write(f"{command}\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


@contextmanager
def syscall_probes_on(pid: int):
    """The syscall probes loaded to trace `pid` only (the test skips where they cannot run)."""
    probes = SyscallProbes()
    if probes.can_run():
        pytest.skip(probes.can_run())
    loaded = load([probes], Filters(tgids=[pid]))
    try:
        yield loaded
    finally:
        loaded.close()
