"""One vocabulary, read from the sources' syntax trees: the syscall groups are declared in
capture/syscalls.py only (a second list of syscall names drifts from the first when a call is
added to the probes), and durations, rates and times of day are formatted in analyzer/units.py
only (a copy in one output drifts from the others)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from slotscope.capture.syscalls import OPS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GROUPS_HOME = REPO / "capture" / "syscalls.py"


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def syscall_lists(source: str) -> list[tuple[int, list[str]]]:
    """(line, names) of every tuple, list or set literal, or dict display, naming two or more
    traced syscalls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = node.keys
        else:
            continue
        names = [i.value for i in items if isinstance(i, ast.Constant) and i.value in OPS]
        if len(names) >= 2:
            found.append((node.lineno, names))
    return sorted(found)


def test_each_syscall_group_is_declared_once():
    files = [p for p in _sources("agent", "analyzer", "tui", "cli", "capture") if p != GROUPS_HOME]
    assert len(files) > 50, "too few sources found: is REPO right?"
    offenders = [f"{p.relative_to(REPO)}:{line} {names}" for p in files for line, names in syscall_lists(p.read_text())]
    assert offenders == []


def test_syscall_list_check_finds_the_forms_it_looks_for():
    assert syscall_lists('if op in ("newfstatat", "statx"):\n    pass\n') == [(1, ["newfstatat", "statx"])]
    assert syscall_lists('COLOURS = {"write": "#1f77b4", "close": "#ff7f0e"}\n') == [(1, ["write", "close"])]
    assert syscall_lists('x = frozenset({"fsync", "fdatasync"})\ny = ["rename", "unlink"]\n') == [
        (1, ["fsync", "fdatasync"]), (2, ["rename", "unlink"])]
    # one name, or names that are not syscalls, are not a group
    assert syscall_lists('a = ("write",)\nb = ("WRITE", "COMMIT")\nc = calls["fsync"]\n') == []
    # and the declarations themselves are found where they are allowed to be
    assert len(syscall_lists(GROUPS_HOME.read_text())) >= 5


# --- formatters -----------------------------------------------------------------------------

UNITS = REPO / "analyzer" / "units.py"
SCALES = (1e3, 1e6, 1e9)                  # ns -> us/ms/s, b/s -> kb/s, Mb/s, Gb/s
RATE_UNITS = ("kb/s", "Mb/s", "Gb/s")


def _scale(node: ast.AST) -> bool:
    """`x / 1e6`, `x / 1_000_000_000`..."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
            and isinstance(node.right.value, (int, float)) and node.right.value in SCALES)


def unit_formatting(source: str) -> list[tuple[int, str]]:
    """(line, what) of each place that formats a quantity in a unit of its own: an f-string
    field holding a value scaled to ms/s or kb/s..Gb/s, a rate unit's name, or a time of day
    built from seconds (`// 3600`), a strftime clock ('%H:%M:%S') or an ISO time's clock slice."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FormattedValue) and _scale(node.value):
            found.append((node.lineno, "a scaled value in an f-string"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(u in node.value for u in RATE_UNITS):
                found.append((node.lineno, f"a rate unit: {node.value!r}"))
            if "%H:%M:%S" in node.value:
                found.append((node.lineno, f"a strftime clock: {node.value!r}"))
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv)
              and isinstance(node.right, ast.Constant) and node.right.value == 3600):
            found.append((node.lineno, "hours from seconds"))
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)
              and isinstance(node.slice.lower, ast.Constant) and node.slice.lower.value == 11
              and isinstance(node.slice.upper, ast.Constant)):
            found.append((node.lineno, "an ISO time's clock"))
    return sorted(found)


def test_each_formatter_is_defined_once():
    """Durations, rates and times of day read the same in the terminal report, the HTML report
    and the TUI: analyzer/units.py formats them, nothing else in the analyzer or the TUI does."""
    files = [p for p in _sources("analyzer", "tui") if p != UNITS]
    assert len(files) > 20, "too few sources found: is REPO right?"
    offenders = [f"{p.relative_to(REPO)}:{line} {what}" for p in files for line, what in unit_formatting(p.read_text())]
    assert offenders == []


def test_formatter_check_finds_the_copies_it_replaced():
    """Each formatter units.py replaced, as it was written, is found."""
    copies = {
        "report_text _ms": 'def _ms(ns):\n    return "-" if ns is None else f"{ns / 1e6:,.1f}"\n',
        "tui secs": 'def secs(ns, digits=1):\n    return "-" if ns is None else f"{ns / 1e9:,.{digits}f} s"\n',
        "report_html _rate": ('def _rate(bps):\n    for div, unit in ((1e9, "Gb/s"), (1e6, "Mb/s"), (1e3, "kb/s")):\n'
                              '        if abs(bps) >= div:\n            return f"{bps / div:g} {unit}"\n'),
        "link speed": 'speed = f"{link[\'speed_bps\'] / 1e9:g} Gb/s"\n',
        "report_text _clock": 'def _clock(iso):\n    return iso[11:23] if iso else "?"\n',
        "tui _clock": 'def _clock(t):\n    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")\n',
        "HTML tick clock": 'def clock(v):\n    whole = int(v)\n    return f"{whole // 3600:02d}:{whole % 3600 // 60:02d}"\n',
    }
    for name, code in copies.items():
        assert unit_formatting(code), name
    # what is not a unit's formatting: plain arithmetic, an axis in seconds, a date
    assert unit_formatting('x = (ns - origin) / 1e9\ny = f"{n:,} RPCs"\nday = when.strftime("%Y-%m-%d")\n') == []
    # and units.py itself is where they are
    assert len(unit_formatting(UNITS.read_text())) >= 4
