"""meta.json: what a reader needs to interpret the tables (DESIGN.md, capture format).
The agent fills it in (agent/meta.py collects the machine's facts); this module says what
makes it a capture's, reads it, and interprets its clock pairs."""
from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version

from .format import FORMAT_MAJOR, FORMAT_NAME, META_FILE


class CaptureError(Exception):
    """A capture that cannot be read at all; the message says why."""


def slotscope_version() -> str:
    try:
        return version("slotscope")
    except PackageNotFoundError:
        return "0+unknown"


def new_meta() -> dict:
    """The keys that make a meta.json a capture's, at this format version."""
    return {"format": FORMAT_NAME, "schema_version": FORMAT_MAJOR}


def read_meta(path: str) -> dict:
    """The meta.json of the capture directory `path`, checked: a CaptureError says what is wrong."""
    meta_path = os.path.join(path, META_FILE)
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
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise CaptureError(f"{meta_path}: not a slotscope capture's meta.json")
    major = meta.get("schema_version", 0)
    if not isinstance(major, int) or major > FORMAT_MAJOR:
        raise CaptureError(f"{path}: capture format version {major} is newer than this slotscope "
                           f"reads ({FORMAT_MAJOR}): upgrade slotscope")
    return meta


def start_ns(meta: dict) -> int:
    """The capture's start on its host's CLOCK_MONOTONIC, the zero of its time axis."""
    return int((meta.get("start") or {}).get("monotonic_ns") or 0)


def utc_offset_ns(meta: dict) -> int:
    """What to add to the capture's CLOCK_MONOTONIC times to get UTC (its start clock pair)."""
    pair = meta.get("start") or {}
    if "realtime_ns" not in pair or "monotonic_ns" not in pair:
        return 0
    return int(pair["realtime_ns"]) - int(pair["monotonic_ns"])
