"""watch's triggers: what --trigger accepts, and when a trigger fires again (the re-arm rule)."""
import pyarrow as pa
import pytest

from slotscope.agent.conditions import Blocked, longest_full, not_responding, returned_blocked, slow_save
from slotscope.agent.triggers import TRIGGERS, Arming, parse_triggers
from slotscope.capture.tables import BLOCKED, KMSG

pytestmark = pytest.mark.unit


def test_defaults_and_changes():
    assert parse_triggers([]) == {name: t.default for name, t in TRIGGERS.items()}
    got = parse_triggers(["blocked_s=2", "not_responding=off", "slow_save=2.5", "slot_full_s=0"])
    assert got == {"blocked_s": 2.0, "slow_save": 2.5, "slot_full_s": 0.0}
    assert "not_responding" not in parse_triggers(["not_responding=OFF"])


@pytest.mark.parametrize("spec, said", [
    ("blocked=2", "no trigger 'blocked'"),
    ("blocked_s", "want blocked_s=VALUE"),
    ("blocked_s=", "want blocked_s=VALUE"),
    ("blocked_s=abc", "not a number"),
    ("blocked_s=0.5", "at least 1"),
    ("blocked_s=inf", "at least 1"),
    ("slot_full_s=-1", "at least 0"),
    ("slow_save=1", "above 1"),
    ("not_responding=maybe", "on or off"),
])
def test_bad_specs_say_why(spec, said):
    with pytest.raises(ValueError, match=said):
        parse_triggers([spec])


def test_one_incident_while_the_condition_holds():
    """A dead server: the condition holds at every evaluation. One incident, however long."""
    arming = Arming(["blocked_s"], rearm_s=60)
    fired = [arming.observe(t, {"blocked_s"}, incident_open=False)[0] for t in range(0, 600, 1)]
    assert fired == ["blocked_s"] + [None] * 599


def test_rearms_after_the_condition_cleared_for_rearm_s():
    arming = Arming(["blocked_s"], rearm_s=60)
    assert arming.observe(0, {"blocked_s"}, False)[0] == "blocked_s"
    for t in range(1, 60):          # clear since t=1: not yet 60 s
        assert arming.observe(t, set(), False)[0] is None
    assert arming.observe(60, {"blocked_s"}, False)[0] is None     # back before the 60 s: no
    for t in range(61, 121):
        arming.observe(t, set(), False)
    assert arming.observe(121, set(), False)[0] is None
    assert arming.observe(122, {"blocked_s"}, False)[0] == "blocked_s"


def test_nothing_fires_while_an_incident_is_open():
    """Another trigger (or the same one again) while an incident is written is noted in it, and
    disarmed: it does not open a second incident once the first is closed."""
    arming = Arming(["blocked_s", "slot_full_s"], rearm_s=30)
    assert arming.observe(0, {"blocked_s"}, False) == ("blocked_s", set())
    assert arming.observe(5, {"slot_full_s", "blocked_s"}, True) == (None, {"slot_full_s", "blocked_s"})
    assert arming.observe(10, {"slot_full_s"}, False) == (None, set())
    assert arming.observe(41, set(), False) == (None, set())
    assert arming.observe(42, {"slot_full_s"}, False) == (None, set())   # clear for 1 s only
    arming.rearm_all()
    assert arming.observe(43, {"slot_full_s"}, False) == ("slot_full_s", set())


def test_two_at_once_open_one_incident():
    arming = Arming(["blocked_s", "not_responding"])
    fire, noted = arming.observe(0, {"blocked_s", "not_responding"}, False)
    assert fire == "blocked_s" and noted == {"not_responding"}


S = 1_000_000_000


def _snapshot(ts, *calls):
    return pa.Table.from_pylist([{"ts": ts, "tid": tid, "tgid": tid, "syscall": "write", "ts_enter": enter, "fd": 3,
                                  "path": f"/p{tid}"} for tid, enter in calls], schema=BLOCKED)


def test_a_blocked_call_stays_blocked_between_snapshots_until_one_leaves_it_out():
    """A drain without a snapshot must not clear the condition (a trigger re-armed by it would
    report the same call again); a snapshot without the call, or with nothing blocked, ends it."""
    b = Blocked()
    b.feed_snapshot(_snapshot(10 * S, (7, 1 * S), (8, 4 * S)))
    assert b.longest(10 * S) == (9 * S, {"tgid": 7, "syscall": "write", "path": "/p7", "ts_enter": S,
                                         "in_progress": True})
    assert b.longest(12 * S)[0] == 11 * S                      # no snapshot since: still blocked
    b.feed_snapshot(_snapshot(13 * S, (8, 4 * S), (9, 12 * S)))    # 7 not in the latest snapshot: it ended
    assert b.longest(13 * S) == (9 * S, b.calls[8, 4 * S])
    b.feed_snapshot(None)                                      # nothing blocked at all
    assert b.longest(14 * S) == (0, None)


def test_returned_blocked_takes_the_longest_returned_call():
    calls = pa.table({"tgid": pa.array([9, 5], pa.uint32()), "syscall": ["close", "write"], "path": ["/r", "/s"],
                      "ts_enter": [0, 0], "latency_ns": [9_500, 200]})
    ns, call = returned_blocked(calls)
    assert ns == 9_500 and call["path"] == "/r" and not call["in_progress"]
    assert returned_blocked(None) == (0, None)


def test_slot_full_is_the_server_full_the_longest():
    """The kernel's full_since per server (aggregates.py): the one full since the earliest."""
    assert longest_full({"a": 200, "b": 300}, 1_200) == (1_000, "a")
    assert longest_full({"b": 300}, 1_300) == (1_000, "b")
    assert longest_full({}, 2_000) == (0, None)


def test_not_responding_line():
    rows = pa.Table.from_pylist([{"ts": 1, "level": 4, "message": "nfs: server 10.0.0.2 OK"},
                                 {"ts": 2, "level": 4, "message": "nfs: server 10.0.0.2 not responding, still trying"}],
                                schema=KMSG)
    assert not_responding(rows) == "nfs: server 10.0.0.2 not responding, still trying"
    assert not_responding(rows.slice(0, 1)) is None


def test_slow_save_against_the_median_of_earlier_ones():
    assert not slow_save([10, 10, 40], 3)               # too few earlier saves
    assert slow_save([10, 12, 9, 30], 2.5)
    assert not slow_save([10, 12, 9, 24], 2.5)
