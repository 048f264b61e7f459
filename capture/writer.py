"""Writing captures safely.

The agent runs as root, so every file it creates is created relative to a
directory file descriptor it opened itself, with O_NOFOLLOW|O_EXCL: a symlink
an ordinary user planted cannot redirect a write. Files are 0600 and
directories 0700 (0640/0750 with group_readable).

Segments: rows gather in memory and about a second after its first row, or once
it holds SEGMENT_BYTES, the segment is written to `.NNNNNN.arrow.partial`, fsynced
and renamed to `NNNNNN.arrow`, so a SIGKILL or a power loss costs at most that second.
The writing is done by a thread of the capture's own (Flusher), not by the caller: the
agent's drain hands a segment over and goes back to its rings.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import queue
import threading
import time
import zlib

import pyarrow as pa

from .format import CHECKSUMS, META_FILE, PARTIAL_RE, SEGMENT_RE, partial_name, schema_tag, segment_name
from .safepath import LinkFound, UnsafePath, open_parent, open_subdir
from .tables import newest

SEGMENT_SECONDS = 1.0
# A write storm's second of syscall rows is ~60 MiB serialised, and the segment's buffer
# grows by doubling: it held 128 MiB at the storm's peak. The rows of one drain, the most
# appended at once, are far less.
SEGMENT_BYTES = 8 << 20
# Finished segments waiting for the flusher before the drain waits too: the memory a slow
# disk can take (SEGMENT_BYTES each), against the ring it would otherwise overflow.
FLUSH_BACKLOG = 4
# Segments are LZ4-compressed (Arrow IPC buffer compression; every reader decompresses it):
# a write storm's syscall row took 150 bytes, 22 compressed (constant columns, repeated paths),
# and writing, fsyncing and checksumming those bytes was the largest part of the agent's CPU
# per row; compressing costs about what copying the larger buffers did. On the drain's own
# thread: pyarrow's pool would only move the same work to another core.
IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
# Still written past the size limit: small, and they say whose the rows are and what was lost.
ALWAYS_WRITTEN = ("procs", "loss", "agent")


class CaptureWriteError(Exception):
    """Writing the capture failed (disk full, permissions...); the message says what was kept."""


LOCK_FILE = ".lock"      # held (flock) by the agent writing the capture; holds its pid


def _refuse(path: str, why: str) -> CaptureWriteError:
    return CaptureWriteError(f"{path}: {why}")


class CaptureDir:
    """The capture's directory, opened safely (safepath) and locked for as long as it is written:
    a second agent is refused from the first instant, with the holder's pid."""

    def __init__(self, path: str, force: bool = False, group_readable: bool = False):
        self.path = path
        self.file_mode = 0o640 if group_readable else 0o600
        self.dir_mode = 0o750 if group_readable else 0o700
        try:
            self.fd = self._open(path)
        except UnsafePath as exc:
            raise CaptureWriteError(str(exc)) from None
        except OSError as exc:
            raise _refuse(path, f"cannot create the capture there: {exc.strerror}") from None
        self.lock_fd = None
        try:
            self._lock(create=False)      # a live agent's: named before anything else is said
            if not force and any(name != LOCK_FILE for name in os.listdir(self.fd)):
                raise _refuse(path, "exists and is not empty (use --force to write into it anyway)")
            self._lock(create=True)
            os.fchmod(self.fd, self.dir_mode)
        except (OSError, CaptureWriteError) as exc:
            for fd in (self.lock_fd, self.fd):
                if fd is not None:
                    os.close(fd)
            if isinstance(exc, CaptureWriteError):
                raise
            raise _refuse(path, f"cannot write the capture there: {exc.strerror}") from None

    def _open(self, path: str) -> int:
        pfd, base = open_parent(path)
        try:
            try:
                os.mkdir(base, self.dir_mode, dir_fd=pfd)
            except FileExistsError:
                pass
            try:
                fd = open_subdir(base, pfd)
            except LinkFound:
                raise _refuse(path, "is a symbolic link; refusing to write a capture through it") from None
            except NotADirectoryError:
                raise _refuse(path, "exists and is not a directory") from None
        finally:
            os.close(pfd)
        uid = os.fstat(fd).st_uid
        if uid != os.geteuid():
            os.close(fd)
            raise _refuse(path, f"owned by uid {uid}, not by us; refusing to write into it")
        return fd

    def _lock(self, create: bool) -> None:
        """Take the lock; without `create`, only if its file is there (a refused directory is
        left as it was). Two agents racing past the first call both reach the second: one wins."""
        if self.lock_fd is not None:
            return
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            self.lock_fd = fd = os.open(LOCK_FILE, flags, self.file_mode, dir_fd=self.fd)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise _refuse(self.path, f"another slotscope (pid {holder}) is recording into it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def subdir(self, name: str) -> int:
        try:
            os.mkdir(name, self.dir_mode, dir_fd=self.fd)
        except FileExistsError:
            pass
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
        os.fchmod(fd, self.dir_mode)   # the umask must not undo --group-readable
        return fd

    def create(self, name: str, dir_fd: int | None = None):
        """A new file, never an existing one or a link."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, self.file_mode, dir_fd=self.fd if dir_fd is None else dir_fd)
        os.fchmod(fd, self.file_mode)  # the umask must not undo --group-readable
        return os.fdopen(fd, "wb")

    def remove_earlier_capture(self) -> int:
        """--force over an earlier capture replaces it: its meta.json and the segments of every
        table folder go (tables of other versions too), so no row of it mixes into the new one.
        Only names of our own format are removed, and no link is followed."""
        removed = 0
        for entry in os.scandir(self.fd):
            if entry.name == META_FILE and entry.is_file(follow_symlinks=False):
                os.unlink(entry.name, dir_fd=self.fd)
                removed += 1
            elif not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
                try:
                    for seg in os.listdir(sub):
                        if SEGMENT_RE.match(seg) or PARTIAL_RE.match(seg) or seg == CHECKSUMS:
                            os.unlink(seg, dir_fd=sub)
                            removed += 1
                finally:
                    os.close(sub)
        return removed

    def replace_json(self, name: str, obj: dict) -> None:
        tmp = f".{name}.tmp"
        try:
            os.unlink(tmp, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        with self.create(tmp) as f:
            f.write(json.dumps(obj, indent=2, sort_keys=True, default=str).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def close(self) -> None:
        """Leftovers of a failed write go; the lock is released (its file stays: removing it
        would let two agents lock two different files)."""
        for name in os.listdir(self.fd):
            if name.startswith(".") and name.endswith(".tmp"):
                os.unlink(name, dir_fd=self.fd)
        os.close(self.lock_fd)
        os.close(self.fd)


class Flusher:
    """Writes finished segments on a thread, in the order they were handed over. Writing and
    fsyncing a storm's 8 MiB segment took the drain 50-360 ms here (seconds on a busy disk),
    while the syscall ring fills at a million events a second. The first failure stops the
    writing; the caller learns of it at its next call (failure)."""

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue(FLUSH_BACKLOG)
        self._thread: threading.Thread | None = None
        self.failure: tuple[str, OSError] | None = None    # (table, error) of the first failed write

    def put(self, table: str, job) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="segment-flusher", daemon=True)
            self._thread.start()
        self._jobs.put((table, job))

    def _run(self) -> None:
        while True:
            table, job = self._jobs.get()
            try:
                if job is None:
                    return
                if self.failure is None:
                    job()
            except OSError as exc:
                self.failure = (table, exc)
            finally:
                self._jobs.task_done()

    def wait(self) -> None:
        """Until every segment handed over is written (or failed)."""
        if self._thread is not None:
            self._jobs.join()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(("", None))
            self._thread.join()
            self._thread = None


class TableWriter:
    """One table's segments. A segment is serialised in memory and written whole when it
    closes (to its dotfile, fsynced, renamed, by the flusher's thread): a reader skips an
    open segment either way, and written through a Python file object the IPC writer made a
    Python call per column buffer, the largest single cost of the agent under emulation."""

    def __init__(self, capture: CaptureDir, name: str, flusher: Flusher):
        major, schema = newest(name)
        self.capture = capture
        self.flusher = flusher
        self.name = name
        self.schema = schema.with_metadata({**(schema.metadata or {}), **schema_tag(name, major)})
        self.dir_fd = capture.subdir(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        self.sums_fd = os.open(CHECKSUMS, flags, capture.file_mode, dir_fd=self.dir_fd)
        self.seq = 0
        self.rows = 0
        self.segments = 0
        self.closed_bytes = 0
        self._sink = self._writer = None
        self._opened_at = 0.0
        self._segment_rows = 0

    def append(self, table: pa.Table | pa.RecordBatch) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self.seq += 1
            self._sink = pa.BufferOutputStream()
            self._writer = pa.ipc.new_file(self._sink, self.schema, options=IPC_OPTIONS)
            self._opened_at = time.monotonic()
            self._segment_rows = 0
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not table.schema.equals(self.schema):    # a cast per column costs even when types match
            table = table.cast(self.schema)
        try:
            self._writer.write_table(table)
        except pa.ArrowInvalid:
            if not self._segment_rows:
                raise
            # An IPC file holds one dictionary per field: other dictionaries start a new segment.
            self.close_segment()
            self.append(table)
            return
        self._segment_rows += table.num_rows
        self.rows += table.num_rows
        if self._sink.tell() >= SEGMENT_BYTES:
            self.close_segment(wait=False)

    def tick(self, now: float | None = None) -> None:
        if self._writer is not None and (now or time.monotonic()) - self._opened_at >= SEGMENT_SECONDS:
            self.close_segment(wait=False)

    def close_segment(self, wait: bool = True) -> None:
        """End the open segment and hand it to the flusher; `wait`: until it is on disk."""
        if self._writer is not None:
            self._writer.close()
            data = self._sink.getvalue()
            self._writer = self._sink = None
            self.closed_bytes += data.size
            seq = self.seq
            self.flusher.put(self.name, lambda: self._write_segment(seq, data))
        if wait:
            self.flusher.wait()

    def _write_segment(self, seq: int, data: pa.Buffer) -> None:
        """On the flusher's thread."""
        with self.capture.create(partial_name(seq), self.dir_fd) as f:
            try:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            except OSError:     # a segment that could not be written whole (disk full) is not left behind
                os.unlink(partial_name(seq), dir_fd=self.dir_fd)
                raise
        os.rename(partial_name(seq), segment_name(seq), src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        # Not fsynced: a line lost in a crash leaves its segment unverified, not damaged.
        os.write(self.sums_fd, f"{segment_name(seq)} {data.size} {zlib.crc32(data):08x}\n".encode())
        self.segments += 1

    def size(self) -> int:
        return self.closed_bytes + (self._sink.tell() if self._sink else 0)

    def close(self) -> None:
        try:
            self.close_segment()
        finally:
            os.close(self.sums_fd)
            os.close(self.dir_fd)


class CaptureWriter:
    """The capture as the agent sees it: the registry's tables (tables.TABLES) and meta.json."""

    def __init__(self, path: str, force: bool = False, group_readable: bool = False,
                 max_bytes: int | None = None):
        self.dir = CaptureDir(path, force, group_readable)
        self.path = path
        self.max_bytes = max_bytes
        self.replaced = self.dir.remove_earlier_capture() if force else 0
        self.tables: dict[str, TableWriter] = {}
        self.dropped: dict[str, int] = {}      # rows not written, per table: the size limit was reached
        self.failed: str | None = None
        self.flusher = Flusher()

    def _table(self, name: str) -> TableWriter:
        if name not in self.tables:
            self.tables[name] = TableWriter(self.dir, name, self.flusher)
        return self.tables[name]

    def _guard(self, what: str, fn, *args):
        try:
            result = fn(*args)
            if self.flusher.failure:        # a segment the flusher could not write
                what, exc = self.flusher.failure
                raise exc
            return result
        except OSError as exc:
            self.flusher.wait()             # the segments before the failed one are kept
            kept = sum(t.segments for t in self.tables.values())
            why = "disk full" if exc.errno == errno.ENOSPC else exc.strerror
            self.failed = f"writing {what} to {self.path} failed: {why}; {kept} finished segments kept"
            raise CaptureWriteError(self.failed) from None

    def append(self, name: str, table: pa.Table | pa.RecordBatch) -> None:
        """Write rows; from the first rows that would take the capture past max_bytes on, count
        them in `dropped` instead (the rows of that batch that fit are written)."""
        if self.max_bytes is not None and name not in ALWAYS_WRITTEN and (
                self.dropped or self.size_bytes() + table.nbytes > self.max_bytes):
            room = max(0, self.max_bytes - self.size_bytes()) if not self.dropped else 0
            keep = min(table.num_rows, table.num_rows * room // max(1, table.nbytes))   # the rows that fit
            self.dropped[name] = self.dropped.get(name, 0) + table.num_rows - keep
            if not keep:
                return
            table = table.slice(0, keep)
        self._guard(name, lambda: self._table(name).append(table))

    def tick(self) -> None:
        now = time.monotonic()
        for t in self.tables.values():
            self._guard(t.name, t.tick, now)

    def flush(self) -> None:
        """Until every finished segment is on disk; a failure to write one is raised here."""
        self._guard("segments", self.flusher.wait)

    def write_meta(self, meta: dict) -> None:
        self._guard(META_FILE, self.dir.replace_json, META_FILE, meta)

    def size_bytes(self) -> int:
        return sum(t.size() for t in self.tables.values())

    def close(self) -> None:
        for t in self.tables.values():
            try:
                t.close()
            except OSError:
                pass  # the rows of its open segment are lost; the finished ones stay
        self.flusher.close()
        self.dir.close()
