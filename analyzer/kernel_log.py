"""NFS/RPC fingerprints in a kernel log: a pasted dmesg/journalctl file, or the agent's kmsg table.

read_kernel_log() turns the text into rows (timestamps, host, message); fingerprints() finds the
events the findings use in any table of messages: servers not responding / back, hung tasks with
their call traces, other sunrpc/NFS error lines. Pure Python + pyarrow: no bcc, no textual.

Timestamps: ts_mono_ns is the kernel's local clock (as /dev/kmsg stamps records: CLOCK_MONOTONIC on
a machine that has not suspended); ts_utc_ns is wall-clock time, for the formats that print it.
`dmesg -T` and journalctl's default format print local time without a zone: it is read as UTC
unless `tz` names the zone the log was written in.
"""
from __future__ import annotations

import calendar
import datetime as dt
import os
import re
import zoneinfo

import pyarrow as pa

from slotscope.capture.files import NotAFile, open_regular
from slotscope.capture.kmsg import FRAME, REPORT_LINE

LOG_MAX_BYTES = 256 << 20      # a kernel log read whole (its lines become Python strings: ~5x in memory)

LOG_SCHEMA = pa.schema([
    ("ts_mono_ns", pa.int64()), ("ts_utc_ns", pa.int64()), ("host", pa.string()), ("message", pa.string()),
])
FINGERPRINT_SCHEMA = pa.schema([
    ("ts_mono_ns", pa.int64()), ("ts_utc_ns", pa.int64()), ("host", pa.string()), ("kind", pa.string()),
    ("server", pa.string()), ("task", pa.string()), ("pid", pa.int64()), ("blocked_s", pa.int64()),
    ("functions", pa.list_(pa.string())), ("nfs_related", pa.bool_()), ("message", pa.string()),
])


class KernelLogError(ValueError):
    """A kernel log that cannot be used; the one-line message names the file and says why."""


# ---- line formats -------------------------------------------------------------------------------

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH = {m: i for i, m in enumerate(_MONTHS, 1)}
_MON = "(" + "|".join(_MONTHS) + ")"
# journal lines carry "host identifier[pid]: message"; only identifier "kernel" is the kernel's
_JOURNAL_TAIL = r" (\S+) ([^\s:\[]+)(?:\[\d+\])?: ?(.*)"

_KMSG = re.compile(r"(\d+),\d+,(\d+),[^;]*;(.*)")                       # /dev/kmsg: prio,seq,usec,flags;msg
_RAW = re.compile(r"<\d+>\[ *(\d+)\.(\d+)\] ?(.*)")                     # dmesg -r
_JMONO = re.compile(r"\[ *(\d+)\.(\d+)\] ([^\s:\[\]]+) kernel: ?(.*)")  # journalctl -o short-monotonic
_DMESG = re.compile(r"\[ *(\d+)\.(\d+)\] ?(.*)")                        # dmesg
# dmesg -T
_DMESG_T = re.compile(r"\[\w{3} " + _MON + r" +(\d+) (\d\d):(\d\d):(\d\d) (\d{4})\] ?(.*)")
_JSHORT = re.compile(_MON + r" +(\d+) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?" + _JOURNAL_TAIL)  # journalctl (-o short-precise)
_JISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)"
                   + _JOURNAL_TAIL)                                     # journalctl -o short-iso(-precise)
_JOURNAL_MARK = re.compile(r"-- .*--$")              # "-- Boot 3f.. --", "-- No entries --", "-- Logs begin at .. --"
_KMSG_DICT = re.compile(r" [A-Z][A-Z0-9_]*=")        # /dev/kmsg dictionary lines (" SUBSYSTEM=net") after a record
_ANSI = re.compile(r"\x1b\[[0-9;]*m")                 # dmesg --color=always


def _frac_ns(frac: str | None) -> int:
    return int(frac[:9].ljust(9, "0")) if frac else 0


def _mono(sec: str, frac: str) -> int:
    return int(sec) * 1_000_000_000 + _frac_ns(frac)


