"""Captures as a hive-partitioned Parquet dataset, for querying a fleet's captures with
DuckDB, Spark or Trino:

    DIR/<table>/host=<host>/part-<capture id>.parquet    one dataset (one schema) per table
    DIR/captures/host=<host>/part-<capture id>.parquet   one row per capture

Each table keeps its columns (monotonic ns, as recorded) and gains `capture_id` and, after
each time column, `<col>_utc`: a UTC timestamp from the capture's start clock pair, so rows
from many hosts line up. `host` is only in the path (the hive partition), as Spark, DuckDB
and Trino expect.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slotscope.capture.reader import Capture, CaptureError, open_captures
from slotscope.capture.safepath import UnsafePath, open_parent
from slotscope.capture.tables import TABLES, TIME_COLUMNS

# Microseconds, not ns: Spark (through 4.x) refuses Parquet TIMESTAMP(NANOS) ("Illegal Parquet
# type"), and the clock pair is only good to a few µs anyway (meta.json's uncertainty_ns). The
# exact ns are still there: the raw columns plus the clock pair in `captures`.
UTC_TYPE = pa.timestamp("us", tz="UTC")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)



class ExportError(Exception):
    """The output directory cannot be used or written; the message says why."""


def _clock_pair(cap: Capture, key: str, required: bool) -> tuple[int, int] | None:
    pair = cap.meta.get(key)
    try:
        return int(pair["monotonic_ns"]), int(pair["realtime_ns"])
    except (TypeError, KeyError, ValueError):
        if required:
            raise CaptureError(f"{cap.path}: meta.json has no '{key}' clock pair (monotonic_ns, "
                               f"realtime_ns): cannot convert its timestamps to UTC") from None
        return None


def _utc(mono: pa.ChunkedArray, offset_ns: int) -> pa.ChunkedArray:
    us = pc.divide(pc.add(pc.cast(mono, pa.int64()), offset_ns), 1000)    # integer division
    return pc.if_else(pc.equal(mono, 0), pa.scalar(None, UTC_TYPE), pc.cast(us, UTC_TYPE))


def _utc_scalar(realtime_ns: int) -> datetime:
    return EPOCH + timedelta(microseconds=realtime_ns // 1000)     # exact, unlike a float


def _prepare(table: pa.Table, name: str, capture_id: str, offset_ns: int) -> pa.Table:
    cols, fields = [], []
    for f, col in zip(table.schema, table.columns):
        if pa.types.is_dictionary(f.type):       # plain strings: every reader agrees on them
            col, f = col.cast(f.type.value_type), pa.field(f.name, f.type.value_type)
        cols.append(col)
        fields.append(f)
        if f.name in TIME_COLUMNS.get(name, ()):
            cols.append(_utc(col, offset_ns))
            fields.append(pa.field(f"{f.name}_utc", UTC_TYPE))
    cols.append(pa.repeat(capture_id, table.num_rows).cast(pa.string()))
    fields.append(pa.field("capture_id", pa.string()))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=table.schema.metadata))


def _host_dir(host: str) -> str:
    """host=<host>, percent-escaped (Spark and DuckDB unescape it) so a host name is never a path."""
    escaped = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else f"%{ord(c):02X}"
                      for c in host) or "unknown"
    return "host=" + ("%2E" + escaped[1:] if escaped.startswith(".") else escaped)


class _Out:
    """The output directory, reached only through directory fds opened with O_NOFOLLOW, so a
    symlink planted anywhere in it is refused, never followed."""

    def __init__(self, path: str, force: bool):
        self.path, self.fds = path, {}
        try:
            pfd, base = open_parent(path)       # no planted link on the way either
        except UnsafePath as exc:
            raise ExportError(exc.strerror) from None
        except OSError as exc:
            raise ExportError(f"{path}: {exc.strerror}") from None
        try:
            try:
                os.mkdir(base, 0o755, dir_fd=pfd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise ExportError(f"{path}: {exc.strerror}") from None
            self.fds[""] = self._os(os.open, base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=pfd)
        finally:
            os.close(pfd)
        if os.listdir(self.fds[""]) and not force:
            self.close()
            raise ExportError(f"{path}: not empty (use --force to write into it)")

    def _os(self, fn, *args, rel: str = "", **kw):
        try:
            return fn(*args, **kw)
        except OSError as exc:
            where = os.path.join(self.path, rel) if rel else self.path
            # O_NOFOLLOW fails on a symlink with ELOOP, or ENOTDIR with O_DIRECTORY: say which it was
            link = exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(where)
            why = "a symlink, refusing to follow it" if link else exc.strerror
            raise ExportError(f"{where}: {why}") from None

    def _dir(self, rel: str) -> int:
        if rel not in self.fds:
            parent, name = os.path.split(rel)
            pfd = self._dir(parent)
            if name not in os.listdir(pfd):     # else made for an earlier capture, or --force: open checks it
                self._os(os.mkdir, name, 0o755, dir_fd=pfd, rel=rel)
            self.fds[rel] = self._os(os.open, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                     dir_fd=pfd, rel=rel)
        return self.fds[rel]

    def write(self, rel: str, table: pa.Table) -> None:
        """Written to a dotfile (which readers skip), then renamed: no reader sees half a file."""
        folder, name = os.path.split(rel)
        dfd, tmp = self._dir(folder), f".{name}.tmp"
        fd = self._os(os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644,
                      dir_fd=dfd, rel=os.path.join(folder, tmp))
        try:
            with os.fdopen(fd, "wb") as f:
                pq.write_table(table, f)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(exc, OSError):
                raise ExportError(f"{os.path.join(self.path, rel)}: {exc.strerror or exc}") from None
            raise

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def export_parquet(paths: list[str], out_dir: str, force: bool = False) -> dict:
    """Write the captures at `paths` under out_dir (layout above). Returns
    {"tables": {table: {host: rows}}, "files": [paths relative to out_dir], "problems": [str]}.
    Raises CaptureError for a capture that cannot be read, ExportError for out_dir problems.
    Every capture's meta.json is checked before anything is written; each file is written whole
    or not at all, but a table that fails to read midway leaves the captures before it exported."""
    caps, seen = [], {}
    for path, cap in zip(paths, open_captures(paths)):
        start = _clock_pair(cap, "start", required=True)
        host = str(cap.meta.get("host") or "unknown")
        digest = hashlib.sha1(f"{host}|{cap.meta.get('boot_id')}|{start[0]}".encode()).hexdigest()[:8]
        capture_id = f"{_utc_scalar(start[1]):%Y%m%dT%H%M%SZ}-{digest}"
        if (host, capture_id) in seen:
            raise ExportError(f"{path}: the same capture as {seen[host, capture_id]}")
        seen[host, capture_id] = path
        caps.append((cap, host, capture_id, start[1] - start[0]))

    out = _Out(out_dir, force)
    result = {"tables": {}, "files": [], "problems": []}
    try:
        for cap, host, capture_id, offset in caps:
            part = os.path.join(_host_dir(host), f"part-{capture_id}.parquet")
            for name in cap.tables():
                table = cap.read(name) if name in TABLES else None   # known names only: safe paths
                if table is None:
                    continue
                out.write(os.path.join(name, part), _prepare(table, name, capture_id, offset))
                result["files"].append(os.path.join(name, part))
                result["tables"].setdefault(name, {}).setdefault(host, 0)
                result["tables"][name][host] += table.num_rows
            out.write(os.path.join("captures", part), _capture_row(cap, capture_id))
            result["files"].append(os.path.join("captures", part))
            result["tables"].setdefault("captures", {}).setdefault(host, 0)
            result["tables"]["captures"][host] += 1
            result["problems"] += [f"{cap.path}: {p}" for p in cap.problems]
    finally:
        out.close()
    return result


def _capture_row(cap: Capture, capture_id: str) -> pa.Table:
    meta = cap.meta
    start, stop = _clock_pair(cap, "start", True), _clock_pair(cap, "stop", False)
    limit = (meta.get("sunrpc") or {}).get("tcp_max_slot_table_entries")
    row = {
        "capture_id": capture_id,
        "path": os.path.abspath(cap.path),
        "kernel": meta.get("kernel"),
        "boot_id": meta.get("boot_id"),
        "slotscope_version": meta.get("slotscope_version"),
        "start_utc": _utc_scalar(start[1]),
        "stop_utc": _utc_scalar(stop[1]) if stop else None,      # None: still being recorded
        "stop_reason": meta.get("stop_reason"),
        # the exact conversion, to the ns: utc_ns = ts - start_monotonic_ns + start_realtime_ns
        "start_monotonic_ns": start[0],
        "start_realtime_ns": start[1],
        "tcp_max_slot_table_entries": int(limit) if str(limit).isdigit() else None,
        "nfs_mounts": json.dumps(meta.get("nfs_mounts", []), sort_keys=True),
        "sunrpc": json.dumps(meta.get("sunrpc", {}), sort_keys=True),
    }
    schema = pa.schema([(k, pa.string()) for k in ("capture_id", "path", "kernel", "boot_id", "slotscope_version")]
                       + [("start_utc", UTC_TYPE), ("stop_utc", UTC_TYPE), ("stop_reason", pa.string()),
                          ("start_monotonic_ns", pa.int64()), ("start_realtime_ns", pa.int64()),
                          ("tcp_max_slot_table_entries", pa.int64()),
                          ("nfs_mounts", pa.string()), ("sunrpc", pa.string())])
    return pa.Table.from_pylist([row], schema=schema)
