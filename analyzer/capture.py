"""Reading captures: the capture directory format, as DESIGN.md defines it.

A capture is a directory with meta.json and one folder per table holding
finished Arrow IPC segments (000001.arrow, ...). The segment being written is a
dotfile, .NNNNNN.arrow.partial, renamed when closed. Each table's schema
carries `slotscope.schema = "<table>/<major>"`; this reader unifies schemas
across segments (older segments get nulls for newer columns) and refuses a
capture or table from a future major version.

Every problem is a CaptureError with a message meant for the user, or, for
damage that still leaves data readable, a line in Capture.problems.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

import pyarrow as pa

FORMAT_MAJOR = 1                       # meta.json "schema_version" this code reads
SCHEMA_KEY = b"slotscope.schema"
SEGMENT_RE = re.compile(r"^(\d{6})\.arrow$")
PARTIAL_RE = re.compile(r"^\.(\d{6})\.arrow\.partial$")
ARROW_MAGIC = b"ARROW1"

# The major version of each table this reader understands.
TABLE_MAJOR = {
    "syscall": 1, "procs": 1, "files": 1, "loss": 1, "agent": 1,
    "rpc": 1, "nfs_io": 1, "slots": 1, "netdev": 1, "kmsg": 1,
}


class CaptureError(Exception):
    """A capture that cannot be read at all; the message says why."""


def schema_tag(table: str, major: int) -> dict[bytes, bytes]:
    return {SCHEMA_KEY: f"{table}/{major}".encode()}


@dataclass
class Capture:
    path: str
    meta: dict
    problems: list[str] = field(default_factory=list)

    whole = True        # the whole capture (views of a part of it say False)

    @classmethod
    def open(cls, path: str) -> "Capture":
        if not os.path.exists(path):
            raise CaptureError(f"{path}: no such capture directory")
        if not os.path.isdir(path):
            raise CaptureError(f"{path}: not a capture directory (a capture is a directory with meta.json)")
        meta_path = os.path.join(path, "meta.json")
        if not os.path.exists(meta_path):
            if not os.listdir(path):
                raise CaptureError(f"{path}: empty directory, not a capture")
            raise CaptureError(f"{path}: no meta.json, not a slotscope capture")
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except PermissionError:
            raise CaptureError(f"{meta_path}: permission denied (captures are root-only by default; "
                               f"use sudo, or record with --group-readable)") from None
        except (OSError, ValueError) as exc:
            raise CaptureError(f"{meta_path}: unreadable ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != "slotscope-capture":
            raise CaptureError(f"{meta_path}: not a slotscope capture's meta.json")
        major = meta.get("schema_version", 0)
        if not isinstance(major, int) or major > FORMAT_MAJOR:
            raise CaptureError(f"{path}: capture format version {major} is newer than this slotscope "
                               f"reads ({FORMAT_MAJOR}): upgrade slotscope")
        return cls(path=path, meta=meta)

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
        parts = []
        for seg in self.segments(table, include_partial):
            t = self._read_segment(table, seg)
            if t is not None and t.num_rows:
                parts.append(t)
        if not parts:
            return None
        try:
            return pa.concat_tables(parts, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise CaptureError(f"{self.path}/{table}: segments with incompatible schemas ({exc})") from None

    def _read_segment(self, table: str, seg: str) -> pa.Table | None:
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
        if table in TABLE_MAJOR and int(major) > TABLE_MAJOR[table]:
            raise CaptureError(f"{rel}: table '{table}' version {major} is newer than this slotscope "
                               f"reads ({TABLE_MAJOR.get(table)}): upgrade slotscope")


def open_captures(paths: list[str]) -> list[Capture]:
    return [Capture.open(p) for p in paths]
