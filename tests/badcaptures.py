"""Bad captures: damaged copies of the shipped sample (analyzer/sample), each named, with what
every reader must answer, and a runner that gives every command a process of its own with a
time and memory limit. tests/unit/test_bad_captures.py runs the corpus; `python
tests/badcaptures.py` runs it too and prints each case's answers, times and peak memory.

What a case must get, from analyze, analyze --json, dump, export --parquet and top alike:
- ERROR: exit status 1 and one line, `slotscope: ...` naming the problem (`phrase` in it);
- SALVAGE: exit status 0, the rest read, and the damage reported (`phrase` in a problem line);
- CLEAN: a change the format allows (DESIGN: a segment without a newer column, a newer
  segment with one more) or that the format cannot see (a flipped number in a capture from
  before checksums), read whole, no problem reported.

The sample's segments carry checksums (format 1.1): a byte flipped in place is a checksum
mismatch before anything else looks at it. The cases about what the reader's own checks find
(a damaged footer, batch or string) read a copy from before checksums (Case.checksums False):
what a capture of format 1.0, or a segment whose line a crash kept from being written, gets.
"""
from __future__ import annotations

import faulthandler
import importlib
import json
import os
import pickle
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slotscope.capture.format import CHECKSUMS

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "analyzer" / "sample"
ERROR, SALVAGE, CLEAN = "error", "salvage", "clean"
TIMEOUT_S = 60     # a hang guard, not a speed test: ten thousand segments took over 10 s at load average 10
MEMORY_BYTES = 1 << 30
NOBODY = 65534
COMMANDS = ("analyze", "analyze --json", "dump", "export", "top")
MAGIC = b"ARROW1"
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


@dataclass(frozen=True)
class Case:
    name: str
    damage: Callable[[Path], Path | None]     # damages the copy at its argument; may return another path to read
    outcome: str
    phrase: str = ""
    table: str = "rpc"                        # what `dump -t` prints
    as_nobody: bool = False                   # read as an ordinary user (root reads through any mode)
    exceptions: dict = field(default_factory=dict)   # command -> (outcome, phrase) where it differs
    checksums: bool = True                    # False: the copy made a capture from before checksums


# ---- damage: files ------------------------------------------------------------------------------

def _seg(cap: Path, table: str = "rpc", n: int = 1) -> Path:
    return cap / table / f"{n:06d}.arrow"


def _last(cap: Path, table: str = "rpc") -> Path:
    return max((cap / table).glob("*.arrow"))


def _cut(path: Path, keep) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data)) if callable(keep) else keep])


def _patch(path: Path, at, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = at(bytes(data)) if callable(at) else at
    data[at:at + len(new)] = new
    path.write_bytes(bytes(data))


def _messages(path: Path) -> list[tuple[int, int]]:
    """(offset, body offset) of each message of an Arrow file's stream."""
    data = path.read_bytes()
    out, pos = [], 8
    while data[pos:pos + 8] != EOS:
        body = pos + 8 + struct.unpack_from("<i", data, pos + 4)[0]
        msg = pa.ipc.read_message(pa.py_buffer(data[pos:]))
        out.append((pos, body))
        pos = body + (msg.body.size if msg.body is not None else 0)
    return out


def _footer(path: Path) -> tuple[int, int]:
    """(offset, length) of an Arrow file's footer flatbuffer."""
    data = path.read_bytes()
    length = struct.unpack_from("<i", data, len(data) - 10)[0]
    return len(data) - 10 - length, length


def _read(path: Path) -> pa.Table:
    """A segment's rows, copied out of the file (a mapping of a file about to be rewritten
    would fault)."""
    return pa.ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()


def _write(path: Path, table: pa.Table, options=None) -> None:
    """A segment as a writer writes it: with its checksum line."""
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema, options=options) as w:
        w.write_table(table)
    _seal(path)


def _seal(seg: Path) -> None:
    """The segment's line in its folder's checksums file (size, CRC-32) made the one its bytes
    have now, as the writer that wrote them would record it."""
    sums = seg.parent / CHECKSUMS
    lines = [line for line in (sums.read_text().splitlines() if sums.exists() else [])
             if line.split()[:1] != [seg.name]]
    data = seg.read_bytes()
    sums.write_text("".join(f"{line}\n" for line in lines + [f"{seg.name} {len(data)} {zlib.crc32(data):08x}"]))


def _before_checksums(cap: Path) -> None:
    """The copy made a capture of format 1.0: no checksums files, meta.json's format_minor 0."""
    for sums in cap.glob(f"*/{CHECKSUMS}"):
        sums.unlink()
    _meta(cap, format_minor=0)


def _rewrite(cap: Path, table: str, change: Callable[[pa.Table], pa.Table], which=(1,)) -> None:
    """Segments of `table` (numbers in `which`, or "all") read, changed and written back."""
    segs = sorted((cap / table).glob("*.arrow")) if which == "all" else [_seg(cap, table, n) for n in which]
    for seg in segs:
        t = _read(seg)
        _write(seg, change(t).replace_schema_metadata(t.schema.metadata))


def _drop(*names):
    return lambda t: t.drop_columns(list(names))


def _rename(old, new):
    return lambda t: t.rename_columns([new if n == old else n for n in t.column_names])


def _retype(name, fn):
    def change(t):
        i = t.column_names.index(name)
        return t.set_column(i, name, fn(t.column(name)))
    return change


def _tag(cap: Path, tag: bytes, table: str = "rpc", n: int = 1) -> None:
    seg = _seg(cap, table, n)
    t = _read(seg)
    _write(seg, t.replace_schema_metadata({b"slotscope.schema": tag} if tag else None))


