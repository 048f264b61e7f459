"""What each capture lost (the `loss` table): per probe and counter, how many events and when,
and whether what the report says of the saves' files and ranks could be affected."""
from __future__ import annotations

from slotscope.capture.losses import LOSS_COUNTERS, LossCounter
from slotscope.capture.meta import utc_offset_ns

from .job import Job, iso_utc, utc_ns
from .units import clock, plural

# What a lost category of LossCounter.affects makes incomplete, in the report's words.
AFFECTS = {"ranks": "per-rank figures", "files": "file list", "rpcs": "RPC counts and times", "slots": "slot occupancy"}


def _span_words(labels: list[str]) -> str:
    """['save 1', 'save 3'] -> 'saves 1, 3'; ['the save'] -> 'the save'."""
    if len(labels) > 1 and all(x.startswith("save ") for x in labels):
        return "saves " + ", ".join(x.removeprefix("save ") for x in labels)
    return ", ".join(labels)


def _and(items: list[str]) -> str:
    """['a', 'b', 'c'] -> 'a, b, and c'."""
    return items[0] if len(items) == 1 else " and ".join(items) if len(items) == 2 else \
        ", ".join(items[:-1]) + ", and " + items[-1]


def _later_harm(counter: LossCounter, meta: dict, ranks: list[dict]) -> tuple[bool, str]:
    """(could it have harmed a later save, the measure that says so) for a counter that loses state."""
    if counter.lasting == "fd":
        unnamed = (meta.get("totals") or {}).get("unnamed_fd_rows")
        if unnamed is None:
            return True, "a file opened then may be missing from them"
        return bool(unnamed), (f"{plural(unnamed, 'call')} on files the agent could not name went unrecorded"
                               if unnamed else "no call went unrecorded for want of its file's name")
    unranked = [r for r in ranks if r["bytes_written"] and r["rank"] is None]
    return bool(unranked), (f"{plural(len(unranked), 'writing process', 'writing processes')} without a rank"
                            if unranked else "every process that wrote has its rank")


def _effect(counter: LossCounter, first: int, last: int, spans: list[tuple[str, int, int]], meta: dict,
            ranks: list[dict]) -> tuple[list[str], list[str], str]:
    """(the spans it falls in, what could be affected, the words that say so)."""
    words = _and([AFFECTS[a] for a in counter.affects])
    during = [label for label, a, b in spans if first <= b and last >= a]
    if during:
        return during, list(counter.affects), f"during {_span_words(during)}, whose {words} may be incomplete"
    if not spans:
        return [], [], "no save was traced for it to affect"
    later = [label for label, a, _ in spans if a > last]
    if counter.lasting and later:
        harm, measure = _later_harm(counter, meta, ranks)
        if harm:
            return [], list(counter.affects), f"before {_span_words(later)}; {measure}: their {words} may be incomplete"
        return [], [], f"before {_span_words(later)}; {measure}: their files and ranks are not affected"
    return [], [], "outside the saves; their files and ranks are not affected"


def losses(job: Job, spans: list[tuple[str, int, int]], ranks: list[dict]) -> list[dict]:
    """Each capture's losses per counter. `spans`: (label, start, end) in UTC ns of each save
    ('save 1', ...), or of the one save window; `ranks`: rank_table()."""
    out = []
    for cap, t in job.per_capture("loss"):
        off = utc_offset_ns(cap.meta)
        groups: dict[str, dict] = {}         # a row a second at most: few rows
        for row in t.select(["ts", "interval_ns", "probe", "counter", "lost"]).to_pylist():
            g = groups.setdefault(row["counter"], {"lost": 0, "first": row["ts"], "last": row["ts"],
                                                   "probe": row["probe"]})
            g["lost"] += row["lost"] or 0
            g["first"] = min(g["first"], row["ts"] - (row["interval_ns"] or 0))
            g["last"] = max(g["last"], row["ts"])
        for name, g in groups.items():
            if not g["lost"]:
                continue
            counter = LOSS_COUNTERS.get(name) or LossCounter(g["probe"] or "?", "events", ())
            first, last = g["first"] + off, g["last"] + off
            during, affects, effect = _effect(counter, first, last, spans, cap.meta, ranks)
            out.append({"host": cap.meta.get("host", "?"), "capture": cap.path, "probe": counter.probe,
                        "counter": name, "what": counter.lost, "lost": g["lost"], "start": iso_utc(first),
                        "end": iso_utc(last), "during": during, "could_affect": affects, "effect": effect})
    return sorted(out, key=lambda x: (x["host"], x["start"], -x["lost"]))


def loss_when(loss: dict) -> str:
    """When a loss happened, to the agent's loss interval (about a second): '18:03:20.1 .. 18:03:25.3 UTC'."""
    return f"{clock(utc_ns(loss['start']), 1)} .. {clock(utc_ns(loss['end']), 1)} UTC"


def loss_line(loss: dict, host: bool) -> str:
    """One loss in a sentence: '7,070 syscall rows lost (syscalls: sys_ring_full) 18:03:20.1 ..
    18:03:25.3 UTC, before save 1; ...'."""
    return (f"{loss['lost']:,} {loss['what']} lost" + (f" on {loss['host']}" if host else "")
            + f" ({loss['probe']}: {loss['counter']}) {loss_when(loss)}, {loss['effect']}")
