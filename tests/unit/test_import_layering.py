"""Import hygiene (as harlequin tests it): the analyzer never imports bcc or textual, the TUI
never imports bcc, and the agent imports bcc only when probes load. Each check runs in a
fresh interpreter so nothing imported by other tests hides a violation."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _modules_loaded_after(code: str) -> dict:
    """Run code in a fresh interpreter; return {'imported': [...], 'loaded': sorted(sys.modules)}."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print(json.dumps({"imported": IMPORTED, "loaded": sorted(sys.modules)}))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _heavy(loaded: list[str], roots: tuple[str, ...]) -> list[str]:
    return [m for m in loaded if m.split(".")[0] in roots]


IMPORT_PACKAGE = """
    import importlib, pkgutil
    import {pkg} as _pkg
    IMPORTED = []
    for info in pkgutil.iter_modules(_pkg.__path__):
        IMPORTED.append(importlib.import_module("{pkg}." + info.name).__name__)
"""


def test_analyzer_imports_neither_bcc_nor_textual():
    out = _modules_loaded_after(IMPORT_PACKAGE.format(pkg="slotscope.analyzer"))
    modules = {p.stem for p in (REPO / "analyzer").glob("*.py") if p.stem != "__init__"}
    assert {m.rsplit(".", 1)[1] for m in out["imported"]} == modules, "not every analyzer module was imported"
    assert _heavy(out["loaded"], ("bcc", "textual")) == []


def test_tui_does_not_import_bcc():
    out = _modules_loaded_after(IMPORT_PACKAGE.format(pkg="slotscope.tui"))
    modules = {p.stem for p in (REPO / "tui").glob("*.py") if p.stem != "__init__"}
    assert {m.rsplit(".", 1)[1] for m in out["imported"]} == modules
    assert _heavy(out["loaded"], ("bcc",)) == []


AGENT_MODULES = ("cli", "layouts", "capture_writer", "decode", "files", "identity", "recorder",
                 "mounts", "tables", "meta", "probes", "ringbuf", "kernel")


def test_agent_modules_do_not_import_bcc_or_textual_at_import_time():
    code = "import importlib\nIMPORTED = [importlib.import_module('slotscope.agent.' + m).__name__ for m in %r]\n" \
        % (AGENT_MODULES,)
    out = _modules_loaded_after(code)
    assert len(out["imported"]) == len(AGENT_MODULES)
    assert _heavy(out["loaded"], ("bcc", "textual")) == []


def test_analyze_command_runs_without_bcc_or_textual(build_capture):
    from unit_helpers import proc, sc
    path = build_capture(syscalls=[sc(10, "write", 100, 4096)], procs=[proc(10, rank=0)])
    code = f"""
        import contextlib, io
        from slotscope.agent.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            rc = main(["analyze", "--json", {path!r}])
        assert rc == 0, rc
        assert '"bytes_written": 4096' in out.getvalue()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["dump", {path!r}, "-t", "syscall", "-O", "json"]) == 0
        IMPORTED = []
    """
    out = _modules_loaded_after(code)
    assert _heavy(out["loaded"], ("bcc", "textual")) == []


_BCC_IMPORT = re.compile(r"^\s*(import\s+bcc\b|from\s+bcc\b)", re.M)
_TEXTUAL_IMPORT = re.compile(r"^\s*(import\s+textual\b|from\s+textual\b)", re.M)


def _python_files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def test_no_bcc_import_in_analyzer_or_tui_sources():
    files = _python_files("analyzer") + _python_files("tui")
    assert files, "no sources found: is REPO right?"
    offenders = [str(p.relative_to(REPO)) for p in files if _BCC_IMPORT.search(p.read_text())]
    assert offenders == []


def test_no_textual_import_in_analyzer_sources():
    offenders = [str(p.relative_to(REPO)) for p in _python_files("analyzer") if _TEXTUAL_IMPORT.search(p.read_text())]
    assert offenders == []


def test_bcc_is_imported_only_inside_functions_in_the_agent():
    """In agent/, an import of bcc is indented (inside a function), never at module level."""
    offenders = []
    for p in _python_files("agent"):
        for m in re.finditer(r"^(import\s+bcc\b|from\s+bcc\b)", p.read_text(), re.M):
            offenders.append(f"{p.relative_to(REPO)}: {m.group(0)}")
    assert offenders == []


def test_static_check_catches_a_violation():
    """The regexes above do find the forms they look for."""
    assert _BCC_IMPORT.search("x = 1\nfrom bcc import BPF\n")
    assert _BCC_IMPORT.search("def f():\n    import bcc\n")
    assert not _BCC_IMPORT.search("import bccx\n# from the bcc docs\n")
    assert _TEXTUAL_IMPORT.search("from textual.app import App\n")
