"""Where the TUI's analysis runs: a separate process by default.

The analysis (analyzer.view.overview) is Python and Arrow code that holds the GIL for
tens of milliseconds at a time with 1,000 ranks; in a thread of the UI's process every such
stretch is a frame the screen cannot draw and a key it cannot answer (bench/tui.py measured
UI-loop stalls of 90-280 ms that way). In its own process it costs the screen nothing: the
UI sends (cursor, bins, drill-down, refresh, moving) and gets back the result, an
analyzer.view.Overview, pickled. The process also holds the capture's tables, so the UI
process never does.

A move of the cursor (moving: scrubbing, playing) is answered by analyzer.view.moved(): the
rank rows as of the new cursor, the findings as of an earlier one. The full analysis runs when
the cursor settles (the app asks again without `moving`), and while it keeps moving at most
FULL_SHARE of a core's time (bench/tui.py: at 1,000 ranks a move costs a few ms this way
against ~80 ms for the whole analysis). One that takes long (a job of 1,000 nodes: seconds)
runs in a thread beside the answers to moves, which would otherwise wait for it; the app asks
again until its result is there. Answers name the rank rows and the parts the UI already holds
instead of sending them again (pack/unpack).

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
import time
from collections import OrderedDict
from dataclasses import replace

from slotscope.analyzer.job import Job
from slotscope.capture.meta import CaptureError
from slotscope.analyzer.timeline import JobSource
from slotscope.analyzer.view import Overview, moved, overview

CACHE_RESULTS = 8           # results kept for scrubbing back (each holds every rank)
NICE = 10                   # the analysis process's niceness
FULL_SHARE = 0.02           # while the cursor moves, full analyses take at most this share of a core
BACKGROUND_CPU_S = 1.0      # a full analysis this long runs beside the answers to moves, not before them


class AnalysisError(Exception):
    """The analysis failed; the message is for the banner."""


class ThreadAnalyst:
    """incremental=False: every request a full analysis (bench/tui.py's baseline)."""

    def __init__(self, job: Job, version: str, incremental: bool = True):
        self.source = JobSource(job)
        self.version = version
        self.incremental = incremental
        self.lock = threading.Lock()                    # one request at a time
        self.kept = threading.Lock()                    # what follows, also written by the background
        self.cache: OrderedDict = OrderedDict()
        self.last: tuple[int, Overview] | None = None   # the newest full overview, of which generation
        self.full_cpu = 0.0                             # what it cost (CPU s), and when it was done
        self.full_done = 0.0
        self.background: threading.Thread | None = None

    def overview(self, until: int | None, bins: int, detail, refresh: bool, moving: bool = False) -> Overview:
        with self.lock:
            try:
                if refresh:
                    self.wait()                         # the data must not change under an analysis
                    self.source.refresh()
                key = (self.source.generation, until, bins, detail and (detail[0], tuple(detail[1])))
                with self.kept:
                    result = self.cache.get(key)
                if result is not None:
                    return result
                last = self._last(until, detail)
                quiet = moving and time.monotonic() - self.full_done < self.full_cpu / FULL_SHARE
                if last is not None and (quiet or self.full_cpu >= BACKGROUND_CPU_S):
                    fast = moved(self.source, until, last, bins)        # None: the index declines
                    if fast is not None:
                        if not quiet:                   # asked again, the cache will have it
                            self._beside(key, until, bins, detail)
                        return fast
                started = time.thread_time()
                result = overview(self.source, until, self.version, bins=bins, detail=detail)
                self._keep(key, result, time.thread_time() - started)
                return result
            except CaptureError as exc:     # a live capture that turned bad (a newer table...): the banner says so
                raise AnalysisError(str(exc)) from None
            except Exception as exc:        # a capture being replaced under us: the banner says so
                raise AnalysisError(f"{type(exc).__name__}: {exc}") from None

    def _last(self, until: int | None, detail) -> Overview | None:
        """The full overview a move is answered from (analyzer.view.moved), or None where only a
        full one will do: the first of this data, a drill-down (rank_detail is not incremental),
        the end of a live capture."""
        with self.kept:
            last = self.last
        if not self.incremental or until is None or detail or last is None or last[0] != self.source.generation:
            return None
        return last[1]

    def _keep(self, key, result: Overview, cpu: float) -> None:
        with self.kept:
            self.full_cpu, self.full_done = cpu, time.monotonic()
            self.last = (key[0], result)
            self.cache[key] = result
            while len(self.cache) > CACHE_RESULTS:
                self.cache.popitem(last=False)

    def _beside(self, key, until: int | None, bins: int, detail) -> None:
        """A full analysis in a thread beside the answers to moves (one at a time)."""
        if self.background is not None and self.background.is_alive():
            return

        def run():
            started = time.thread_time()
            try:
                result = overview(self.source, until, self.version, bins=bins, detail=detail)
            except Exception:           # asked again, it runs in the request and says what went wrong
                return
            self._keep(key, result, time.thread_time() - started)

        self.background = threading.Thread(target=run, name="full analysis", daemon=True)
        self.background.start()

    def wait(self) -> None:
        """Until the full analysis running beside the answers, if any, is done."""
        if self.background is not None:
            self.background.join()

    def close(self) -> None:
        pass


# Parts of an answer that stay the same objects from move to move (the analysis until the cursor
# settles, the series and saves until the data grows): sent once, then as None.
KEPT = ("analysis", "series", "saves")


def pack(result: Overview, sent: dict) -> Overview:
    """`result` as sent to a UI that holds what `sent` says (updated here): the rank rows it
    holds (the same or equal) by their key, the KEPT parts it holds as None. A move changes a
    few hundred of 1,000 rows; sent whole, the answer took the UI 4 ms to unpickle at 1,000
    ranks and 100 ms at 8,000, holding the GIL that long."""
    held = sent.get("rows", {})
    ranks = [row.key if (old := held.get(row.key)) is row or old == row else row for row in result.ranks]
    sent["rows"] = {row.key: row for row in result.ranks}
    kept = {}
    for name in KEPT:
        value = getattr(result, name)
        kept[name] = None if value is sent.get(name) else value
        sent[name] = value
    return replace(result, ranks=ranks, **kept)


def unpack(packed: Overview, held: dict) -> Overview:
    """pack()'s answer whole again, from what the UI holds (`held`, updated here)."""
    rows = held.get("rows", {})
    ranks = [rows[r] if isinstance(r, tuple) else r for r in packed.ranks]
    held["rows"] = {row.key: row for row in ranks}
    for name in KEPT:
        if getattr(packed, name) is not None:
            held[name] = getattr(packed, name)
    return replace(packed, ranks=ranks, **{name: held[name] for name in KEPT})


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
    paths, version, incremental = pickle.load(inp)
    try:
        analyst, failure = ThreadAnalyst(Job.open(paths), version, incremental), None
    except CaptureError as exc:         # the UI opened it a moment ago: it changed since
        analyst, failure = None, str(exc)
    except Exception as exc:
        analyst, failure = None, f"{type(exc).__name__}: {exc}"
    frozen = False
    sent: dict = {}
    while True:
        try:
            request = pickle.load(inp)
        except (EOFError, OSError):
            return
        try:
            if analyst is None:
                raise AnalysisError(failure)
            answer = ("ok", pack(analyst.overview(**request), sent))
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

    def __init__(self, job: Job, version: str, incremental: bool = True):
        self.paths = [c.path for c in job.captures]
        self.version = version
        self.incremental = incremental
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "slotscope.tui.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        self.held: dict = {}            # what the process has sent (a new one sends everything)
        self._send((self.paths, self.version, self.incremental))

    def _send(self, obj) -> None:
        pickle.dump(obj, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def overview(self, until: int | None, bins: int, detail, refresh: bool, moving: bool = False) -> Overview:
        request = {"until": until, "bins": bins, "detail": detail, "refresh": refresh, "moving": moving}
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
            return unpack(payload, self.held)

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
