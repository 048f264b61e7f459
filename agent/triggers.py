"""What makes `slotscope watch` keep an incident: the triggers, their defaults, and when one
fires again.

Each trigger is declared once (TRIGGERS: its default, unit and meaning); `--trigger NAME=VALUE`
changes a value and `NAME=off` turns a trigger off. Their conditions on the rows are in
conditions.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

OFF = "off"
MIN_EARLIER_SAVES = 3   # slow_save: saves before the one it judges
REARM_S = 60.0      # s a trigger's condition must stay false before it can fire again


def _seconds(text: str, least: float) -> float:
    value = float(text)
    if not value >= least or value == float("inf"):
        raise ValueError(f"want a number of seconds of at least {least:g}")
    return value


def _switch(text: str) -> bool:
    if text.lower() in ("on", "1", "true", "yes"):
        return True
    raise ValueError("want on or off")


def _factor(text: str) -> float:
    value = float(text)
    if not value > 1 or value == float("inf"):
        raise ValueError("want a factor above 1 (times the median of the earlier saves)")
    return value


@dataclass(frozen=True)
class Trigger:
    name: str
    default: float | bool
    parse: Callable[[str], float | bool]
    doc: str


TRIGGERS = {t.name: t for t in (
    # The blocked snapshots are taken once a second of calls blocked at least a second: below it
    # a threshold could not be told apart.
    Trigger("blocked_s", 30.0, lambda v: _seconds(v, 1.0),
            "a traced syscall blocked (in progress, or returned) for at least this many seconds"),
    Trigger("slot_full_s", 5.0, lambda v: _seconds(v, 0.0),
            "an RPC transport's slot table full (tasks waiting for a slot) for at least this many seconds (NFS)"),
    Trigger("not_responding", True, _switch,
            "a kernel log line 'server ... not responding' (NFS): on or off"),
    Trigger("slow_save", 3.0, _factor,
            f"a save slower than this many times the median of the earlier saves (at least {MIN_EARLIER_SAVES} of them)"),
)}


def parse_triggers(specs: list[str]) -> dict[str, float | bool]:
    """The triggers in force: every one at its default, changed by NAME=VALUE or turned off by
    NAME=off. ValueError names the bad spec and what is wanted."""
    active: dict[str, float | bool] = {name: t.default for name, t in TRIGGERS.items()}
    for spec in specs:
        name, eq, value = spec.partition("=")
        name, value = name.strip(), value.strip()
        if name not in TRIGGERS:
            raise ValueError(f"--trigger {spec}: no trigger {name!r} (triggers: {', '.join(TRIGGERS)})")
        if not eq or not value:
            raise ValueError(f"--trigger {spec}: want {name}=VALUE or {name}={OFF}")
        if value.lower() == OFF:
            active.pop(name, None)
            continue
        try:
            active[name] = TRIGGERS[name].parse(value)
        except ValueError as exc:
            why = "not a number" if "could not convert" in str(exc) else str(exc)
            raise ValueError(f"--trigger {spec}: {why}") from None
    return active


def described() -> list[tuple[str, str, str]]:
    """(name, default, meaning) of every trigger, for --help and the README."""
    return [(t.name, "on" if t.default is True else f"{t.default:g}", t.doc) for t in TRIGGERS.values()]


class Arming:
    """When triggers may fire. A trigger fires when its condition holds and it is armed, and no
    incident is open (collecting its after-window, being written or analysed): then it opens
    one. A condition that holds while an incident is open is noted in that incident and
    disarms its trigger too. A disarmed trigger re-arms once its condition has been false for
    `rearm_s` seconds in a row: a dead server, whose condition never clears, makes one incident."""

    def __init__(self, names, rearm_s: float = REARM_S):
        self.rearm_s = rearm_s
        self.armed = dict.fromkeys(names, True)
        self.clear_since: dict[str, float] = {}     # disarmed trigger -> when its condition last cleared

    def observe(self, now: float, holding: set[str], incident_open: bool) -> tuple[str | None, set[str]]:
        """One evaluation at `now` (s) with the triggers whose conditions hold. -> (the trigger
        that opens an incident now, or None; the triggers to note in the open incident)."""
        for name in self.armed:
            if name in holding:
                self.clear_since.pop(name, None)
            elif not self.armed[name]:
                since = self.clear_since.setdefault(name, now)
                if now - since >= self.rearm_s:
                    self.armed[name] = True
                    del self.clear_since[name]
        firing = [n for n in self.armed if n in holding and self.armed[n]]
        noted = {n for n in holding if n in self.armed} if incident_open else set()
        for name in noted | set(firing):
            self.armed[name] = False
        if incident_open or not firing:
            return None, noted
        return firing[0], set(firing[1:])

    def rearm_all(self) -> None:
        self.armed = dict.fromkeys(self.armed, True)
        self.clear_since.clear()
