"""meta.json: what a reader needs to interpret the tables (DESIGN.md, capture format).
The agent fills it in (agent/meta.py collects the machine's facts); this module says what
makes it a capture's, declares the shape readers rely on, reads and checks it, and interprets
its clock pairs."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from .files import NotAFile, read_capped, why
from .format import FORMAT_MAJOR, FORMAT_MINOR, FORMAT_NAME, META_FILE

META_MAX_BYTES = 32 << 20      # the largest meta.json read (mountstats of a few thousand mounts fit)


class CaptureError(Exception):
    """A capture that cannot be read at all; the message says why."""


def slotscope_version() -> str:
    try:
        return version("slotscope")
    except PackageNotFoundError:
        return "0+unknown"


def new_meta() -> dict:
    """The keys that make a meta.json a capture's, at this format version."""
    return {"format": FORMAT_NAME, "schema_version": FORMAT_MAJOR, "format_minor": FORMAT_MINOR}


# ---- the shape readers rely on ----------------------------------------------------------------
# A leaf is a type or a tuple of them (None: null allowed); a dict is an object with those keys
# (each optional; others are welcome); ListOf and MapOf are arrays and string-keyed objects.

class Int:
    """An integer that fits int64 (not a bool, which Python counts as one)."""


class Ns:
    """Nanoseconds of a clock that counts from 0 (CLOCK_MONOTONIC, CLOCK_REALTIME since 1970) in
    int64: so the difference of a pair fits too."""


class Decimal:
    """A non-negative integer written as text, as the kernel prints mount options and sysctls."""


@dataclass(frozen=True)
class ListOf:
    item: object


@dataclass(frozen=True)
class MapOf:
    value: object


CLOCK_PAIR = {"monotonic_ns": Ns, "realtime_ns": Ns, "uncertainty_ns": Ns}
CLOCK_SYNC = {"synchronized": bool, "esterror_ns": Ns, "maxerror_ns": Ns}    # adjtimex at the start
MOUNT = {"mountpoint": str, "source": str, "fstype": str, "dev": Int, "vers": (str, None), "proto": (str, None),
         "nconnect": (Decimal, None), "wsize": (Decimal, None), "rsize": (Decimal, None), "hard": bool,
         "timeo": (Decimal, None), "retrans": (Decimal, None), "server": (str, None), "options": str}
SHAPE = {
    "format": str, "schema_version": Int, "format_minor": Int, "slotscope_version": str,
    "host": str, "boot_id": (str, None), "kernel": str, "command": str, "agent_pid": Int,
    "start": CLOCK_PAIR, "stop": CLOCK_PAIR, "clock_sync": CLOCK_SYNC, "stop_reason": str,
    "filters": dict, "probes": dict, "totals": dict,
    "nfs_mounts": ListOf(MOUNT), "sunrpc": MapOf((Decimal, None)),
    "mountstats_start": MapOf(str), "mountstats_stop": MapOf(str),
    "nics": ListOf({"name": str, "speed_mbps": (Int, None)}),
}
_NAMES = {Int: "an integer", Ns: "a count of nanoseconds", Decimal: "a decimal number as text", str: "a string", bool: "true or false",
          dict: "an object", None: "null"}


def _is(value, leaf) -> bool:
    if leaf is None:
        return value is None
    if leaf is Int:
        return type(value) is int and -2**63 <= value < 2**63
    if leaf is Ns:
        return type(value) is int and 0 <= value < 2**63
    if leaf is Decimal:
        return isinstance(value, str) and value.isascii() and value.isdigit()
    return isinstance(value, leaf)


def _wanted(shape) -> str:
    if isinstance(shape, (dict, MapOf)):
        return "an object"
    if isinstance(shape, ListOf):
        return "a list"
    return " or ".join(_NAMES[t] for t in (shape if isinstance(shape, tuple) else (shape,)))