class _Parser:
    """One line at a time; holds what a line's format leaves out (the year, the zone)."""

    def __init__(self, year: int | None, tz):
        self.year = year if year is not None else dt.datetime.now(dt.timezone.utc).year
        self.tz = zoneinfo.ZoneInfo(tz) if isinstance(tz, str) else tz
        self.last_month = 0
        self.formats = [(_KMSG, self._kmsg), (_RAW, self._dmesg), (_JMONO, self._jmono), (_DMESG, self._dmesg),
                        (_DMESG_T, self._dmesg_t), (_JSHORT, self._jshort), (_JISO, self._jiso)]

    def _wall(self, y, mo, d, h, mi, s, frac, tz) -> int:
        secs = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
        if tz is not None:
            secs -= int(dt.datetime(y, mo, d, h, mi, s, tzinfo=tz).utcoffset().total_seconds())
        return secs * 1_000_000_000 + _frac_ns(frac)

    def parse(self, line: str):
        """(ts_mono_ns, ts_utc_ns, host, message, kmsg?) for a kernel line; None for a line of no
        known format; False for a line to drop (another program's journal line)."""
        for rx, fn in self.formats:
            m = rx.match(line)
            if m:
                return fn(m)
        return None

    def _kmsg(self, m):
        return int(m[2]) * 1000, None, None, m[3], True

    def _dmesg(self, m):
        return _mono(m[1], m[2]), None, None, m[3], False

    def _jmono(self, m):
        return _mono(m[1], m[2]), None, m[3], m[4], False

    def _dmesg_t(self, m):
        utc = self._wall(int(m[6]), _MONTH[m[1]], int(m[2]), int(m[3]), int(m[4]), int(m[5]), None, self.tz)
        return None, utc, None, m[7], False

    def _jshort(self, m):
        if m[8] != "kernel":
            return False
        month = _MONTH[m[1]]
        if month < self.last_month:      # no year in this format: Dec -> Jan means the next year
            self.year += 1
        self.last_month = month
        utc = self._wall(self.year, month, int(m[2]), int(m[3]), int(m[4]), int(m[5]), m[6], self.tz)
        return None, utc, m[7], m[9], False

    def _jiso(self, m):
        if m[10] != "kernel":
            return False
        off = m[8].replace(":", "")
        tz = dt.timezone.utc if off == "Z" else dt.timezone(
            (-1 if off[0] == "-" else 1) * dt.timedelta(hours=int(off[1:3]), minutes=int(off[3:5])))
        utc = self._wall(*(int(m[i]) for i in range(1, 7)), m[7], tz)
        return None, utc, m[9], m[11], False


def _check_text(path: str, head: bytes) -> None:
    """Refuse a file that is not text, before reading it line by line."""
    if head.startswith(b"\x1f\x8b") or head.startswith(b"\x28\xb5\x2f\xfd") or head.startswith(b"\xfd7zXZ"):
        raise KernelLogError(f"{path}: compressed file, not a text kernel log (decompress it first)")
    control = sum(1 for b in head if b < 9 or 13 < b < 32 and b != 27)
    if b"\0" in head or control > len(head) // 20:
        raise KernelLogError(f"{path}: binary file, not a text kernel log (dmesg or journalctl -k output)")


def read_kernel_log(path: str, year: int | None = None, tz: dt.tzinfo | str | None = None) -> pa.Table:
    """Rows of a dmesg / journalctl kernel log (LOG_SCHEMA), in file order. The format is detected
    per line; a line of no known format is kept with null timestamps (a continuation, or pasted
    text), blank lines and journalctl's "-- ... --" markers are skipped, and another program's
    journal lines are dropped. `year` is that of the first line of journalctl's default format
    (default: this year); `tz` the zone of `dmesg -T` / journalctl's local times (default: UTC)."""
    try:
        fd, size = open_regular(path)     # not a FIFO (it would block) nor /dev/zero (it never ends)
    except NotAFile as exc:
        raise KernelLogError(f"{path}: cannot read kernel log ({exc})") from None
    except OSError as exc:
        raise KernelLogError(f"{path}: cannot read kernel log ({exc.strerror or exc})") from None
    if size > LOG_MAX_BYTES:
        os.close(fd)
        raise KernelLogError(f"{path}: larger than {LOG_MAX_BYTES >> 20} MiB; give the lines of the incident "
                             "(journalctl -k --since ... --until ...)")
    parser = _Parser(year, tz)
    mono, utc, host, msg = [], [], [], []
    kernel_lines, prev_kmsg = 0, False
    try:
        with open(fd, encoding="utf-8", errors="replace") as f:
            _check_text(path, os.pread(fd, 8192, 0))
            for line in f:
                line = line.rstrip("\r\n")
                if "\x1b" in line:
                    line = _ANSI.sub("", line)
                if not line.strip() or _JOURNAL_MARK.match(line) or (prev_kmsg and _KMSG_DICT.match(line)):
                    continue
                row = parser.parse(line)
                if row is False:
                    continue
                if row is None:
                    row, prev_kmsg = (None, None, None, line), False
                else:
                    kernel_lines += 1
                    prev_kmsg = row[4]
                mono.append(row[0])
                utc.append(row[1])
                host.append(row[2])
                msg.append(row[3])
    except OSError as exc:
        raise KernelLogError(f"{path}: cannot read kernel log ({exc.strerror or exc})") from None
    if not kernel_lines:
        raise KernelLogError(f"no kernel log lines found in {path}")
    return pa.Table.from_arrays([pa.array(mono, pa.int64()), pa.array(utc, pa.int64()),
                                 pa.array(host, pa.string()), pa.array(msg, pa.string())], schema=LOG_SCHEMA)


