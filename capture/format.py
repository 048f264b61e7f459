"""The capture directory's names and version marks (DESIGN.md, capture format).

A capture is a directory with meta.json and one folder per table holding finished
Arrow IPC segments (000001.arrow, ...). The segment being written is a dotfile,
.NNNNNN.arrow.partial, renamed when closed. Each table's schema carries
`slotscope.schema = "<table>/<major>"`; each table folder's .checksums has each finished
segment's size and CRC-32.
"""
from __future__ import annotations

import re

FORMAT_NAME = "slotscope-capture"      # meta.json "format"
FORMAT_MAJOR = 1                       # meta.json "schema_version" this code writes and reads
# meta.json "format_minor": 1 adds each table folder's CHECKSUMS, a line per finished segment
# ("NNNNNN.arrow SIZE CRC32"); captures without it (minor 0) read as not verified.
FORMAT_MINOR = 1
CHECKSUMS = ".checksums"
META_FILE = "meta.json"
SCHEMA_KEY = b"slotscope.schema"
SEGMENT_RE = re.compile(r"^(\d{6})\.arrow$")
PARTIAL_RE = re.compile(r"^\.(\d{6})\.arrow\.partial$")
ARROW_MAGIC = b"ARROW1"


def segment_name(seq: int) -> str:
    return f"{seq:06d}.arrow"


def partial_name(seq: int) -> str:
    return f".{seq:06d}.arrow.partial"


def schema_tag(table: str, major: int) -> dict[bytes, bytes]:
    return {SCHEMA_KEY: f"{table}/{major}".encode()}
