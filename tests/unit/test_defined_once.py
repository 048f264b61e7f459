"""One vocabulary: the syscall groups are declared in capture/syscalls.py only, read from the
sources' syntax trees (a second list of syscall names drifts from the first when a call is
added to the probes)."""
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
