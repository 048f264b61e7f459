"""watch's slow_save: the saves as they happen (analyzer/saves.SaveClock), fed drain by drain."""
import pyarrow as pa
import pytest

from slotscope.agent.conditions import slow_save
from slotscope.analyzer.saves import SaveClock

pytestmark = pytest.mark.unit
S = 1_000_000_000


def _calls(calls: list[tuple[str, float, float, int | None]]) -> pa.Table:
    """(syscall, entry s, return s, bytes) rows as the syscall table has them."""
    return pa.table({"syscall": pa.array([c[0] for c in calls]).dictionary_encode(),
                     "ts_enter": pa.array([int(c[1] * S) for c in calls], pa.int64()),
                     "ts_exit": pa.array([int(c[2] * S) for c in calls], pa.int64()),
                     "bytes": pa.array([c[3] for c in calls], pa.int64())})


def _save(at: float, seconds: float) -> list:
    return [("openat", at, at, None), ("write", at, at + seconds - 0.5, 1 << 20), ("fsync", at + seconds - 0.5,
                                                                                    at + seconds, None)]


def test_saves_end_after_the_gap_and_are_timed():
    clock = SaveClock(gap_s=10)
    assert not clock.feed(_calls(_save(0, 2)), now_ns=3 * S)
    assert not clock.feed(None, now_ns=11 * S)           # 9 s after its last call: maybe not over
    assert clock.feed(None, now_ns=12 * S) and clock.durations_s == [2.0]
    assert not clock.feed(None, now_ns=13 * S)           # said once


def test_a_save_across_drains_is_one_save():
    clock = SaveClock(gap_s=10)
    calls = _save(0, 6)
    for i, call in enumerate(calls):                     # one call per drain, 5 s apart at most
        clock.feed(_calls([call]), now_ns=int(call[2] * S))
    assert clock.durations_s == []
    clock.feed(_calls(_save(100, 2)), now_ns=102 * S)    # the next save ends the first, in the same batch
    assert clock.durations_s == [6.0]


def test_a_burst_that_wrote_nothing_is_no_save():
    clock = SaveClock(gap_s=10)
    assert not clock.feed(_calls([("openat", 0, 0.1, None), ("read", 0, 1, None)]), now_ns=30 * S)
    assert clock.durations_s == []


def test_the_slow_one_is_found():
    clock = SaveClock(gap_s=10)
    ended = []
    for n, (at, took) in enumerate([(0, 2), (60, 2.5), (120, 2), (180, 8)]):
        clock.feed(_calls(_save(at, took)), now_ns=int((at + took) * S))
        if clock.feed(None, now_ns=int((at + took + 10) * S)):
            ended.append(slow_save(clock.durations_s, 3))
    assert clock.durations_s == [2, 2.5, 2, 8] and ended == [False, False, False, True]
