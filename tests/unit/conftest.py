"""Fixtures of the unit tier (helpers live in unit_helpers.py). Everything writes under
pytest's tmp_path and needs no root and no BCC."""
from __future__ import annotations

import pytest

from slotscope.capture.writer import CaptureWriter

from unit_helpers import loss_table, meta, procs_table, syscall_table


@pytest.fixture
def build_capture(tmp_path):
    """build_capture(name, host=, syscalls=[rows], procs=[rows], loss=[rows], meta_override=dict) -> path.

    Written by the real CaptureWriter; each non-empty table becomes one finished segment."""
    def build(name: str = "cap", *, host: str = "node-a", syscalls=(), procs=(), loss=(),
              meta_override: dict | None = None) -> str:
        path = str(tmp_path / name)
        w = CaptureWriter(path)
        w.write_meta(meta_override if meta_override is not None else meta(host))
        if syscalls:
            w.append("syscall", syscall_table(list(syscalls)))
        if procs:
            w.append("procs", procs_table(list(procs)))
        if loss:
            w.append("loss", loss_table(list(loss)))
        w.close()
        return path
    return build

