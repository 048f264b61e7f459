"""Fixtures every tier shares."""
from __future__ import annotations

import os
import shutil

import pytest

from terminal import Tmux


@pytest.fixture
def tmux(tmp_path):
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is not installed: dev.sh installs it (apt package tmux)")
        pytest.skip("tmux is not installed (dev.sh installs it)")
    return Tmux(tmp_path)
