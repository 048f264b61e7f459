"""Helpers of the live tier: run the CLI as a user would, in a fresh interpreter."""
import select
import subprocess
import sys
import time


def slotscope(*args, **kw):
    """Run the CLI as a user would, in a fresh interpreter."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run([sys.executable, "-m", "slotscope.agent.cli", *args], **kw)


def start_slotscope(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "slotscope.agent.cli", *args],
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
