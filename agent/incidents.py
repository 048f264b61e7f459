"""`slotscope watch`'s incidents: each an ordinary capture under --out, written by a thread of
its own (the drain never waits on the disk), then analysed by a process of its own (the
daemon's memory stays small), and the oldest removed when they take more than --max-disk.

An incident is `<out>/incident-<UTC>-<trigger>/`, created through capture/'s writer: the same
safe path walk, 0600/0700 modes and lock as `record`. Its reports (report.txt, report.json,
report.html) are written into it once its capture is closed.
"""
from __future__ import annotations

import os
import queue
import re
import shutil
import stat
import subprocess
import sys
import threading
import time

from slotscope.capture.safepath import open_parent, open_subdir
from slotscope.capture.writer import CaptureWriteError, CaptureWriter

from .flight import rows_of
from .priority import as_own

INCIDENT_RE = re.compile(r"incident-\d{8}T\d{6}(?:\.\d+)?Z-[a-z_]+")
REPORTS = ("report.txt", "report.json", "report.html")
ANALYSIS_TIMEOUT = 900.0    # s; an analysis that takes longer is stopped (its capture stays)


def incident_name(realtime_ns: int, trigger: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(realtime_ns // 1_000_000_000))
    return f"incident-{stamp}Z-{trigger}"


def open_out(out: str, dir_mode: int = 0o700) -> None:
    """Create --out if missing (0700, through safepath's walk), refuse it when it is not ours."""
    pfd, base = open_parent(out)
    try:
        try:
            os.mkdir(base, dir_mode, dir_fd=pfd)
        except FileExistsError:
            pass
        fd = open_subdir(base, pfd)
    finally:
        os.close(pfd)
    try:
        uid = os.fstat(fd).st_uid
        if uid != os.geteuid():
            raise CaptureWriteError(f"{out}: owned by uid {uid}, not by us; refusing to write incidents into it")
    finally:
        os.close(fd)


def _tree_bytes(dir_fd: int) -> int:
    total = 0
    for entry in os.scandir(dir_fd):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                total += _tree_bytes(sub)
            finally:
                os.close(sub)
        else:
            total += st.st_blocks * 512
    return total


def incidents(out: str) -> list[tuple[str, int]]:
    """(name, bytes on disk) of the incidents in `out`, oldest first (their names sort by time)."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        found = []
        for name in sorted(os.listdir(fd)):
            if not INCIDENT_RE.fullmatch(name):
                continue
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:         # a link or a file of that name: not ours to count or remove
                continue
            try:
                found.append((name, _tree_bytes(sub)))
            finally:
                os.close(sub)
        return found
    finally:
        os.close(fd)


def prune(out: str, max_bytes: int, keep: str | None = None) -> list[str]:
    """Remove the oldest incidents while all of them take more than max_bytes; never `keep` (the
    one just written: the newest stays even alone over the cap). -> the names removed."""
    found = incidents(out)
    total = sum(size for _, size in found)
    removed = []
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name, size in found:
            if total <= max_bytes:
                break
            if name == keep:
                continue
            shutil.rmtree(name, dir_fd=fd)     # fd-based: no link inside is followed
            total -= size
            removed.append(name)
    finally:
        os.close(fd)
    return removed


class Incident:
    """One incident being written: rows go through a queue to a thread that writes them to its
    capture; finish() hands it the meta, then the thread closes the capture, runs the analysis
    and calls done(incident) (from that thread)."""

    def __init__(self, out: str, name: str, trigger: str, group_readable: bool, max_bytes: int,
                 analyze_args: list[str], done):
        self.name, self.trigger = name, trigger
        self.path = os.path.join(out, name)
        self.writer = CaptureWriter(self.path, group_readable=group_readable, max_bytes=max_bytes)
        self.analyze_args = analyze_args
        self.done = done
        self.failure: str | None = None
        self.analysis: str | None = None     # how the analysis ended
        self.also: set[str] = set()          # other triggers whose conditions held meanwhile
        self.started: float | None = None    # time.monotonic() of the oldest rows it holds
        self.fired: dict | None = None       # the clock pair when its trigger fired
        self.seen: dict | None = None        # what the trigger saw
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"incident {name}", daemon=True)
        self._thread.start()

    def add(self, name: str, rows) -> None:
        self._queue.put((name, rows))

    def finish(self, meta: dict) -> None:
        self._queue.put((None, meta))

    def _run(self) -> None:
        as_own()
        try:
            while True:
                name, item = self._queue.get()
                if name is None:
                    if not self.failure:
                        self.writer.write_meta(item)
                    break
                rows = None if self.failure else rows_of(item)    # made here, off the drain's thread
                if rows is not None:
                    self.writer.append(name, rows)
        except CaptureWriteError as exc:
            self.failure = str(exc)
            while self._queue.get()[0] is not None:    # let the rows go
                pass
        finally:
            self.writer.close()
        if self.failure is None:
            self.analysis = self._analyze()
        self.finished.set()
        self.done(self)

    def _analyze(self) -> str:
        cmd = [sys.executable, "-m", "slotscope.cli", "analyze", "--report", self.path, *self.analyze_args,
               self.path]
        try:
            res = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, timeout=ANALYSIS_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"the analysis took over {ANALYSIS_TIMEOUT:g} s and was stopped"
        if res.returncode:
            return f"the analysis failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}"
        return "analysed"

    def wait(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)

