"""Where the TUI's analysis runs: a separate process by default.

The analysis (analyzer.view.overview) is Python and Arrow code that holds the GIL for
tens of milliseconds at a time with 1,000 ranks; in a thread of the UI's process every such
stretch is a frame the screen cannot draw and a key it cannot answer (bench/tui.py measured
UI-loop stalls of 90-280 ms that way). In its own process it costs the screen nothing: the
UI sends (cursor, bins, drill-down, refresh) and gets back the result, an analyzer.view.Overview,
pickled (a few thousand small objects for 1,000 ranks). The process also holds the capture's
tables, so the UI process never does.

ThreadAnalyst is the same work in the calling thread: the process runs one, and tests and the
benchmark can use it directly.
"""
from __future__ import annotations

import gc
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections import OrderedDict

from slotscope.analyzer.job import Job
from slotscope.capture.meta import CaptureError
from slotscope.analyzer.timeline import JobSource
from slotscope.analyzer.view import Overview, overview

CACHE_RESULTS = 8           # results kept for scrubbing back (each holds every rank)
NICE = 10                   # the analysis process's niceness


class AnalysisError(Exception):
    """The analysis failed; the message is for the banner."""


class ThreadAnalyst:
    def __init__(self, job: Job, version: str):
        self.source = JobSource(job)
        self.version = version
        self.lock = threading.Lock()
        self.cache: OrderedDict = OrderedDict()

    def overview(self, until: int | None, bins: int, detail, refresh: bool) -> Overview:
        with self.lock:
            try:
                if refresh:
                    self.source.refresh()
                key = (self.source.generation, until, bins, detail and (detail[0], tuple(detail[1])))
                result = self.cache.get(key)
                if result is None:
                    result = overview(self.source, until, self.version, bins=bins, detail=detail)
                    self.cache[key] = result
                    while len(self.cache) > CACHE_RESULTS:
                        self.cache.popitem(last=False)
                return result
            except CaptureError as exc:     # a live capture that turned bad (a newer table...): the banner says so
                raise AnalysisError(str(exc)) from None
            except Exception as exc:        # a capture being replaced under us: the banner says so
                raise AnalysisError(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        pass


def serve() -> None:
    """The analysis process (`python -m slotscope.tui.worker`): pickled requests on stdin,
    answers on stdout (8-byte length, then the pickle), until stdin closes. Anything else the process prints goes to
    stderr (the UI sends that to /dev/null: its own stderr is the screen)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C belongs to the UI, which stops us
    try:
        os.nice(NICE)                                 # on a busy machine the screen goes first
    except OSError:
        pass
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                                     # a stray print must not corrupt the answers
    inp = sys.stdin.buffer
    paths, version = pickle.load(inp)
    try:
        analyst, failure = ThreadAnalyst(Job.open(paths), version), None
    except CaptureError as exc:         # the UI opened it a moment ago: it changed since
        analyst, failure = None, str(exc)
    except Exception as exc:
        analyst, failure = None, f"{type(exc).__name__}: {exc}"
    frozen = False
    while True:
        try:
            request = pickle.load(inp)
        except (EOFError, OSError):
            return
        try:
            if analyst is None:
                raise AnalysisError(failure)
            answer = ("ok", analyst.overview(**request))
        except AnalysisError as exc:
            answer = ("error", str(exc))
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(struct.pack("<Q", len(data)) + data)
        out.flush()
        if not frozen:              # modules and the capture's first reads: out of full GC passes
            gc.freeze()
            frozen = True


class ProcessAnalyst:
    """ThreadAnalyst in a child process (a fresh interpreter, whatever threads the UI runs);
    started again if it dies."""

    def __init__(self, job: Job, version: str):
        self.paths = [c.path for c in job.captures]
        self.version = version
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "slotscope.tui.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        self._send((self.paths, self.version))

    def _send(self, obj) -> None:
        pickle.dump(obj, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def overview(self, until: int | None, bins: int, detail, refresh: bool) -> Overview:
        request = {"until": until, "bins": bins, "detail": detail, "refresh": refresh}
        with self.lock:
            for attempt in (1, 2):
                proc = self.proc
                if proc is None:
                    raise AnalysisError("the analysis process was stopped")
                try:
                    self._send(request)
                    status, payload = self._receive(proc)
                    break
                except (EOFError, OSError, pickle.UnpicklingError, ValueError, struct.error):
                    if self.proc is None or attempt == 2:
                        raise AnalysisError("the analysis process died") from None
                    self._kill(proc)
                    self._start()
                    request["refresh"] = True
        if status == "error":
            raise AnalysisError(payload)
        return payload

    @staticmethod
    def _receive(proc: subprocess.Popen):
        """One answer: its length, then its bytes (read without the GIL), then unpickled at
        once (a few ms for 1,000 ranks; unpickling from the pipe as it arrives would hold the
        GIL in many short stretches for as long as the other process takes to write)."""
        head = proc.stdout.read(8)
        if len(head) < 8:
            raise EOFError
        (n,) = struct.unpack("<Q", head)
        data = proc.stdout.read(n)
        if len(data) < n:
            raise EOFError
        return pickle.loads(data)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            proc.wait(1)                    # stdin closed: it exits by itself
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the process now (a load waiting for it gets an error it no longer needs)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass


if __name__ == "__main__":
    serve()
