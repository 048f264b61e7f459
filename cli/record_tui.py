"""`slotscope record --tui`: record, and watch the capture being written in the TUI.

The recorder runs in a child process, forked before anything of the UI is imported: its drain
loop keeps its own interpreter (no GIL shared with the screen), its signal handling stays the
recorder's own (SIGINT/SIGTERM stop it cleanly, writing the stop record), and a slow screen
can never make it lose events. The TUI in the foreground reads the capture the child writes,
the same way `slotscope top` follows any live capture. Quitting the TUI (q, or Ctrl-C, which
the TUI reads as a key) sends the recorder QUIT_SIGNAL, its stop reason "q", and waits for it
to finish the capture: a traced command is stopped with it (SIGTERM to the command's process
group, SIGKILL after a grace period: the recorder's own way of ending it at a stop), and the
exit status is the recorder's, which is the command's. The recorder's own messages (and a traced
command's output) go to a log, printed when the screen is gone. If this process dies, the kernel
sends the recorder SIGTERM (PR_SET_PDEATHSIG), so it never records on unattended.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import tempfile
import time

STOP_TIMEOUT = 60.0        # s to wait for the recorder to detach its probes and close the capture
LOG_LINES = 200            # lines of the recorder's log printed at the end
QUIT_SIGNAL = signal.SIGUSR2   # to the recorder: the user quit the TUI (SIGUSR1 is its next capture)


def _die_with_parent() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)          # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(opts, argv, log_fd: int, record) -> None:
    """The forked recorder: never returns."""
    code = 1
    try:
        _die_with_parent()
        if os.getppid() == 1:                  # the parent died before the line above
            os._exit(1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)                       # the terminal's keys belong to the TUI
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        if record is None:
            from slotscope.agent.recorder import RecordError, record as record_
            try:
                code = record_(opts, argv)
            except RecordError as exc:
                print(f"slotscope record: {exc}", file=sys.stderr)
                code = 1
        else:
            code = record(opts, argv)
    except KeyboardInterrupt:
        code = 130
    except BaseException:                     # noqa: BLE001 (the child must always exit here)
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _status(pid: int, block: bool) -> int | None:
    got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    if not got:
        return None
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _stop(pid: int, timeout: float = STOP_TIMEOUT) -> int:
    """Tell the recorder the user quit and wait for it to write its stop record; SIGKILL after `timeout`."""
    try:
        os.kill(pid, QUIT_SIGNAL)
    except ProcessLookupError:
        pass
    end = time.monotonic() + timeout
    while True:
        try:
            code = _status(pid, block=False)
        except ChildProcessError:
            return 1
        if code is not None:
            return code
        if time.monotonic() > end:
            print(f"slotscope: the recorder did not stop within {timeout:.0f} s: killing it", file=sys.stderr)
            os.kill(pid, signal.SIGKILL)
            return _status(pid, block=True) or 137
        try:
            time.sleep(0.05)
        except KeyboardInterrupt:              # a second Ctrl-C: keep waiting, the capture is closing
            pass


def _print_log(path: str) -> None:
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return
    if len(lines) > LOG_LINES:
        print(f"slotscope: ... {len(lines) - LOG_LINES} earlier lines of the recorder's log not shown",
              file=sys.stderr)
    sys.stderr.write("".join(lines[-LOG_LINES:]))


def record_with_tui(opts, argv: list[str], record=None, run_ui=None, poll_seconds: float = 1.0) -> int:
    """Record `opts` in a child process and show the capture in the TUI until the user quits.
    `record(opts, argv)` and `run_ui(path)` replace the recorder and the TUI in tests."""
    if run_ui is None and not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("slotscope record: --tui needs a terminal (record without it, and watch the capture "
              "with `slotscope top` from one)", file=sys.stderr)
        return 1
    opts = dataclasses.replace(opts, quit_signal=QUIT_SIGNAL)
    fd, log = tempfile.mkstemp(prefix="slotscope-record-", suffix=".log")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(opts, argv, fd, record)
    os.close(fd)
    code: int | None = None
    try:
        meta = os.path.join(opts.output, "meta.json")
        said = False
        while code is None and not os.path.exists(meta):
            if not said:
                print("slotscope: loading the probes (the TUI opens when recording starts)...", file=sys.stderr)
                said = True
            time.sleep(0.05)
            code = _status(pid, block=False)
        if code is None:
            if run_ui is not None:
                run_ui(opts.output)
            else:
                from slotscope.capture.reader import CaptureError
                from slotscope.analyzer.job import Job
                from slotscope.tui.app import TopApp
                try:
                    job = Job.open([opts.output])
                except CaptureError as exc:
                    print(f"slotscope: {exc}", file=sys.stderr)
                else:
                    TopApp(job, poll_seconds=poll_seconds).run()
    except KeyboardInterrupt:
        pass
    finally:
        if code is None:
            code = _status(pid, block=False)
        if code is None:
            print(f"slotscope: stopping the recorder{' and the traced command' if opts.command else ''}...",
                  file=sys.stderr)
            code = _stop(pid)
        _print_log(log)
        os.unlink(log)
    return code
