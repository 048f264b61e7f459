"""bench/overhead.py's figure: each agent block against the baseline blocks around it, so that
a drifting machine speed does not pass for the agent's cost, and an interval that decides."""
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location(
    "overhead", Path(__file__).resolve().parents[2] / "bench" / "overhead.py")
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)


def rounds(baselines, agent_factors, repeat=1):
    """Rows as summarize() builds them: baseline block K at baselines[K-1] bytes/s, agent block
    K at the midpoint of its neighbours times its factor (a machine speeding up linearly)."""
    rows = []
    for k, base in enumerate(baselines, 1):
        rows += [{"label": f"base-{k}.{j}", "agent": False, "bytes_per_s": base} for j in range(1, repeat + 1)]
        if k <= len(agent_factors):
            mid = (base + baselines[k]) / 2
            rows += [{"label": f"agent-{k}.{j}", "agent": True, "bytes_per_s": mid * agent_factors[k - 1]}
                     for j in range(1, repeat + 1)]
    return rows


def test_a_steady_drift_cancels():
    # Pooled means would give 0.95 * mean(110..170) / mean(100..180), not 0.95.
    ratios = overhead.block_ratios(rounds([100, 120, 140, 160, 180], [0.95] * 4, repeat=2))
    assert ratios == pytest.approx([0.95] * 4)


def test_the_interval_decides_only_when_it_excludes_the_goal():
    close = overhead.log_interval([0.99, 0.985, 0.995, 0.99])
    assert overhead.GOAL < close[0] < 0.99 < close[1]
    wide = overhead.log_interval([0.90, 1.05, 0.93, 1.02])
    assert wide[0] < overhead.GOAL < wide[1]
    assert overhead.log_interval([0.9]) is None
