"""`slotscope watch`'s flight recorder: the rows `record` would have written in the last
--keep seconds, held in memory, bounded by bytes too, ready to become an incident's capture.

It keeps decoded rows (the Arrow tables each drain makes), not raw ring records: decoding
runs on every drain anyway (it is what tells a traced file's write from the rest, and most
raw records are not), each row already names its file (the fd-to-file history then lasts as
long as the rows), and an incident is written without decoding again. It stands in for the
CaptureWriter of `record` (append, tick, write_meta, size_bytes, dropped, close).

Each drain's rows of a table are one chunk, stamped with the time it was appended; chunks
older than keep_s go, and then the oldest while the total exceeds max_bytes. The `procs`
rows (one per process, written once when it is first seen) are kept apart, by bytes only:
an incident must say whose rows they are, however long ago the process started.
"""
from __future__ import annotations

import time
from collections import deque

import pyarrow as pa

STICKY = ("procs",)
STICKY_SHARE = 8     # the sticky tables may hold up to 1/STICKY_SHARE of max_bytes


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

    def contents(self) -> list[tuple[str, pa.Table]]:
        """Every chunk held, sticky ones first, each in the order appended (the tables are
        immutable: this costs no copy)."""
        return [(name, rows) for _, name, rows in (*self._sticky, *self._chunks)]

    def write_meta(self, meta: dict) -> None:
        self.meta = meta

    def size_bytes(self) -> int:
        return self._bytes + self._sticky_bytes

    def close(self) -> None:
        self._chunks.clear()
        self._sticky.clear()
        self._bytes = self._sticky_bytes = 0
