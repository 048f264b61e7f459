"""The view model of `slotscope top`, computed headless: analyze() as of the time cursor with
what the TUI shows beside it (per-rank extras, what each rank is blocked in, the transports'
series, a rank's drill-down). The TUI only formats it."""
from __future__ import annotations

import time

from .analysis import analyze
from .in_progress import blocked_now, in_progress
from .rank_detail import rank_detail
from .rank_extras import rank_extras
from .ranks import rank_key
from .timeline import JobSource


def overview(source: JobSource, until_ns: int | None, version: str, bins: int = 0,
             detail: tuple[str, list[int]] | None = None) -> dict:
    """analyze() as of the cursor, its ranks extended with rank_extras() and blocked_now(),
    the time axis, the transports' series on `bins` bins (0: none), and, for `detail`
    (host, pids), that rank's drill-down."""
    job = source.at(until_ns)
    span = source.span_ns()
    cursor = span if until_ns is None else min(until_ns, span)
    result = analyze(job, version)
    extras = rank_extras(job, now_ns=cursor)
    calls = in_progress(job, source.at(None) if until_ns is not None else None, cursor)
    blocked = blocked_now(calls)
    empty = {"p99_ns": None, "write_calls": 0, "mean_write": None, "slowest_recent": None}
    for r in result["ranks"]:
        r.update(extras.get(rank_key(r), empty))
        r["blocked_now"] = blocked.get(rank_key(r))
    result["timeline"] = {"cursor_ns": cursor, "span_ns": span, "live": source.live,
                          "read_at": time.time(), "updated_at": source.updated_at(),
                          "generation": source.generation}
    result["series"] = source.series(bins) if bins else []
    result["detail"] = rank_detail(job, detail[0], detail[1], calls) if detail else None
    result["has_rpc"] = any(v.full("rpc") is not None for v in source.views)
    return result
