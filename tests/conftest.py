"""Fixtures every tier shares."""
from __future__ import annotations

import os
import shutil

import pytest

from terminal import Tmux


TIERS = ("unit", "live", "vm")


def pytest_collection_modifyitems(items):
    """The tiers in order, the quick one first: a broken unit test shows in minutes, and a whole
    run's VM images build in the background meanwhile (tests/vm/conftest.py)."""
    def tier(item):
        return next((i for i, name in enumerate(TIERS) if item.get_closest_marker(name)), len(TIERS))
    items.sort(key=tier)


@pytest.fixture
def tmux(tmp_path):
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is not installed: dev.sh installs it (apt package tmux)")
        pytest.skip("tmux is not installed (dev.sh installs it)")
    return Tmux(tmp_path)
