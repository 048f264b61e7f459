"""A regular (non-editable) wheel carries the C programs, the packages under the one
`slotscope` namespace and the console script: an editable install hides missing package data."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
NEEDED_SETUPTOOLS = 77    # pyproject.toml: requires = ["setuptools>=77"] (license = "Apache-2.0" form)


def _setuptools_major() -> int | None:
    try:
        return int(version("setuptools").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def _pip_available() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def _source_copy(dest: Path) -> Path:
    """The project without venv, VCS and build output, so the build writes nothing into the repo."""
    ignore = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", "tests", "bench")
    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    major = _setuptools_major()
    if major is None or major < NEEDED_SETUPTOOLS:
        pytest.skip(f"the test venv has setuptools {version('setuptools') if major else 'missing'}; "
                    f"building without isolation needs setuptools>={NEEDED_SETUPTOOLS} "
                    f"(pip install 'setuptools>={NEEDED_SETUPTOOLS}' into the venv)")
    if not _pip_available():
        pytest.skip("pip is not available in this interpreter")
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp / "src")
    out = tmp / "dist"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    [whl] = out.glob("slotscope-*.whl")
    return whl


def test_wheel_contains_code_and_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("slotscope/bpf/syscalls.c", "slotscope/bpf/__init__.py", "slotscope/cli/main.py",
                   "slotscope/agent/layouts.py", "slotscope/capture/reader.py", "slotscope/tui/__init__.py",
                   "slotscope/analyzer/report.css"):
        assert needed in names, needed
    assert {n.split("/")[0] for n in names if not n.startswith("slotscope-")} == {"slotscope"}, \
        "only the slotscope namespace may land in site-packages (no top-level agent/, tui/...)"
    # the sample capture `slotscope demo --sample` analyses ships whole
    sample = REPO / "analyzer" / "sample"
    for f in sample.rglob("*"):
        if f.is_file():
            assert f"slotscope/analyzer/sample/{f.relative_to(sample)}" in names, f
    # every C source and header of bpf/ is shipped
    for c in (REPO / "bpf").iterdir():
        if c.suffix in (".c", ".h"):
            assert f"slotscope/bpf/{c.name}" in names, c.name


def test_wheel_declares_the_console_script(wheel):
    zf = zipfile.ZipFile(wheel)
    [ep] = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = zf.read(ep).decode()
    assert "[console_scripts]" in text
    assert any(line.replace(" ", "") == "slotscope=slotscope.cli.main:main" for line in text.splitlines())


def test_installed_wheel_reads_its_c_program(wheel, tmp_path):
    """Unpacked like site-packages, the package finds syscalls.c through importlib.resources."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import importlib.resources as r, slotscope.bpf, slotscope.cli.main as cli;"
            "t = r.files('slotscope.bpf').joinpath('syscalls.c').read_text();"
            "print(slotscope.bpf.__file__); print(len(t))")
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONNOUSERSITE="1")
    res = subprocess.run([sys.executable, "-S", "-c", "import site; site.main(); " + code],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    where, size = res.stdout.split()
    assert where.startswith(str(site)), f"imported {where}, not the unpacked wheel"
    assert int(size) == (REPO / "bpf" / "syscalls.c").stat().st_size
