"""Reading captures, finished or still being written (DESIGN.md, capture format).

The reader unifies schemas across segments (older segments get nulls for newer
columns) and refuses a capture or table from a future major version. A capture
that grows is re-read by reading only its new segments (SegmentCache): the TUI
follows a recording that way, through the same reading as everything else.

Every problem is a CaptureError with a message meant for the user, or, for
damage that still leaves data readable, a line in Capture.problems: a damaged
segment gives its whole batches before the damage, or is skipped.
"""
from __future__ import annotations

import mmap
import os
import stat
import zlib
from dataclasses import dataclass, field

import pyarrow as pa

from .files import NotAFile, open_regular, why
from .format import ARROW_MAGIC, CHECKSUMS, FORMAT_MINOR, PARTIAL_RE, SCHEMA_KEY, SEGMENT_RE
from .ipc import batch_claim
from .meta import CaptureError, read_meta
from .tables import ESSENTIAL, TABLES

CHUNKS_BEFORE_COMBINE = 32         # a growing table's segments are merged into one chunk past this
# What a segment may decode to: this many times its size (compressed buffers), or at least the
# floor; a segment whose batches claim more is read up to them (a few bytes can claim terabytes).
DECODE_RATIO = 64
DECODE_FLOOR = 64 << 20
# Segments this large or larger are memory-mapped (their columns are the page cache's pages);
# smaller ones are read: a mapping keeps a file descriptor open for as long as its table lives,
# and a job of 1,000 nodes holds some 150,000 one-second segments of a few KiB each (past the
# process's 20,000 descriptors, every further segment was skipped as unreadable).
MAP_FROM_BYTES = 1 << 20