def _mismatch(value, shape, where: str) -> str | None:
    """The first place where `value` is not of `shape`: 'where is X, not Y'; None if it is."""
    if isinstance(shape, dict) and isinstance(value, dict):
        return next((m for key, sub in shape.items() if key in value
                     if (m := _mismatch(value[key], sub, f"{where}.{key}"))), None)
    if isinstance(shape, MapOf) and isinstance(value, dict):
        return next((m for key, v in value.items() if (m := _mismatch(v, shape.value, f"{where}.{key}"))), None)
    if isinstance(shape, ListOf) and isinstance(value, list):
        return next((m for i, v in enumerate(value) if (m := _mismatch(v, shape.item, f"{where}[{i}]"))), None)
    if not isinstance(shape, (dict, MapOf, ListOf)) and any(_is(value, t) for t in
                                                              (shape if isinstance(shape, tuple) else (shape,))):
        return None
    shown = json.dumps(value)
    return f"{where} is {shown if len(shown) <= 40 else shown[:37] + '...'}, not {_wanted(shape)}"


def check_meta(meta, where: str) -> tuple[dict, list[str]]:
    """meta.json's content checked against SHAPE: (what readers may use, one line per key left
    out). CaptureError when it is not a capture's meta.json of a version this slotscope reads."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise CaptureError(f"{where}: not a slotscope capture's meta.json")
    major = meta.get("schema_version")
    if major is None:
        raise CaptureError(f"{where}: no schema_version, not a capture this slotscope can read")
    if not _is(major, Int) or major < 1:
        raise CaptureError(f"{where}: schema_version {json.dumps(major)[:40]} is not a capture format version "
                           f"(a positive integer)")
    if major > FORMAT_MAJOR:
        raise CaptureError(f"{where}: capture format version {major} is newer than this slotscope "
                           f"reads ({FORMAT_MAJOR}): upgrade slotscope")
    kept, problems = {}, []
    for key, value in meta.items():
        wrong = _mismatch(value, SHAPE[key], key) if key in SHAPE else None
        if wrong:
            problems.append(f"{META_FILE}: {wrong}: '{key}' ignored")
        else:
            kept[key] = value
    return kept, problems


def read_meta(path: str) -> tuple[dict, list[str]]:
    """The meta.json of the capture directory `path`, checked (check_meta): (meta, problems).
    A CaptureError says what is wrong when there is no usable one."""
    meta_path = os.path.join(path, META_FILE)
    try:
        data = read_capped(meta_path, META_MAX_BYTES, follow=False)
    except FileNotFoundError:
        try:
            empty = not os.listdir(path)
        except OSError as exc:
            raise CaptureError(f"{path}: {why(exc)}") from None
        raise CaptureError(f"{path}: empty directory, not a capture" if empty
                           else f"{path}: no meta.json, not a slotscope capture") from None
    except (OSError, NotAFile) as exc:
        raise CaptureError(f"{meta_path}: {why(exc)}") from None
    try:
        meta = json.loads(data)
    except RecursionError:
        raise CaptureError(f"{meta_path}: unreadable (nested too deeply)") from None
    except ValueError as exc:       # UnicodeDecodeError too
        raise CaptureError(f"{meta_path}: unreadable ({str(exc).splitlines()[0][:80]})") from None
    return check_meta(meta, meta_path)


def start_ns(meta: dict) -> int:
    """The capture's start on its host's CLOCK_MONOTONIC, the zero of its time axis."""
    return int((meta.get("start") or {}).get("monotonic_ns") or 0)


def clock_uncertainty(meta: dict) -> dict:
    """How closely the capture's UTC times line up with other hosts': whether its clock was
    synchronized at the start (adjtimex: clock_sync; None when not recorded) and the bound, its
    clock pair's spread plus the synchronization's estimated error (None unless synchronized)."""
    sync = meta.get("clock_sync") or {}
    pair = (meta.get("start") or {}).get("uncertainty_ns")
    synced = sync.get("synchronized")
    return {"synchronized": synced, "uncertainty_ns": pair + sync["esterror_ns"]
            if synced and pair is not None and "esterror_ns" in sync else None}


def utc_offset_ns(meta: dict) -> int:
    """What to add to the capture's CLOCK_MONOTONIC times to get UTC (its start clock pair)."""
    pair = meta.get("start") or {}
    if "realtime_ns" not in pair or "monotonic_ns" not in pair:
        return 0
    return int(pair["realtime_ns"]) - int(pair["monotonic_ns"])
