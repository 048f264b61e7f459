"""`slotscope watch`'s flight recorder: the rows `record` would have written in the last
--keep seconds, held in memory, bounded by bytes too, ready to become an incident's capture.

The syscall rows are decoded every drain (decoding them needs the state of the moment: which
file each fd names, read from /proc while the process lives; and it is what tells a traced
file's call from the rest, which most records are not) and kept as the capture keeps them:
Arrow IPC, LZ4-compressed (a storm's row 22 bytes instead of ~140). The records of the
stateless streams (RPCs, slots, transports, NFS I/O, owners: probes.Stream.stateless) are kept
as read from the rings, their rows built only if an incident takes them: no decoding per drain
of what nothing reads until a trigger fires. An incident's thread makes the rows of what it
takes (rows_of). It stands in for the CaptureWriter of `record` (append, tick, write_meta,
size_bytes, dropped, close).

Each drain's rows (or records) of a table are one chunk, stamped with the time it was
appended; chunks older than keep_s go, and then the oldest while the total exceeds max_bytes.
The `procs` rows (one per process, written once when it is first seen) are kept apart, by
bytes only: an incident must say whose rows they are, however long ago the process started.
"""
from __future__ import annotations

import functools
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from slotscope.capture.writer import IPC_OPTIONS

STICKY = ("procs",)
STICKY_SHARE = 8     # the sticky tables may hold up to 1/STICKY_SHARE of max_bytes


@dataclass(frozen=True)
class Held:
    """A chunk kept compressed (a drain's rows, or a stateless stream's records), and how to
    make its rows again."""
    build: Callable[[], pa.Table | None]
    nbytes: int


def packed(rows: pa.Table) -> Held:
    """Rows as an LZ4-compressed IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema, options=IPC_OPTIONS) as writer:
        writer.write_table(rows)
    data = sink.getvalue()
    return Held(functools.partial(_unpacked, data), data.size)


def _unpacked(data: pa.Buffer) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def packed_records(build: Callable, records: list[np.ndarray]) -> Held:
    """A drain's records of a stateless stream, LZ4-compressed; build(*records) makes its rows."""
    data = [(pa.compress(r, codec="lz4", asbytes=False), r.nbytes, r.dtype) for r in records]
    return Held(functools.partial(_built, build, data), sum(d.size for d, _, _ in data))


def _built(build: Callable, data: list) -> pa.Table | None:
    return build(*(np.frombuffer(pa.decompress(d, size, codec="lz4"), dtype) for d, size, dtype in data))


def rows_of(item: pa.Table | Held) -> pa.Table | None:
    """The rows of an item of contents()."""
    return item.build() if isinstance(item, Held) else item


class FlightRecorder:
    def __init__(self, path: str, keep_s: float, max_bytes: int):
        self.path = path
        self.keep_s = keep_s
        self.max_bytes = max_bytes
        self.replaced = 0
        self.dropped: dict[str, int] = {}       # nothing is refused: old rows are evicted instead
        self.evicted_bytes = 0                  # by the byte bound, before their time was up
        self.meta: dict | None = None
        self._chunks: deque[tuple[float, str, pa.Table]] = deque()
        self._sticky: deque[tuple[float, str, pa.Table]] = deque()
        self._bytes = self._sticky_bytes = 0
        self.listeners: list = []               # fn(name, rows), called with every append

    def append(self, name: str, rows: pa.Table | pa.RecordBatch, now: float | None = None) -> None:
        if rows.num_rows == 0:
            return
        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        for listen in self.listeners:
            listen(name, rows)
        self._keep(name, rows if name in STICKY else packed(rows), now)

    def hold(self, name: str, held: Held, now: float | None = None) -> None:
        """Records whose rows are built only if an incident takes them (listeners see nothing)."""
        if held.nbytes:
            self._keep(name, held, now)

    def _keep(self, name: str, rows: pa.Table | Held, now: float | None) -> None:
        chunk = (now if now is not None else time.monotonic(), name, rows)
        if name in STICKY:
            self._sticky.append(chunk)
            self._sticky_bytes += rows.nbytes
            while self._sticky_bytes > self.max_bytes // STICKY_SHARE and len(self._sticky) > 1:
                self._sticky_bytes -= self._sticky.popleft()[2].nbytes
        else:
            self._chunks.append(chunk)
            self._bytes += rows.nbytes
            self._evict(chunk[0])

    def _evict(self, now: float) -> None:
        chunks = self._chunks
        while chunks:
            appended, _, rows = chunks[0]
            young = now - appended <= self.keep_s
            if young and self._bytes <= self.max_bytes:
                return
            chunks.popleft()
            self._bytes -= rows.nbytes
            if young:
                self.evicted_bytes += rows.nbytes

    def tick(self, now: float | None = None) -> None:
        self._evict(now if now is not None else time.monotonic())

    def oldest(self) -> float | None:
        """When the oldest chunk held was appended (time.monotonic), None when empty. (Also read
        by the metrics' thread while the drain evicts: no test-then-read.)"""
        try:
            return self._chunks[0][0]
        except IndexError:
            return None

    def contents(self) -> list[tuple[str, pa.Table | Held]]:
        """Every chunk held, sticky ones first, each in the order appended: rows, or what makes
        them (rows_of)."""
        return [(name, item) for _, name, item in (*self._sticky, *self._chunks)]

    def write_meta(self, meta: dict) -> None:
        self.meta = meta

    def size_bytes(self) -> int:
        return self._bytes + self._sticky_bytes

    def close(self) -> None:
        self._chunks.clear()
        self._sticky.clear()
        self._bytes = self._sticky_bytes = 0
