"""The analysis of a job, as the JSON contract of DESIGN.md, and its terminal rendering."""
from __future__ import annotations

from slotscope.analyzer.capture import FORMAT_MAJOR

from .job import Job
from .ranks import rank_table


def _utc(meta: dict, key: str) -> str | None:
    from datetime import datetime, timezone
    pair = meta.get(key)
    if not pair:
        return None
    return datetime.fromtimestamp(pair["realtime_ns"] / 1e9, timezone.utc).isoformat()


def analyze(job: Job, version: str) -> dict:
    # No finding is computed yet, so no verdict: null, never a "healthy" nobody checked.
    notes = ["not assessed: this version attributes syscalls and RPCs per rank; the findings "
             "(slot saturation, server not responding, ...) and the verdict are not computed yet"]
    if all(c.read("rpc") is None for c in job.captures):
        notes.append("no RPC rows in these captures: RPC, slot-table and server findings need the "
                     "sunrpc/NFS probes (a kernel with NFS); only syscalls were analysed")
    return {
        "slotscope_version": version,
        "schema": FORMAT_MAJOR,
        "captures": [{
            "path": c.path, "host": c.meta.get("host"), "kernel": c.meta.get("kernel"),
            "start": _utc(c.meta, "start"), "end": _utc(c.meta, "stop"),
            "lost_events": job.lost_events(c),
        } for c in job.captures],
        "verdict": None,
        "findings": [],
        "ranks": rank_table(job),
        "transports": [],
        "rpc": {"by_proc": {}},
        "notes": notes,
        "problems": job.problems(),
    }


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.1f}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def render_text(result: dict) -> str:
    out = [f"verdict: {result['verdict'] or 'not assessed'}"]
    for cap in result["captures"]:
        out.append(f"capture {cap['path']}: host {cap['host']}, kernel {cap['kernel']}, "
                   f"{cap['start'] or '?'} .. {cap['end'] or 'still recording'}, "
                   f"{cap['lost_events']} events lost")
    out += [f"note: {n}" for n in result["notes"]]
    out += [f"problem: {p}" for p in result["problems"]]
    out.append("")
    out.append("per rank")
    head = (f"{'rank':>5} {'host':<10} {'pids':<12} {'comm':<12} {'written':>11} {'WRITE rpcs':>10} "
            f"{'slot wait ms':>12} {'blocked ms':>11}")
    out.append(head)
    for r in result["ranks"]:
        pids = ",".join(map(str, r["pids"][:2])) + ("..." if len(r["pids"]) > 2 else "")
        rpcs = "-" if r["write_rpcs"] is None else f"{r['write_rpcs']:,}"
        out.append(f"{'-' if r['rank'] is None else r['rank']:>5} {r['host'][:10]:<10} {pids:<12} "
                   f"{(r['comm'] or '?')[:12]:<12} {_size(r['bytes_written']):>11} {rpcs:>10} "
                   f"{_ms(r['slot_wait_ns']):>12} {_ms(r['blocked_ns']):>11}")
        for name, s in sorted(r["syscalls"].items(), key=lambda kv: -kv[1]["total_ns"]):
            out.append(f"{'':>8}{name:<10} {s['count']:>8} calls  total {_ms(s['total_ns']):>9} ms"
                       f"  max {_ms(s['max_ns']):>8} ms")
    if not result["ranks"]:
        out.append("  (no traced syscalls on matching files)")
    return "\n".join(out)