_DELETE = object()      # _meta(key=_DELETE): the key removed


def _meta(cap: Path, **changes) -> None:
    m = json.loads((cap / "meta.json").read_text())
    for key, value in changes.items():
        if value is _DELETE:
            del m[key]
        elif callable(value):
            value(m)
        else:
            m[key] = value
    (cap / "meta.json").write_text(json.dumps(m))



def _replace_meta(cap: Path, make: Callable[[Path], None]) -> None:
    (cap / "meta.json").unlink()
    make(cap / "meta.json")


def _stream_bytes(table: pa.Table, options=None) -> tuple[bytes, bytes]:
    """(schema message, batch messages) of a table written as an IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        pass
    schema_only = sink.getvalue().to_pybytes()[:-8]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=options) as w:
        w.write_table(table)
    return schema_only, sink.getvalue().to_pybytes()[len(schema_only):-8]


def _bomb(cap: Path) -> None:
    """An rpc segment of a few KiB whose zstd-compressed batches decode to 5 GiB."""
    schema = pa.schema([("ts_begin", pa.int64())], metadata={b"slotscope.schema": b"rpc/1"})
    batch = pa.table({"ts_begin": pa.array([0] * (16 << 20), pa.int64())}, schema=schema)
    head, body = _stream_bytes(batch, pa.ipc.IpcWriteOptions(compression="zstd"))
    _seg(cap, "rpc", 20).write_bytes(MAGIC + b"\0\0" + head + body * 40 + EOS)


def _claims_huge(cap: Path) -> None:
    """A compressed buffer whose length prefix claims 1 TiB."""
    schema = pa.schema([("ts_begin", pa.int64())], metadata={b"slotscope.schema": b"rpc/1"})
    t = pa.table({"ts_begin": pa.array(range(1000), pa.int64())}, schema=schema)
    head, body = _stream_bytes(t, pa.ipc.IpcWriteOptions(compression="lz4"))
    data = bytearray(MAGIC + b"\0\0" + head + body + EOS)
    at = data.index(struct.pack("<q", 8000))           # the data buffer's decoded length
    data[at:at + 8] = struct.pack("<q", 1 << 40)
    _seg(cap, "rpc", 20).write_bytes(bytes(data))


def _rows_without_bytes(cap: Path) -> None:
    """A batch of a null-typed column (no buffers at all) that claims 10**15 rows."""
    schema = pa.schema([("server", pa.null())], metadata={b"slotscope.schema": b"rpc/1"})
    seg = _seg(cap, "rpc", 20)
    _write(seg, pa.table({"server": pa.nulls(123457)}, schema=schema))
    data = seg.read_bytes().replace(struct.pack("<q", 123457), struct.pack("<q", 10**15))
    seg.write_bytes(data)
    _seal(seg)                         # made so, not damaged on disk


def _thin_and_long(cap: Path) -> None:
    """A slots segment of 6 M rows of `ts` alone, zstd-compressed to a few KiB: its other
    columns, read as nulls, would take gigabytes."""
    schema = pa.schema([("ts", pa.int64())], metadata={b"slotscope.schema": b"slots/1"})
    seg = _seg(cap, "slots", 20)
    _write(seg, pa.table({"ts": pa.array([1] * 6_000_000, pa.int64())}, schema=schema),
           pa.ipc.IpcWriteOptions(compression="zstd"))


def _compressed(cap: Path) -> None:
    seg = _seg(cap, "rpc", 1)
    t = _read(seg)
    _write(seg, t, pa.ipc.IpcWriteOptions(compression="zstd"))


def _empty_segments(cap: Path, count: int) -> None:
    t = _read(_seg(cap)).slice(0, 0)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, t.schema):
        pass
    data = sink.getvalue().to_pybytes()
    for n in range(20, 20 + count):
        _seg(cap, "rpc", n).write_bytes(data)


def _extra_clash(cap: Path) -> None:
    _rewrite(cap, "rpc", lambda t: t.append_column("note", pa.array([1] * t.num_rows)), which=(1,))
    _rewrite(cap, "rpc", lambda t: t.append_column("note", pa.array(["x"] * t.num_rows)), which=(2,))


def _dictionary_index_out_of_range(cap: Path) -> None:
    """A syscall segment whose dictionary indices point past its dictionary."""
    seg = _seg(cap, "syscall")
    t = _read(seg).combine_chunks()
    fsync = pa.DictionaryArray.from_arrays(pa.array([1] * t.num_rows, pa.int8()), pa.array(["?", "fsync"]))
    _write(seg, t.set_column(t.column_names.index("syscall"), "syscall", fsync))
    _patch(seg, lambda d: d.index(b"\x01" * t.num_rows), b"\x7f" * t.num_rows)
    _seal(seg)                         # made so, not damaged on disk


def _flip_batch_header(cap: Path) -> None:
    _patch(_seg(cap), _messages(_seg(cap))[1][0] + 8, b"\xff" * 32)


def _flip_number(cap: Path) -> None:
    """A byte of a number in the first batch's body: the batch still reads, with another value."""
    _patch(_seg(cap), _messages(_seg(cap))[1][1] + 20, b"\x55")


def _duplicate_column(cap: Path) -> None:
    seg = _seg(cap)
    t = _read(seg)
    twice = pa.Table.from_arrays(t.columns + [t.column("server")], names=t.column_names + ["server"])
    _write(seg, twice.replace_schema_metadata(t.schema.metadata))


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink(target) -> Callable[[Path], None]:
    return lambda path: os.symlink(target, path)


