"""Reading captures, finished or still being written (DESIGN.md, capture format).

The reader unifies schemas across segments (older segments get nulls for newer
columns) and refuses a capture or table from a future major version. A capture
that grows is re-read by reading only its new segments (SegmentCache): the TUI
follows a recording that way, through the same reading as everything else.

Every problem is a CaptureError with a message meant for the user, or, for
damage that still leaves data readable, a line in Capture.problems.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import pyarrow as pa

from .files import why
from .format import ARROW_MAGIC, PARTIAL_RE, SCHEMA_KEY, SEGMENT_RE
from .meta import CaptureError, read_meta
from .tables import TABLES

CHUNKS_BEFORE_COMBINE = 32         # a growing table's segments are merged into one chunk past this


@dataclass
class Capture:
    path: str
    meta: dict
    problems: list[str] = field(default_factory=list)

    whole = True        # the whole capture (views of a part of it say False)

    @classmethod
    def open(cls, path: str) -> "Capture":
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise CaptureError(f"{path}: no such capture directory") from None
        except OSError as exc:
            raise CaptureError(f"{path}: {why(exc)}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise CaptureError(f"{path}: not a capture directory (a capture is a directory with meta.json)")
        meta, problems = read_meta(path)
        return cls(path=path, meta=meta, problems=problems)

    def tables(self) -> list[str]:
        return sorted(name for name in os.listdir(self.path)
                      if os.path.isdir(os.path.join(self.path, name)) and not name.startswith("."))

    def segments(self, table: str, include_partial: bool = False) -> list[str]:
        folder = os.path.join(self.path, table)
        if not os.path.isdir(folder):
            return []
        found = []
        for name in os.listdir(folder):
            m = SEGMENT_RE.match(name) or (include_partial and PARTIAL_RE.match(name))
            if m:
                found.append((m.group(1), name))
        return [os.path.join(folder, name) for _, name in sorted(found)]

    @property
    def live(self) -> bool:
        """Still being recorded: meta.json has no stop record yet."""
        return "stop" not in self.meta

    def read(self, table: str, include_partial: bool = False) -> pa.Table | None:
        """All whole record batches of a table, schemas unified; None if the table has no rows."""
        return self.concat(table, [self.read_segment(table, seg) for seg in self.segments(table, include_partial)])

    def concat(self, table: str, parts: list[pa.Table | None]) -> pa.Table | None:
        """One table of the segments read (None where a segment had no rows), schemas unified."""
        parts = [t for t in parts if t is not None and t.num_rows]
        if len(parts) <= 1:
            return parts[0] if parts else None
        try:
            return pa.concat_tables(parts, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise CaptureError(f"{self.path}/{table}: segments with incompatible schemas ({exc})") from None

    def read_segment(self, table: str, seg: str) -> pa.Table | None:
        """One finished segment (a path from segments()); None when it is damaged beyond reading."""
        rel = os.path.relpath(seg, self.path)
        try:
            # Memory-mapped: the columns are the page cache's pages, not copies.
            data = pa.memory_map(seg) if os.path.getsize(seg) else pa.py_buffer(b"")
            head = data.read(len(ARROW_MAGIC)) if isinstance(data, pa.MemoryMappedFile) else b""
        except OSError as exc:
            self._problem(f"{rel}: unreadable ({exc.strerror})")
            return None
        if head != ARROW_MAGIC:
            self._problem(f"{rel}: not an Arrow file, skipped")
            return None
        try:
            t = pa.ipc.open_file(data).read_all()
        except (pa.ArrowInvalid, OSError):
            data.seek(0)
            t = self._salvage(rel, data.read())
            if t is None:
                return None
        finally:
            data.close()     # the mapping lives on with the table; the fd need not (long captures)
        self._check_version(table, rel, t.schema)
        return t

    def _salvage(self, rel: str, data: bytes) -> pa.Table | None:
        """A segment cut short (copied while written, a crash): read its whole batches."""
        batches, schema = [], None
        try:
            # The file format is the magic (padded to 8 bytes), then a stream, then a footer.
            reader = pa.ipc.open_stream(pa.py_buffer(data)[8:])
            schema = reader.schema
            for batch in reader:
                batches.append(batch)
        except (pa.ArrowInvalid, OSError, StopIteration):
            pass
        if schema is None:
            self._problem(f"{rel}: truncated before its schema, skipped")
            return None
        rows = sum(b.num_rows for b in batches)
        self._problem(f"{rel}: truncated; read its {len(batches)} whole batches ({rows} rows), "
                      f"the rest is lost")
        return pa.Table.from_batches(batches, schema)

    def _problem(self, text: str) -> None:
        """Each problem once, however often its table is read (the TUI re-reads every refresh)."""
        if text not in self.problems:
            self.problems.append(text)

    def _check_version(self, table: str, rel: str, schema: pa.Schema) -> None:
        tag = (schema.metadata or {}).get(SCHEMA_KEY, b"").decode()
        name, _, major = tag.partition("/")
        if name != table or not major.isdigit():
            raise CaptureError(f"{rel}: not a slotscope '{table}' segment (schema tag {tag!r})")
        if table in TABLES and int(major) > max(TABLES[table]):
            raise CaptureError(f"{rel}: table '{table}' version {major} is newer than this slotscope "
                               f"reads ({max(TABLES[table])}): upgrade slotscope")


def open_captures(paths: list[str]) -> list[Capture]:
    return [Capture.open(p) for p in paths]


class SegmentCache:
    """The finished segments of one capture already read, per table: a capture that grows is
    re-read by reading only its new segments (a recording closes one about every second)."""

    def __init__(self):
        self.tables: dict[str, tuple[frozenset, pa.Table | None]] = {}
        self.newest_mtime = 0.0

    def seen(self, table: str) -> frozenset:
        """The segments of `table` read so far."""
        return self.tables.get(table, (frozenset(), None))[0]

    def read(self, capture: Capture, table: str) -> pa.Table | None:
        segs = capture.segments(table)
        seen, have = self.tables.get(table, (frozenset(), None))
        new = [s for s in segs if s not in seen]
        if not new and table in self.tables:
            return have
        parts = [have]
        for seg in new:
            try:
                self.newest_mtime = max(self.newest_mtime, os.stat(seg).st_mtime)
            except OSError:
                pass
            parts.append(capture.read_segment(table, seg))
        full = capture.concat(table, parts)
        if full is not None and full.column(0).num_chunks > CHUNKS_BEFORE_COMBINE:
            full = full.combine_chunks()
        self.tables[table] = (seen | frozenset(new), full)
        return full
