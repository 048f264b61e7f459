"""Fixtures for the VM tier: the image is built (or found in the cache) once per session."""
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vmrig.image import ensure_image  # noqa: E402


@pytest.fixture(scope="session")
def vm_image():
    if os.geteuid() != 0:
        pytest.skip("the VM rig needs root (debootstrap, chroot, loop-free mkfs)")
    missing = [t for t in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4") if not shutil.which(t)]
    if missing:
        pytest.skip(f"the VM rig needs {', '.join(missing)} (apt-get install qemu-system-x86 debootstrap)")
    return ensure_image()