def _loop(path: Path) -> None:
    os.symlink(path.name, path)


def _modes(cap: Path, dirs: int, files: int) -> None:
    for folder, _, names in os.walk(cap):
        os.chmod(folder, dirs)
        for name in names:
            os.chmod(os.path.join(folder, name), files)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# ---- the corpus ------------------------------------------------------------------------------

def _cases() -> list[Case]:
    c = []

    def add(name, damage, outcome, phrase="", **kw):
        c.append(Case(name, damage, outcome, phrase, **kw))

    truncated, schema_cut, not_arrow = "truncated; read its", "truncated before its schema", "not an Arrow file"
    # truncations
    add("trunc_rpc_half", lambda p: _cut(_seg(p), lambda n: n // 2), SALVAGE, truncated)
    add("trunc_rpc_footer", lambda p: _cut(_seg(p), lambda n: n - 12), SALVAGE, truncated)
    add("trunc_rpc_trailer_byte", lambda p: _cut(_seg(p), lambda n: n - 1), SALVAGE, truncated)
    add("trunc_rpc_after_schema", lambda p: _cut(_seg(p), _messages(_seg(p))[1][0]), SALVAGE,
        "read its 0 whole batches")
    add("trunc_rpc_in_schema", lambda p: _cut(_seg(p), 40), SALVAGE, schema_cut)
    add("trunc_rpc_to_magic", lambda p: _cut(_seg(p), 8), SALVAGE, schema_cut)
    add("trunc_rpc_to_3_bytes", lambda p: _cut(_seg(p), 3), SALVAGE, not_arrow)
    add("trunc_rpc_empty", lambda p: _cut(_seg(p), 0), SALVAGE, not_arrow)
    add("trunc_rpc_last_segment", lambda p: _cut(_last(p), lambda n: n * 2 // 3), SALVAGE, truncated)
    add("trunc_every_rpc_segment", lambda p: [_cut(s, lambda n: n // 2) for s in (p / "rpc").glob("*.arrow")],
        SALVAGE, truncated)
    add("trunc_syscall_in_dictionary",
        lambda p: _cut(_seg(p, "syscall"), _messages(_seg(p, "syscall"))[1][0] + 100), SALVAGE, truncated,
        table="syscall")
    add("trunc_procs_half", lambda p: _cut(_seg(p, "procs"), lambda n: n // 2), SALVAGE, truncated, table="procs")
    add("trunc_slots_every_segment_to_magic",
        lambda p: [_cut(s, 8) for s in (p / "slots").glob("*.arrow")], SALVAGE, schema_cut, table="slots")
    add("trunc_meta_half", lambda p: _cut(p / "meta.json", lambda n: n // 2), ERROR, "meta.json: unreadable")
    add("trunc_meta_empty", lambda p: _cut(p / "meta.json", 0), ERROR, "meta.json: unreadable")

    # byte flips in bodies and footers; those the checksums would answer first read a copy from
    # before checksums (their own checks are what is tested), and two of them the sample as it is
    damaged = ": damaged ("            # the reader's own finding, not '(damaged on disk)'
    add("flip_leading_magic", lambda p: _patch(_seg(p), 0, b"ARROW2"), SALVAGE, not_arrow)
    add("flip_trailing_magic", lambda p: _patch(_seg(p), lambda d: len(d) - 6, b"ARROW2"), SALVAGE, truncated,
        checksums=False)
    add("flip_footer_length", lambda p: _patch(_seg(p), lambda d: len(d) - 10, b"\xff\xff\xff\x7f"), SALVAGE,
        "footer damaged", checksums=False)
    add("flip_footer_flatbuffer", lambda p: _patch(_seg(p), _footer(_seg(p))[0], b"\xff" * 16), SALVAGE,
        "footer damaged", checksums=False)
    add("flip_footer_block_offsets",
        lambda p: _patch(_seg(p), sum(_footer(_seg(p))) - 40, b"\x13" * 24), SALVAGE, "footer damaged",
        checksums=False)
    add("flip_footer_zeroed", lambda p: _patch(_seg(p), _footer(_seg(p))[0], b"\0" * _footer(_seg(p))[1]),
        SALVAGE, "footer damaged", checksums=False)
    add("flip_schema_continuation", lambda p: _patch(_seg(p), 8, b"\0\0\0\0"), SALVAGE, "schema damaged")
    add("flip_schema_flatbuffer", lambda p: _patch(_seg(p), 16, b"\xff" * 24), SALVAGE, "schema damaged")
    add("flip_batch_continuation", lambda p: _patch(_seg(p), _messages(_seg(p))[2][0], b"\x01\x02\x03\x04"),
        SALVAGE, damaged, checksums=False)
    add("flip_batch_metadata_length",
        lambda p: _patch(_seg(p), _messages(_seg(p))[1][0] + 4, b"\xff\xff\xff\x7f"), SALVAGE, damaged,
        checksums=False)
    add("flip_batch_header", _flip_batch_header, SALVAGE, damaged, checksums=False)
    add("flip_syscall_dictionary_utf8", lambda p: _patch(_seg(p, "syscall"), lambda d: d.index(b"pwrite64"),
                                                         b"\xff\xfe"), SALVAGE, damaged, table="syscall",
        checksums=False)
    add("flip_syscall_path_utf8", lambda p: _patch(_seg(p, "syscall"), lambda d: d.index(b"/mnt/nfs"), b"\xc3\x28"),
        SALVAGE, damaged, table="syscall", checksums=False)
    add("flip_syscall_dictionary_index", _dictionary_index_out_of_range, SALVAGE, damaged, table="syscall")
    add("flip_rpc_number_unseen", _flip_number, CLEAN, checksums=False)
    checksum = "rpc/000001.arrow: checksum mismatch (damaged on disk), skipped"
    add("flip_rpc_number_checksummed", _flip_number, SALVAGE, checksum)
    add("flip_batch_header_checksummed", _flip_batch_header, SALVAGE, checksum)

    # foreign files
    add("foreign_zip_segment", lambda p: _seg(p, n=20).write_bytes(b"PK\x03\x04" + b"\0" * 200), SALVAGE, not_arrow)
    add("foreign_parquet_segment",
        lambda p: pq.write_table(pa.table({"a": [1]}), str(_seg(p, n=20))),
        SALVAGE, not_arrow)
    add("foreign_arrow_stream_segment", lambda p: _seg(p, n=20).write_bytes(b"".join(_stream_bytes(
        pa.table({"a": [1]}))) + EOS), SALVAGE, not_arrow)
    add("foreign_text_segment", lambda p: _seg(p, n=20).write_text("ARROW1 is how this line starts\n"), SALVAGE,
        "truncated before its schema")
    add("foreign_untagged_segment", lambda p: _tag(p, b""), SALVAGE, "not a slotscope 'rpc' segment")
    add("foreign_other_tables_segment", lambda p: _seg(p, n=20).write_bytes(_seg(p, "procs").read_bytes()), SALVAGE,
        "schema tag 'procs/1'")
    add("foreign_tag_not_utf8", lambda p: _tag(p, b"rpc/\xff\xfe"), SALVAGE, "not a slotscope 'rpc' segment")
    add("foreign_tag_without_major", lambda p: _tag(p, b"rpc/"), SALVAGE, "not a slotscope 'rpc' segment")
    add("foreign_tag_major_zero", lambda p: _tag(p, b"rpc/0"), SALVAGE, "version 0 is not one this slotscope reads")
    add("foreign_tag_unicode_digit", lambda p: _tag(p, "rpc/\u0661".encode()), SALVAGE,
        "not a slotscope 'rpc' segment")
    add("foreign_newer_table_major", lambda p: _tag(p, b"rpc/2"), ERROR,
        "rpc/000001.arrow: table 'rpc' version 2 is newer than this slotscope reads (1): upgrade slotscope")
    add("foreign_files_beside_segments",
        lambda p: [(p / "rpc" / n).write_text("x") for n in ("notes.txt", "1.arrow", ".000099.arrow.partial")],
        CLEAN)
    add("foreign_table_folder", lambda p: (p / "mystery").mkdir() or (p / "mystery" / "000001.arrow").write_text("x"),
        SALVAGE, "mystery/000001.arrow: not an Arrow file")
    add("foreign_directory_as_segment", lambda p: _seg(p, n=20).mkdir(), SALVAGE, "a directory, not a regular file")
    add("foreign_file_as_capture", lambda p: shutil.copy(_seg(p), p / "seg.arrow") and p / "seg.arrow", ERROR,
        "not a capture directory")
    add("foreign_fifo_as_capture", lambda p: os.mkfifo(p / "fifo") or p / "fifo", ERROR, "not a capture directory")
    add("foreign_missing_capture", lambda p: p / "nowhere", ERROR, "no such capture directory")
    add("foreign_empty_directory", lambda p: (p / "empty").mkdir() or p / "empty", ERROR, "empty directory")
    add("foreign_no_meta", lambda p: (p / "meta.json").unlink(), ERROR, "no meta.json")
    add("foreign_meta_of_another_tool", lambda p: (p / "meta.json").write_text('{"name": "x"}'), ERROR,
        "not a slotscope capture")
    add("foreign_meta_binary", lambda p: (p / "meta.json").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256))),
        ERROR, "meta.json: unreadable")
    add("foreign_meta_array", lambda p: (p / "meta.json").write_text("[1, 2]"), ERROR, "not a slotscope capture")
    add("foreign_meta_null", lambda p: (p / "meta.json").write_text("null"), ERROR, "not a slotscope capture")

    # schema changes
    add("schema_rpc_missing_server", lambda p: _rewrite(p, "rpc", _drop("server")), CLEAN)
    add("schema_rpc_missing_server_everywhere", lambda p: _rewrite(p, "rpc", _drop("server"), "all"), CLEAN)
    needed = "which every row needs, skipped"
    add("schema_rpc_missing_times_everywhere", lambda p: _rewrite(p, "rpc", _drop("ts_begin", "ts_end"), "all"),
        SALVAGE, "no column 'ts_begin', " + needed)
    add("schema_rpc_only_one_column", lambda p: _rewrite(p, "rpc", lambda t: t.select(["xid"]), "all"), SALVAGE,
        needed)
    add("schema_rpc_nulls_in_complete", lambda p: _rewrite(p, "rpc", _retype("complete", lambda c: pa.nulls(
        len(c), c.type))), SALVAGE, "nulls in column 'complete', " + needed)
    add("schema_syscall_missing_tgid_everywhere", lambda p: _rewrite(p, "syscall", _drop("tgid"), "all"), CLEAN,
        table="syscall")
    add("schema_syscall_missing_latency", lambda p: _rewrite(p, "syscall", _drop("latency_ns"), "all"), SALVAGE,
        "no column 'latency_ns', " + needed, table="syscall")
    add("schema_procs_missing_rank", lambda p: _rewrite(p, "procs", _drop("rank", "rank_env")), CLEAN, table="procs")
    add("schema_slots_missing_server", lambda p: _rewrite(p, "slots", _drop("server"), "all"), CLEAN, table="slots")
    add("schema_rpc_renamed_server", lambda p: _rewrite(p, "rpc", _rename("server", "srv")), CLEAN)
    add("schema_syscall_renamed_everywhere", lambda p: _rewrite(p, "syscall", _rename("path", "file"), "all"),
        CLEAN, table="syscall")
    add("schema_syscall_renamed_latency", lambda p: _rewrite(p, "syscall", _rename("latency_ns", "lat")), SALVAGE,
        "no column 'latency_ns', " + needed, table="syscall")
    add("schema_rpc_extra_column", lambda p: _rewrite(p, "rpc", lambda t: t.append_column(
        "future", pa.array(range(t.num_rows)))), CLEAN)
    add("schema_rpc_extra_column_clash", _extra_clash, SALVAGE, "of different types in different segments")
    add("schema_latency_int32", lambda p: _rewrite(p, "syscall", _retype("latency_ns", lambda c: c.cast(pa.int32()))),
        CLEAN, table="syscall")
    add("schema_latency_float_whole", lambda p: _rewrite(p, "syscall", _retype(
        "latency_ns", lambda c: c.cast(pa.float64()))), CLEAN, table="syscall")
    add("schema_latency_float_fraction", lambda p: _rewrite(p, "syscall", _retype(
        "latency_ns", lambda c: pc.divide(c.cast(pa.float64()), 3.0))), SALVAGE,
        "column 'latency_ns' has values that do not fit int64", table="syscall")
    add("schema_latency_string", lambda p: _rewrite(p, "syscall", _retype("latency_ns", lambda c: c.cast(pa.string()))),
        SALVAGE, "column 'latency_ns' is string, not int64", table="syscall")
    add("schema_tgid_negative", lambda p: _rewrite(p, "syscall", _retype(
        "tgid", lambda c: pc.negate(c.cast(pa.int64())))), SALVAGE,
        "column 'tgid' has values that do not fit uint32", table="syscall")
    add("schema_syscall_plain_strings", lambda p: _rewrite(p, "syscall", _retype(
        "syscall", lambda c: c.cast(pa.string()))), CLEAN, table="syscall")
    add("schema_syscall_wide_dictionary", lambda p: _rewrite(p, "syscall", _retype(
        "syscall", lambda c: c.cast(pa.dictionary(pa.int32(), pa.string())))), CLEAN, table="syscall")
    add("schema_rank_env_string", lambda p: _rewrite(p, "procs", _retype(
        "rank_env", lambda c: pa.array(["RANK=0"] * len(c)))), SALVAGE, "column 'rank_env' is string", table="procs")
    add("schema_server_int", lambda p: _rewrite(p, "rpc", _retype("server", lambda c: pa.array([7] * len(c)))),
        SALVAGE, "column 'server' is int64, not string")
    add("schema_server_null_type", lambda p: _rewrite(p, "rpc", _retype("server", lambda c: pa.nulls(len(c)))),
        SALVAGE, "column 'server' is null, not string")
    add("schema_duplicate_column", _duplicate_column, SALVAGE, "column 'server' appears twice")

    # decompression bombs and claims, compression, many segments
    add("bomb_zstd_5GiB", _bomb, SALVAGE, "decode to more than")
    add("bomb_claims_1TiB", _claims_huge, SALVAGE, "decode to more than")
    add("bomb_rows_without_bytes", _rows_without_bytes, SALVAGE, "rows in 0 bytes")
    add("bomb_nulls_for_missing_columns", _thin_and_long, SALVAGE, "more than a segment of its size holds",
        table="slots")
    add("compressed_segment", _compressed, CLEAN)
    add("ten_thousand_empty_segments", lambda p: _empty_segments(p, 10_000), CLEAN)

    # meta.json: its values
    bad_meta = "ignored"
    add("meta_host_number", lambda p: _meta(p, host=42), SALVAGE, "host is 42, not a string")
    add("meta_host_null", lambda p: _meta(p, host=None), SALVAGE, "host is null, not a string")
    add("meta_start_text", lambda p: _meta(p, start="yesterday"), SALVAGE, 'start is "yesterday", not an object',
        exceptions={"export": (ERROR, "no 'start' clock pair")})
    add("meta_start_mono_text", lambda p: _meta(p, start={"monotonic_ns": "1", "realtime_ns": 5}), SALVAGE,
        "start.monotonic_ns", exceptions={"export": (ERROR, "no 'start' clock pair")})
    add("meta_start_huge", lambda p: _meta(p, start={"monotonic_ns": 2**70, "realtime_ns": 2**70}), SALVAGE,
        "not a count of nanoseconds", exceptions={"export": (ERROR, "no 'start' clock pair")})
    add("meta_start_negative", lambda p: _meta(p, start={"monotonic_ns": -2**63, "realtime_ns": 2**63 - 1}),
        SALVAGE, "start.monotonic_ns is -9223372036854775808, not a count of nanoseconds",
        exceptions={"export": (ERROR, "no 'start' clock pair")})
    add("meta_start_bool", lambda p: _meta(p, start={"monotonic_ns": True, "realtime_ns": 5}), SALVAGE,
        "start.monotonic_ns is true", exceptions={"export": (ERROR, "no 'start' clock pair")})
    add("meta_stop_float", lambda p: _meta(p, stop={"monotonic_ns": 1.5, "realtime_ns": 2}), SALVAGE,
        "stop.monotonic_ns is 1.5")
    add("meta_nfs_mounts_text", lambda p: _meta(p, nfs_mounts="none"), SALVAGE, 'nfs_mounts is "none", not a list')
    add("meta_nfs_mounts_numbers", lambda p: _meta(p, nfs_mounts=[1]), SALVAGE, "nfs_mounts[0] is 1, not an object")
    add("meta_nconnect_word", lambda p: _meta(p, nfs_mounts=lambda m: m["nfs_mounts"][0].update(nconnect="two")),
        SALVAGE, "nfs_mounts[0].nconnect")
    add("meta_server_number", lambda p: _meta(p, nfs_mounts=lambda m: m["nfs_mounts"][0].update(server=10)),
        SALVAGE, "nfs_mounts[0].server is 10")
    add("meta_sunrpc_list", lambda p: _meta(p, sunrpc=[1]), SALVAGE, "sunrpc is [1], not an object")
    add("meta_sunrpc_word", lambda p: _meta(p, sunrpc={"tcp_max_slot_table_entries": "many"}), SALVAGE,
        "sunrpc.tcp_max_slot_table_entries")
    add("meta_mountstats_number", lambda p: _meta(p, mountstats_start={"/mnt/nfs": 5}), SALVAGE,
        "mountstats_start./mnt/nfs is 5")
    add("meta_mountstats_garbage_text", lambda p: _meta(
        p, mountstats_start={"/mnt/nfs": "xprt: tcp a b c\nWRITE: 1 x\n"},
        mountstats_stop={"/mnt/nfs": "xprt: tcp 1 2\nWRITE: 3 4 5\n"}), CLEAN)
    add("meta_kernel_number", lambda p: _meta(p, kernel=5), SALVAGE, "kernel is 5")
    add("meta_nics_text", lambda p: _meta(p, nics="eth0"), SALVAGE, 'nics is "eth0"')
    add("meta_probes_list", lambda p: _meta(p, probes=[]), SALVAGE, "probes is [], not an object")
    add("meta_three_problems", lambda p: _meta(p, host=[], kernel={}, boot_id=1), SALVAGE, bad_meta)
    add("meta_unknown_keys", lambda p: _meta(p, color="blue", more={"a": [1]}), CLEAN)
    add("meta_deep_nesting", lambda p: (p / "meta.json").write_bytes(_nested(100_000)), ERROR, "nested too deeply")
    add("meta_deep_nesting_in_a_key", lambda p: (p / "meta.json").write_bytes(
        b'{"format": "slotscope-capture", "schema_version": 1, "filters": ' + _nested(100_000) + b"}"),
        ERROR, "nested too deeply")
    add("meta_not_utf8", lambda p: (p / "meta.json").write_bytes((p / "meta.json").read_bytes().replace(
        b'"vm"', b'"\xff\xfe"')), ERROR, "meta.json: unreadable")
    add("meta_too_big", lambda p: (p / "meta.json").write_bytes(b" " * (33 << 20) + b"{}"), ERROR, "larger than 32 MiB")
    # meta.json: its format version
    not_version = "is not a capture format version"
    add("version_text", lambda p: _meta(p, schema_version="1"), ERROR, 'schema_version "1" ' + not_version)
    add("version_bool", lambda p: _meta(p, schema_version=True), ERROR, "schema_version true " + not_version)
    add("version_negative", lambda p: _meta(p, schema_version=-1), ERROR, "schema_version -1 " + not_version)
    add("version_zero", lambda p: _meta(p, schema_version=0), ERROR, "schema_version 0 " + not_version)
    add("version_float", lambda p: _meta(p, schema_version=1.0), ERROR, "schema_version 1.0 " + not_version)
    add("version_huge", lambda p: _meta(p, schema_version=2**64), ERROR, not_version)
    add("version_missing", lambda p: _meta(p, schema_version=_DELETE), ERROR, "no schema_version")
    add("version_newer", lambda p: _meta(p, schema_version=99), ERROR,
        "format version 99 is newer than this slotscope reads (1): upgrade slotscope")
    add("format_missing", lambda p: _meta(p, format=_DELETE), ERROR, "not a slotscope capture")
    # meta.json: not a file
    add("meta_fifo", lambda p: _replace_meta(p, _fifo), ERROR, "meta.json: a FIFO, not a regular file")
    add("meta_dev_zero", lambda p: _replace_meta(p, _symlink("/dev/zero")), ERROR, "meta.json: a symlink")
    add("meta_directory", lambda p: _replace_meta(p, Path.mkdir), ERROR, "meta.json: a directory")
    add("meta_symlink_to_itself", lambda p: _replace_meta(p, _loop), ERROR, "meta.json: a symlink")

    # special files and symlinks in the tables
    add("segment_fifo", lambda p: _fifo(_seg(p, n=20)), SALVAGE, "000020.arrow: a FIFO, not a regular file")
    add("segment_dev_zero", lambda p: _symlink("/dev/zero")(_seg(p, n=20)), SALVAGE, "a symlink, not followed")
    add("segment_symlink_loop", lambda p: _loop(_seg(p, n=20)), SALVAGE, "a symlink, not followed")
    add("segment_symlink_to_a_good_one", lambda p: _symlink("000001.arrow")(_seg(p, n=20)), SALVAGE,
        "a symlink, not followed")
    add("table_symlink_loop", lambda p: _loop(p / "kmsg"), SALVAGE, "kmsg: a symlink, not followed")
    add("table_symlink_elsewhere", lambda p: shutil.rmtree(p / "slots") or _symlink("/proc/self")(p / "slots"),
        SALVAGE, "slots: a symlink, not followed")
    add("capture_symlink_loop", lambda p: _loop(p / "loop") or p / "loop", ERROR, "Too many levels of symbolic links")
    add("capture_through_a_symlink", lambda p: _symlink(p)(p.parent / (p.name + "-link")) or
        p.parent / (p.name + "-link"), CLEAN)

    # permissions, read as nobody
    denied = "permission denied: captures are root-only by default; use sudo or record with --group-readable"
    add("perm_root_only_capture", lambda p: _modes(p, 0o700, 0o600), ERROR, denied, as_nobody=True)
    add("perm_group_readable_other_group", lambda p: _modes(p, 0o750, 0o640), ERROR, denied, as_nobody=True)
    add("perm_meta_only", lambda p: os.chmod(p / "meta.json", 0o600), ERROR, denied, as_nobody=True)
    add("perm_one_table_folder", lambda p: os.chmod(p / "rpc", 0o700), ERROR, denied, as_nobody=True)
    add("perm_one_segment", lambda p: os.chmod(_seg(p, n=7), 0o600), ERROR, denied, as_nobody=True)
    add("perm_unlistable_capture", lambda p: os.chmod(p, 0o711), ERROR, denied, as_nobody=True)
    add("perm_world_readable", lambda p: _modes(p, 0o755, 0o644), CLEAN, as_nobody=True)
    return c


CASES = _cases()


def build(case: Case, root: Path) -> Path:
    """A fresh copy of the sample under root/<case>, damaged; the path the commands read."""
    home = root / case.name
    home.mkdir(mode=0o755)
    cap = home / "capture"
    shutil.copytree(SAMPLE, cap)
    _modes(cap, 0o755, 0o644)
    if not case.checksums:
        _before_checksums(cap)
    other = case.damage(cap)
    return other if isinstance(other, Path) else cap


# ---- running the commands ------------------------------------------------------------------------

@dataclass
class Result:
    status: int | None          # exit status; None: killed after TIMEOUT_S
    stdout: str
    stderr: str
    seconds: float
    peak_bytes: int             # the process's peak resident memory


class Runner:
    """Runs each command in a process of its own, forked from a server that has imported
    slotscope, pyarrow and textual once (a fresh interpreter per command would cost the corpus
    minutes): its address space limited to MEMORY_BYTES, killed after TIMEOUT_S."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def run(self, argv: list[str], as_nobody: bool = False) -> Result:
        pickle.dump((argv, as_nobody), self.proc.stdin)
        self.proc.stdin.flush()
        return Result(**pickle.load(self.proc.stdout))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def _serve() -> None:
    import slotscope.analyzer.analysis  # noqa: F401  (what the commands import, once, before any fork)
    import slotscope.analyzer.export  # noqa: F401
    import slotscope.analyzer.report_text  # noqa: F401
    import slotscope.cli.main  # noqa: F401
    import slotscope.tui.app  # noqa: F401
    import pyarrow.csv  # noqa: F401
    _warm_up()
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            argv, as_nobody = pickle.load(inp)
        except EOFError:
            return
        pickle.dump(vars(_fork(argv, as_nobody)), out)      # plain data: this module is __main__ here
        out.flush()


def _warm_up() -> None:
    """Import here what every command imports, lazily too, so that it is loaded before a child
    drops to the user `nobody`, who may not read this interpreter's library or the checkout's
    venv (a fresh clone in a 0700 temporary directory, a Python under /root). The commands run
    once on the intact sample in a throwaway child, which names the modules they loaded; only
    the imports happen here (a command run here would leave its state to every child)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        sample = str(SAMPLE)
        with tempfile.TemporaryDirectory() as tmp:
            for argv in (["analyze", sample], ["analyze", "--json", sample], ["dump", sample, "-t", "rpc"],
                         ["export", sample, "--parquet", os.path.join(tmp, "out")], ["top", sample]):
                _child_modules(argv, w)
        os._exit(0)
    os.close(w)
    # The one file `top` reads at its start, read here for the same reason.
    from slotscope.tui.app import TopApp
    TopApp.CSS = (Path(sys.modules[TopApp.__module__].__file__).parent / TopApp.CSS_PATH).read_text()
    TopApp.CSS_PATH = None
    with os.fdopen(r) as names:
        for name in names.read().split():
            try:
                importlib.import_module(name)
            except Exception:   # a module that imports only in its own context: not needed first
                pass
    os.waitpid(pid, 0)


def _child_modules(argv: list[str], w: int) -> None:
    """Run a command in a child with its output discarded; write the modules it loaded to w."""
    pid = os.fork()
    if pid == 0:
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        from slotscope.cli.main import main
        _top_headless()
        try:
            main(argv)
        except BaseException:
            pass
        os.write(w, " ".join(sorted(sys.modules)).encode() + b" ")
        os._exit(0)
    os.waitpid(pid, 0)


def _fork(argv: list[str], as_nobody: bool) -> Result:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(argv, as_nobody, out.fileno(), err.fileno())
        pidfd = os.pidfd_open(pid)
        ended = select.select([pidfd], [], [], TIMEOUT_S)[0]
        if not ended:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        seconds = time.perf_counter() - started
        os.close(pidfd)
        out.seek(0)
        err.seek(0)
        return Result(os.waitstatus_to_exitcode(status) if ended else None, out.read().decode(errors="replace"),
                      err.read().decode(errors="replace"), seconds, usage.ru_maxrss * 1024)


def _child(argv: list[str], as_nobody: bool, out: int, err: int) -> None:
    """The command, as the console script runs it (an exception that escapes is a traceback
    and exit status 1), with `top` driven headless; never returns."""
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        # The limit on what the command may add: the server's own address space (the imports)
        # is not the command's.
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY_BYTES, mapped + MEMORY_BYTES))
        faulthandler.dump_traceback_later(TIMEOUT_S - 1)      # where it hangs, if it does
        if as_nobody:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
        from slotscope.cli.main import main
        _top_headless()
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _top_headless() -> None:
    """`top` runs its TUI as on a terminal, driven by _headless_top (without one, it would print
    the analysis)."""
    import slotscope.cli.show
    import slotscope.tui.app
    slotscope.cli.show.interactive = lambda: True
    slotscope.tui.app.run_app = _headless_top


def _headless_top(job, poll_seconds: float = 1.0) -> int:
    """run_app's stand-in (there is no terminal here): the app under Textual's Pilot until its
    first load, then what it showed, as JSON on stdout."""
    import asyncio
    from slotscope.tui.app import TopApp

    async def drive() -> dict:
        app = TopApp(job, poll_seconds=3600, analysis="thread")
        async with app.run_test(size=(120, 40)) as pilot:
            while app.result is None and app.error is None:
                await pilot.pause(0.02)
            await app.workers.wait_for_complete()       # a load asked for meanwhile (a resize)
            await pilot.pause()
            return {"banner": str(app.query_one("#banner").render()), "error": app.error,
                    "problems": app.result.analysis["problems"] if app.result else None}

    shown = asyncio.run(drive())
    print(json.dumps(shown))
    return 0 if shown["error"] is None else 1


# ---- a case through every command ----------------------------------------------------------------

def _argv(command: str, path: Path, case: Case, out: Path) -> list[str]:
    return {"analyze": ["analyze", str(path)], "analyze --json": ["analyze", "--json", str(path)],
            "dump": ["dump", str(path), "-t", case.table], "export": ["export", str(path), "--parquet", str(out)],
            "top": ["top", str(path)]}[command]


def _reported(command: str, res: Result) -> list[str]:
    """The problems a command reported besides its answer."""
    if command == "analyze":
        return [line for line in res.stdout.splitlines() if line.startswith("problem: ")]
    if command in ("analyze --json", "top"):
        return json.loads(res.stdout)["problems"]
    return res.stderr.splitlines()


def judge(case: Case, command: str, res: Result) -> str | None:
    """What is wrong with a command's answer to a case; None when it answered as it must."""
    outcome, phrase = case.exceptions.get(command, (case.outcome, case.phrase))
    if res.status is None:
        return f"still running after {TIMEOUT_S} s: {res.stderr[-3000:]}"
    if "Traceback" in res.stderr or res.peak_bytes > MEMORY_BYTES:
        return f"status {res.status}, {res.peak_bytes >> 20} MiB: {res.stderr[-1500:]}"
    lines = res.stderr.strip().splitlines()
    if outcome == ERROR:
        one = len(lines) == 1 and lines[0].startswith(("slotscope: ", "slotscope export: ")) and phrase in lines[0]
        return None if res.status == 1 and one else f"wanted one line with {phrase!r}: {res.status} {res.stderr!r}"
    if res.status != 0:
        return f"status {res.status}: {res.stderr[-1500:]}"
    reported = _reported(command, res)
    if outcome == CLEAN:
        return f"problems reported: {reported}" if reported else None
    if command == "top" and "problem:" not in json.loads(res.stdout)["banner"]:
        return "the banner shows no problem"
    return None if any(phrase in p for p in reported) else f"no problem with {phrase!r} in {reported}"


def run_case(case: Case, runner: Runner, root: Path) -> list[tuple[str, Result, str | None]]:
    """(command, its result, what is wrong with it) for every command, on a fresh damaged copy."""
    path = build(case, root)
    out = root / "out"
    out.mkdir(mode=0o1777, exist_ok=True)
    os.chmod(out, 0o1777)              # writable by nobody too
    answers = []
    try:
        for command in COMMANDS:
            res = runner.run(_argv(command, path, case, out / case.name), case.as_nobody)
            answers.append((command, res, judge(case, command, res)))
            shutil.rmtree(out / case.name, ignore_errors=True)
    finally:
        shutil.rmtree(root / case.name, ignore_errors=True)
    return answers


def main() -> int:
    if sys.argv[1:] == ["serve"]:
        _serve()
        return 0
    runner, root = Runner(), Path(tempfile.mkdtemp(prefix="slotscope-bad-"))
    os.chmod(root, 0o755)
    wrong, slowest, peak, counts = 0, (0.0, ""), (0, ""), {}
    try:
        for case in CASES:
            if case.as_nobody and os.geteuid() != 0 or sys.argv[1:] and case.name not in sys.argv[1:]:
                continue
            answers = run_case(case, runner, root)
            counts[case.outcome] = counts.get(case.outcome, 0) + 1
            for command, res, problem in answers:
                slowest = max(slowest, (res.seconds, f"{case.name} {command}"))
                peak = max(peak, (res.peak_bytes, f"{case.name} {command}"))
                if problem:
                    wrong += 1
                    print(f"WRONG {case.name} {command}: {problem}")
            print(f"{case.name:<42} {case.outcome:<8} {max(r.seconds for _, r, _ in answers):6.2f} s "
                  f"{max(r.peak_bytes for _, r, _ in answers) >> 20:5d} MiB")
    finally:
        runner.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{sum(counts.values())} cases {counts}; {wrong} wrong answers; slowest {slowest[0]:.2f} s "
          f"({slowest[1]}); peak {peak[0] >> 20} MiB ({peak[1]})")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