@dataclass
class Capture:
    path: str
    meta: dict
    problems: list[str] = field(default_factory=list)
    _sums: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict, repr=False)

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

    def _listdir(self, folder: str) -> list[str]:
        try:
            return os.listdir(folder)
        except OSError as exc:
            raise CaptureError(f"{folder}: {why(exc)}") from None

    def tables(self) -> list[str]:
        """The table folders. The agent writes no symlinks: one in a capture is not followed."""
        found = []
        for name in sorted(self._listdir(self.path)):
            folder = os.path.join(self.path, name)
            if name.startswith("."):
                continue
            if os.path.islink(folder):
                self._problem(f"{name}: a symlink, not followed")
            elif os.path.isdir(folder):
                found.append(name)
        return found

    def segments(self, table: str, include_partial: bool = False) -> list[str]:
        folder = os.path.join(self.path, table)
        if os.path.islink(folder) or not os.path.isdir(folder):
            return []
        found = []
        for name in self._listdir(folder):
            m = SEGMENT_RE.match(name) or (include_partial and PARTIAL_RE.match(name))
            if m:
                found.append((m.group(1), name))
        return [os.path.join(folder, name) for _, name in sorted(found)]

    def check(self) -> None:
        """Read every segment's schema now: what refuses a capture (a table from a newer
        slotscope, a file or folder this user may not read) refuses it when it is opened, the
        same for every command, and not halfway through an export or in the TUI."""
        for table in self.tables():
            for seg in self.segments(table):
                self._open_segment(table, seg)

    @property
    def live(self) -> bool:
        """Still being recorded: meta.json has no stop record yet."""
        return "stop" not in self.meta

    def read(self, table: str, include_partial: bool = False) -> pa.Table | None:
        """All whole record batches of a table, schemas unified; None if the table has no rows."""
        return self.concat(table, [self.read_segment(table, seg) for seg in self.segments(table, include_partial)])

    def concat(self, table: str, parts: list[pa.Table | None]) -> pa.Table | None:
        """One table of the segments read (None where a segment had no rows), schemas unified.
        Columns this slotscope does not declare are kept, unless segments disagree on their type."""
        parts = [t for t in parts if t is not None and t.num_rows]
        if len(parts) <= 1:
            return parts[0] if parts else None
        try:
            # one dictionary per column: a segment cast to its dictionary type has its own
            return pa.concat_tables(parts, promote_options="permissive").unify_dictionaries()
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            types: dict[str, set] = {}
            for t in parts:
                for f in t.schema:
                    types.setdefault(f.name, set()).add(f.type)
            clash = sorted(name for name, seen in types.items() if len(seen) > 1)
            self._problem(f"{table}: column(s) {', '.join(clash)} of different types in different segments, "
                          f"left out")
            return pa.concat_tables([t.drop_columns([c for c in clash if c in t.column_names]) for t in parts],
                                    promote_options="permissive").unify_dictionaries()

    def read_segment(self, table: str, seg: str) -> pa.Table | None:
        """One finished segment (a path from segments()): its whole batches, unified with the
        table's declared schema; None when nothing of it can be read."""
        opened = self._open_segment(table, seg)
        if opened is None:
            return None
        rel, buf, reader = opened
        # A segment of its recorded size whose bytes differ holds a wrong value somewhere: no batch
        # of it can be trusted. One cut short or grown is left to the salvage below, which says so.
        expected = self._checksum(table, os.path.basename(seg))
        if expected is not None and expected[0] == buf.size and zlib.crc32(memoryview(buf)) != expected[1]:
            self._problem(f"{rel}: checksum mismatch (damaged on disk), skipped")
            return None
        budget = max(DECODE_FLOOR, DECODE_RATIO * buf.size)
        batches, refused, damage = _whole_batches(buf, reader, budget)
        rows = sum(b.num_rows for b in batches)
        if refused:
            self._problem(f"{rel}: {refused}, not read; read the {len(batches)} whole batches before them "
                          f"({rows} rows)")
        elif buf[-len(ARROW_MAGIC):].to_pybytes() != ARROW_MAGIC:
            self._problem(f"{rel}: truncated; read its {len(batches)} whole batches ({rows} rows), "
                          f"the rest is lost")
        elif damage:
            self._problem(f"{rel}: damaged ({damage}); read the {len(batches)} whole batches before it "
                          f"({rows} rows), the rest is lost")
        else:
            footer = _footer_trouble(buf, len(batches))
            if footer:
                self._problem(f"{rel}: footer damaged ({footer}); read its {len(batches)} batches ({rows} rows) "
                              f"without it")
        if not rows:
            return None
        t = pa.Table.from_batches(batches, reader.schema)
        return self._unify(table, rel, t, budget) if table in TABLES else t

    def _open_segment(self, table: str, seg: str):
        """(rel, its bytes, a stream reader past its schema), the version checked; None (and a
        problem) when it is not a segment that can be read."""
        rel = os.path.relpath(seg, self.path)
        try:
            fd, size = open_regular(seg, follow=False)
        except PermissionError as exc:
            raise CaptureError(f"{seg}: {why(exc)}") from None
        except (OSError, NotAFile) as exc:
            self._problem(f"{rel}: {why(exc)}, skipped")
            return None
        try:
            if size >= MAP_FROM_BYTES:
                buf = pa.py_buffer(mmap.mmap(fd, size, access=mmap.ACCESS_READ))
            else:
                buf = pa.py_buffer(_read_all(fd, size))
        except OSError as exc:
            self._problem(f"{rel}: unreadable ({exc.strerror}), skipped")
            return None
        finally:
            os.close(fd)     # the mapping lives on with the table; the fd need not (long captures)
        if buf[:len(ARROW_MAGIC)].to_pybytes() != ARROW_MAGIC:
            self._problem(f"{rel}: not an Arrow file, skipped")
            return None
        try:
            # The file format is the magic (padded to 8 bytes), then a stream, then a footer.
            reader = pa.ipc.open_stream(buf[8:])
        except (pa.ArrowException, OSError) as exc:
            cut = buf[-len(ARROW_MAGIC):].to_pybytes() != ARROW_MAGIC
            self._problem(f"{rel}: truncated before its schema, skipped" if cut
                          else f"{rel}: schema damaged ({_short(exc)}), skipped")
            return None
        tag = (reader.schema.metadata or {}).get(SCHEMA_KEY, b"").decode("utf-8", "replace")
        name, _, major = tag.partition("/")
        if name != table or not major.isascii() or not major.isdigit():
            self._problem(f"{rel}: not a slotscope '{table}' segment (schema tag {tag[:40]!r}), skipped")
            return None
        if table in TABLES and int(major) not in TABLES[table]:
            if int(major) > max(TABLES[table]):
                raise CaptureError(f"{seg}: table '{table}' version {major} is newer than this slotscope "
                                   f"reads ({max(TABLES[table])}): upgrade slotscope")
            self._problem(f"{rel}: table '{table}' version {major} is not one this slotscope reads, skipped")
            return None
        return rel, buf, reader

    def _unify(self, table: str, rel: str, t: pa.Table, budget: int) -> pa.Table | None:
        """The segment with the declared schema of its table's version: a column it lacks is null,
        one of another but compatible type is cast (exactly, or the segment is skipped); columns
        not declared follow (a newer slotscope's)."""
        major = int(t.schema.metadata[SCHEMA_KEY].decode().partition("/")[2])
        declared = TABLES[table][major]
        names = set(t.column_names)
        if len(names) < t.num_columns:
            twice = next(n for n in names if t.column_names.count(n) > 1)
            self._problem(f"{rel}: column '{twice}' appears twice, skipped")
            return None
        for name in ESSENTIAL[table]:
            if name not in names or t.column(name).null_count:
                self._problem(f"{rel}: {'no' if name not in names else 'nulls in'} column '{name}', which every "
                              f"row needs, skipped")
                return None
        if t.schema.remove_metadata().equals(declared):       # as the agent writes it
            return t
        missing = [f for f in declared if f.name not in names]
        if t.num_rows * sum(_row_bytes(f.type) for f in missing) > budget:
            self._problem(f"{rel}: {t.num_rows} rows without columns {', '.join(f.name for f in missing)}, "
                          f"more than a segment of its size holds, skipped")
            return None
        cols = []
        for f in declared:
            if f.name not in names:
                cols.append(pa.nulls(t.num_rows, f.type))
                continue
            col = t.column(f.name)
            if col.type != f.type:
                if _kind(col.type) != _kind(f.type):
                    self._problem(f"{rel}: column '{f.name}' is {col.type}, not {f.type}, skipped")
                    return None
                try:
                    col = col.cast(f.type, safe=True)
                except pa.ArrowException:
                    self._problem(f"{rel}: column '{f.name}' has values that do not fit {f.type}, skipped")
                    return None
            cols.append(col)
        known = set(declared.names)
        extra = [f for f in t.schema if f.name not in known]
        schema = pa.schema(list(declared) + extra, metadata=t.schema.metadata)
        return pa.Table.from_arrays(cols + [t.column(f.name) for f in extra], schema=schema)

    @property
    def verified(self) -> bool:
        return verified(self.meta)

    def _checksum(self, table: str, name: str) -> tuple[int, int] | None:
        """(size, CRC-32) the writer recorded for a segment; None for a segment it has not (a
        capture before checksums, or a crash before the line): read unverified."""
        sums = self._sums.get(table)
        if sums is None or name not in sums:   # a capture being written adds lines
            sums = self._sums[table] = _read_checksums(os.path.join(self.path, table, CHECKSUMS))
        return sums.get(name)

    def _problem(self, text: str) -> None:
        """Each problem once, however often its table is read (the TUI re-reads every refresh)."""
        if text not in self.problems:
            self.problems.append(text)