# ---- fingerprints -------------------------------------------------------------------------------

# The recognizers, first match wins; named groups fill the columns of the same name.
EVENTS = [
    ("not_responding", re.compile(r"(?:nfs|lockd): server (?P<server>\S+) not responding, still trying")),
    ("timed_out", re.compile(r"(?:nfs|lockd): server (?P<server>\S+) not responding, timed out")),
    ("responding", re.compile(r"(?:nfs|lockd): server (?P<server>\S+) OK\b")),
    # the task name (comm) may itself hold a colon: "kworker/u16:2:1234"
    ("hung_task", re.compile(r"INFO: task (?P<task>.+):(?P<pid>\d+) blocked for more than (?P<blocked_s>\d+) seconds")),
    # other sunrpc/NFS lines: "RPC: ...", "NFS: ...", "NFSD: ...", "lockd: ...", "xs_tcp_setup_socket: ..."
    ("rpc_error", re.compile(r"(?:RPC|NFS\w*|nfs\w*|lockd|sunrpc|svc\w*|xs_\w+|rpc\w*)(?:\[\d+\])?:")),
]
_NFS_FUNCTION = re.compile(r"nfs|rpc|xprt|lockd", re.I)
_NFS_MODULES = re.compile(r"nfs\w*|sunrpc|lockd|rpcsec\w*")


def fingerprints(messages: pa.Table) -> pa.Table:
    """One row per recognized event (FINGERPRINT_SCHEMA) in a table with a `message` column and
    optionally ts_mono_ns (or the kmsg table's `ts`), ts_utc_ns and host. A hung_task row collects
    the frames of the call trace after it (per host, as merged logs interleave); `nfs_related` says
    whether they show NFS/sunrpc, null when no frame was seen. Other kinds are NFS by definition."""
    names, n = messages.column_names, messages.num_rows

    def col(*candidates):
        for c in candidates:
            if c in names:
                return messages.column(c).to_pylist()
        return [None] * n

    mono, utc, host, msg = col("ts_mono_ns", "ts"), col("ts_utc_ns"), col("host"), col("message")
    rows: list[dict] = []
    open_report: dict = {}        # host -> the hung_task row still collecting frames
    for i in range(n):
        text = msg[i] or ""
        report = open_report.get(host[i])
        if report is not None:
            frame = FRAME.match(text)
            if frame:
                report["functions"].append(frame["fn"])
                report["nfs_related"] |= bool(_NFS_FUNCTION.search(frame["fn"])
                                              or (frame["mod"] and _NFS_MODULES.fullmatch(frame["mod"])))
                continue
            if REPORT_LINE.match(text):
                continue
            del open_report[host[i]]
        stripped = text.lstrip()
        for kind, rx in EVENTS:
            m = rx.match(stripped)
            if m:
                g = m.groupdict()
                row = {"ts_mono_ns": mono[i], "ts_utc_ns": utc[i], "host": host[i], "kind": kind,
                       "server": g.get("server"), "task": g.get("task"),
                       "pid": int(g["pid"]) if "pid" in g else None,
                       "blocked_s": int(g["blocked_s"]) if "blocked_s" in g else None,
                       "functions": None, "nfs_related": True, "message": text}
                if kind == "hung_task":
                    row["functions"], row["nfs_related"] = [], False
                    open_report[host[i]] = row
                rows.append(row)
                break
    for row in rows:
        if row["kind"] == "hung_task" and not row["functions"]:
            row["functions"] = row["nfs_related"] = None   # no trace seen: unknown
    return pa.Table.from_pylist(rows, schema=FINGERPRINT_SCHEMA)
