"""A capture shown to its reader: the TUI on a terminal, else its analysis as text, as `analyze`
prints it (a pipe, a file, CI: `slotscope top CAPTURE | head` must end, and hold no escape codes)."""
from __future__ import annotations

import os
import sys


def interactive() -> bool:
    """A terminal on both ends: the TUI can run (else the analysis is printed)."""
    return sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def show(job, poll_seconds: float = 1.0) -> int:
    """The job in the TUI on a terminal, else its analysis as text."""
    if interactive():
        from slotscope.tui.app import run_app
        return run_app(job, poll_seconds)
    from slotscope.analyzer.analysis import analyze
    from slotscope.analyzer.report_text import render_text
    from slotscope.capture.meta import slotscope_version
    print(render_text(analyze(job, slotscope_version())))
    return 0