def verified(meta: dict) -> bool:
    """The capture's segments carry checksums (format 1.1): a flipped byte is found, not read
    as data."""
    minor = meta.get("format_minor", 0)
    return isinstance(minor, int) and minor >= FORMAT_MINOR


CHECKSUMS_MAX = 16 << 20      # a line per segment: years of segments


def _read_checksums(path: str) -> dict[str, tuple[int, int]]:
    """The lines of a table's checksums file; lines that are not one are ignored (the segments
    they would name read unverified)."""
    try:
        fd, size = open_regular(path, follow=False)
    except (OSError, NotAFile):
        return {}
    try:
        text = os.read(fd, min(size, CHECKSUMS_MAX)).decode("ascii", "replace")
    finally:
        os.close(fd)
    sums = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and SEGMENT_RE.match(parts[0]) and parts[1].isdigit():
            try:
                sums[parts[0]] = (int(parts[1]), int(parts[2], 16))
            except ValueError:
                continue
    return sums


def _short(exc: BaseException) -> str:
    """An exception's first line, shortened: a problem is one line."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= 100 else text[:97] + "..."


def _whole_batches(buf: pa.Buffer, reader, budget: int) -> tuple[list[pa.RecordBatch], str | None, str | None]:
    """(the segment's batches up to the first one refused or damaged, what refused it, what
    damage stopped the reading). What each batch claims is checked before any is decoded: a
    batch that would take the segment's decoded size past `budget` is refused. Each decoded
    one is validated in full (offsets, dictionary indices, UTF-8): no bad one reaches the analysis."""
    sane, total, refused, damage = 0, 0, None, None
    try:
        for message in pa.ipc.MessageReader.open_stream(buf[8:]):
            claim = batch_claim(message)
            if claim is None:
                continue
            rows, size = claim
            total += size
            if total > budget:
                refused = f"batches that would decode to more than {budget >> 20} MiB"
                break
            if rows > 8 * size:       # a row takes at least one bit
                refused = f"a batch of {rows} rows in {size} bytes"
                break
            sane += message.type == "record batch"
    except (pa.ArrowException, OSError, ValueError) as exc:
        damage = _short(exc)
    batches = []
    try:
        for _ in range(sane):
            batch = reader.read_next_batch()
            batch.validate(full=True)
            batches.append(batch)
    except (pa.ArrowException, OSError, StopIteration) as exc:
        damage = _short(exc)
    return batches, refused, damage


def _footer_trouble(buf: pa.Buffer, batches: int) -> str | None:
    """What is wrong with the footer of a segment whose stream read whole (None: nothing)."""
    try:
        listed = pa.ipc.open_file(buf).num_record_batches
    except (pa.ArrowException, OSError) as exc:
        return _short(exc)
    return None if listed == batches else f"it lists {listed} batches"


def _kind(t: pa.DataType) -> str:
    """Types a column may be cast between, exactly: numbers, or text (dictionary-encoded or not)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    return "text" if pa.types.is_string(t) or pa.types.is_large_string(t) else str(t)


def _row_bytes(t: pa.DataType) -> int:
    try:
        return max(1, t.bit_width // 8)
    except ValueError:          # not fixed-width: its offsets, at least
        return 8


def open_captures(paths: list[str]) -> list[Capture]:
    """The captures, each checked (Capture.check) before any is used."""
    caps = [Capture.open(p) for p in paths]
    for cap in caps:
        cap.check()
    return caps


def _read_all(fd: int, size: int) -> bytes:
    """The first `size` bytes of an open file (fewer if it is shorter by now)."""
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


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
