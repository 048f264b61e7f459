"""Import hygiene. The package arrows, read from every module's imports (the AST, imports
inside functions included): cli -> agent, analyzer, tui, capture; agent -> capture;
analyzer -> capture; tui -> analyzer, capture; capture -> nothing. And which heavy modules
load (as harlequin tests it): the analyzer never imports bcc or textual, the TUI never imports
bcc, and the agent imports bcc only when probes load; each of these checks runs in a fresh
interpreter so nothing imported by other tests hides a violation."""
from __future__ import annotations

import ast
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
        if info.name == "__main__":      # running it is the command itself
            continue
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


def _package_modules(folder: str) -> set[str]:
    return {p.stem for p in (REPO / folder).glob("*.py") if p.stem not in ("__init__", "__main__")}


@pytest.mark.parametrize("pkg", ["agent", "capture", "cli"])
def test_headless_packages_do_not_import_bcc_or_textual_at_import_time(pkg):
    """Every module of the agent, the format and the front door imports without bcc or textual:
    they load bcc only when probes load, textual only when a screen opens."""
    out = _modules_loaded_after(IMPORT_PACKAGE.format(pkg=f"slotscope.{pkg}"))
    assert {m.rsplit(".", 1)[1] for m in out["imported"]} == _package_modules(pkg)
    assert _heavy(out["loaded"], ("bcc", "textual")) == []


# --- the package arrows --------------------------------------------------------------------

PACKAGES = ("capture", "agent", "analyzer", "tui", "cli", "bpf")
ALLOWED = {
    "cli": {"agent", "analyzer", "tui", "capture"},
    "agent": {"capture", "bpf"},      # bpf/ only as text: the C programs it loads
    "analyzer": {"capture"},
    "tui": {"analyzer", "capture"},
    "capture": set(),
    "bpf": set(),
}


def slotscope_imports(source: str, package: str) -> set[str]:
    """The slotscope packages a module of `package` imports, anywhere in it: absolute
    (`slotscope.X...`), relative (`from ..X import`), and module-level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [f"slotscope.{package}"]
            elif node.level >= 2:
                base = node.module or ""
                names = [f"slotscope.{base}" if base else f"slotscope.{a.name}" for a in node.names]
            else:
                mod = node.module or ""
                names = [f"{mod}.{a.name}" for a in node.names] if mod == "slotscope" else [mod]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "slotscope" and len(parts) > 1:
                found.add(parts[1])
    return found


def _resources_packages(source: str) -> set[str]:
    """Packages named as data: importlib.resources.files("slotscope.X")."""
    return set(re.findall(r'files\("slotscope\.(\w+)"\)', source))


def test_every_module_follows_the_package_arrows():
    checked, offenders = 0, []
    for pkg in PACKAGES:
        for path in _python_files(pkg):
            source = path.read_text()
            used = slotscope_imports(source, pkg) | _resources_packages(source)
            bad = sorted(used - ALLOWED[pkg] - {pkg})
            if bad:
                offenders.append(f"{path.relative_to(REPO)} imports {', '.join(bad)}")
            checked += 1
    assert checked > 50, "too few modules found: is REPO right?"
    assert offenders == []


def test_arrow_check_sees_every_form_of_import():
    """The reader finds imports inside functions, relative ones and `from slotscope import X`."""
    source = textwrap.dedent("""
        import os
        from slotscope.capture import format
        from . import sibling
        from ..tui.app import run
        def later():
            import slotscope.agent.recorder
            from slotscope import cli
    """)
    assert slotscope_imports(source, "analyzer") == {"capture", "analyzer", "tui", "agent", "cli"}
    assert _resources_packages('files("slotscope.bpf").joinpath("x.c")') == {"bpf"}


def test_analyze_command_runs_without_bcc_or_textual(build_capture):
    from unit_helpers import proc, sc
    path = build_capture(syscalls=[sc(10, "write", 100, 4096)], procs=[proc(10, rank=0)])
    code = f"""
        import contextlib, io
        from slotscope.cli.main import main
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
