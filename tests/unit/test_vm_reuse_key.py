"""The VM rig reuses a stored run only when `source_key` is the same: the key must hash every
package the guest runs, so that no run made with an older writer or format is reused."""
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "vm"))
from vmrig.scenario import source_files  # noqa: E402


def test_the_reuse_key_covers_every_package_the_guest_runs():
    hashed = {f.relative_to(REPO) for f in source_files()}
    for pkg in ("cli", "agent", "capture", "bpf"):
        sources = [f.relative_to(REPO) for f in (REPO / pkg).iterdir() if f.suffix in (".py", ".c", ".h")]
        assert sources, pkg
        assert set(sources) <= hashed, pkg
    assert Path("pyproject.toml") in hashed and Path("tests/vm/guest/writer.py") in hashed
