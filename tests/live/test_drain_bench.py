"""Smoke test of bench/drain.py: it runs, every method gives figures, slotscope accounts for every event.

Figures are printed, not asserted: they depend on the machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "drain.py"


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (BPF)"
    from slotscope.agent import kernel
    if kernel.ensure_tracefs() is None:  # before bcc is imported
        return "tracefs is not mounted"
    err = kernel.bcc_import_error()
    return f"cannot import bcc: {err}" if err else None


@pytest.mark.live
@pytest.mark.timeout(150)
def test_drain_bench_quick():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    run = subprocess.run([sys.executable, str(BENCH), "--quick", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    results = {r["method"]: r for r in out["methods"]}
    for r in results.values():
        print(r["method"], {k: v for k, v in r.items() if k not in ("method", "label")})
    print("goal:", out["goal"])

    assert set(results) == {"none", "perf", "ringbuf", "slotscope"}
    for name, r in results.items():
        assert "error" not in r, f"{name}: {r.get('error')}"
        assert r["produced"] > 0 and r["producer_writes_per_s"] > 0
    for name in ("perf", "ringbuf", "slotscope"):
        assert results[name]["received"] > 0, name
    s = results["slotscope"]
    # Every produced event is either received or counted lost by the kernel.
    assert abs(s["received"] + s["kernel_lost"] - s["produced"]) <= 0.01 * s["produced"], s
