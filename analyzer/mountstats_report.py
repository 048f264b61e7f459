"""`slotscope analyze --mountstats`: copies of /proc/self/mountstats read as nfsiostat's
columns, explained, and the findings sampled.py makes from the same counters.

The copies are two files with the time between them given, or one file of copies each headed
by a timestamp line (`while :; do date +%s.%N; cat /proc/self/mountstats; sleep 1; done`)."""
from __future__ import annotations

import os
import stat
from statistics import median

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.mountstats import interval_rows
from slotscope.capture.tables import schema

from . import sampled
from .findings import settle, verdict
from .job import iso_utc
from .mountstats import mounts, snapshots
from .thresholds import Thresholds
from .report_text import finding_lines, wrap
from .units import number, pct

S = 1_000_000_000

# nfsiostat's columns per operation: (key, head, what it means)
COLUMNS = (
    ("ops_per_s", "ops/s", "operations completed per second"),
    ("kB_per_s", "kB/s", "kilobytes sent and received per second (requests and replies, headers included)"),
    ("kB_per_op", "kB/op", "kilobytes per operation: a WRITE's size shows here"),
    ("retrans", "retrans", "transmissions beyond the first (ntrans - ops), and their share of the operations"),
    ("rtt_ms", "avg RTT", "ms from the request's last transmission to its reply: the network and the server"),
    ("exe_ms", "avg exe", "ms from the RPC's start to its end, as the application waits for it"),
    ("queue_ms", "avg queue", "ms from the RPC's start to its transmission: waiting for a slot and for the "
                              "socket (exe - queue - RTT is the client's own work)"),
    ("errors", "errors", "operations that ended with an error"),
)


class MountstatsError(ValueError):
    """A one-line reason the files cannot be read as mountstats copies."""


def _read(path: str) -> str:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):     # a FIFO or a device would never end
            raise MountstatsError(f"{path} is not a regular file")
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        raise MountstatsError(f"cannot read {path}: {exc.strerror}") from None


def _check(path: str, text: str) -> None:
    if not any(line.startswith("device ") for line in text.splitlines()):
        raise MountstatsError(f"{path} is not a copy of /proc/self/mountstats (no 'device ... mounted on' line)")


def copies(paths: list[str], interval_s: float | None) -> list[tuple[int, str]]:
    """(UTC ns, text) of each copy, in time order; MountstatsError when they cannot be told apart."""
    if len(paths) > 2:
        raise MountstatsError("--mountstats takes one file of timestamped copies, or two copies with --interval")
    texts = [_read(p) for p in paths]
    for p, t in zip(paths, texts):
        _check(p, t)
    if len(paths) == 2:
        if not interval_s:
            raise MountstatsError("two copies of mountstats need --interval SECONDS (the time between them)")
        end = int(os.stat(paths[1]).st_mtime_ns)
        found = [(end - int(interval_s * S), texts[0]), (end, texts[1])]
    else:
        found = snapshots(texts[0])
        if len(found) < 2:
            raise MountstatsError(
                f"{paths[0]} holds one copy of mountstats: give a second copy and --interval SECONDS, or a file of "
                "copies each headed by a timestamp line (date +%s.%N or ISO 8601)")
    if not any(mounts(t) for _, t in found):
        raise MountstatsError(f"no NFS mount in {' or '.join(paths)}")
    return sorted(found, key=lambda c: c[0])


def counters(found: list[tuple[int, str]]) -> sampled.Counters:
    """The ms_ops/ms_xprt rows (capture/tables.py) of consecutive copies, as sampled.Counters."""
    ops, xprts, limits = [], [], {}
    for (t0, before), (t1, after) in zip(found, found[1:]):
        old = mounts(before)
        for point, (server, section) in mounts(after).items():
            if point not in old:        # mounted between the copies: its counters start at this one
                continue
            o, x = interval_rows(old[point][1], section, t1, t1 - t0, point, server)
            ops += o
            xprts += x
            opts = section["opts"]
            limits[(None, server)] = (None, None, {"server": server, "vers": opts.get("vers"), "nconnect": opts.get("nconnect"),
                                           "timeo": opts.get("timeo"), "retrans": opts.get("retrans")})
    interval = int(median(t1 - t0 for (t0, _), (t1, _) in zip(found, found[1:])))
    return sampled.Counters(pa.Table.from_pylist(ops, schema=schema("ms_ops")) if ops else None,
                            pa.Table.from_pylist(xprts, schema=schema("ms_xprt")) if xprts else None,
                            None, interval, limits)


def columns(c: sampled.Counters) -> list[dict]:
    """Per mount: nfsiostat's columns per operation over the whole span, and its transports."""
    out = []
    if c.ops is None:
        return out
    seconds = {}
    for r in c.ops.select(["mount", "ts", "interval_ns"]).to_pylist():
        seconds.setdefault(r["mount"], {})[r["ts"]] = r["interval_ns"] / S
    totals: dict = {}
    for r in c.ops.to_pylist():
        e = totals.setdefault((r["mount"], r["server"]), {}).setdefault(r["op"], dict.fromkeys(
            ("ops", "ntrans", "bytes_sent", "bytes_recv", "rtt_ns", "execute_ns", "queue_ns", "errors"), 0))
        for k in e:
            e[k] += r[k] or 0         # kernels before errors were counted leave it null
    for (mount, server), per_op in sorted(totals.items()):
        span = sum(seconds[mount].values())
        rows = {}
        for op, e in per_op.items():
            n = e["ops"]
            if not n:
                continue
            kb = (e["bytes_sent"] + e["bytes_recv"]) / 1024
            rows[op] = {"ops": n, "ops_per_s": n / span, "kB_per_s": kb / span, "kB_per_op": kb / n,
                        "retrans": e["ntrans"] - n, "retrans_share": (e["ntrans"] - n) / n,
                        "rtt_ms": e["rtt_ns"] / n / 1e6, "exe_ms": e["execute_ns"] / n / 1e6,
                        "queue_ms": e["queue_ns"] / n / 1e6, "errors": e["errors"]}
        x = c.xprt.filter(pc.equal(c.xprt["mount"], mount)) if c.xprt is not None else None
        sends = sum(x["sends"].to_pylist()) if x is not None else 0
        out.append({"mount": mount, "server": server, "seconds": span, "ops": rows,
                    "transport": x is not None and x.num_rows and {
                        "sends": sends, "recvs": sum(x["recvs"].to_pylist()),
                        "mean_backlog_per_send": sum(x["bklog_u"].to_pylist()) / sends if sends else None,
                        "mean_outstanding_per_send": sum(x["req_u"].to_pylist()) / sends if sends else None,
                        "max_slots": max(x["max_slots"].to_pylist())} or None})
    return out


def analyze_copies(found: list[tuple[int, str]], files: list[str], version: str,
                   thresholds: Thresholds | None = None) -> dict:
    """The findings and columns of mountstats copies, with the keys of analysis.analyze() they share."""
    th = thresholds or Thresholds()
    c = counters(found)
    findings = settle(sampled.detect(c, th))
    return {"slotscope_version": version, "source": "mountstats", "files": files,
            "start": iso_utc(found[0][0]), "end": iso_utc(found[-1][0]), "copies": len(found),
            "interval_s": c.interval_ns / S, "confidence": c.confidence(),
            "verdict": verdict(findings), "findings": [f.as_json() for f in findings],
            "mounts": columns(c), "thresholds": th.as_dict(),
            "notes": ["max_slots is the slot high-water mark since the mount, not of these intervals; "
                      "bklog_u / sends is the mean number of RPCs waiting for a slot when one was sent"]}


def render(result: dict) -> str:
    out = [f"verdict: {result['verdict']}" + (f" ({result['findings'][0]['severity']})"
                                              if result["findings"] and result["verdict"] != "healthy" else ""),
           f"from {result['copies']} copies of mountstats, {result['start']} .. {result['end']}, "
           f"{number(result['interval_s'], 's')} apart", ""]
    for m in result["mounts"]:
        out.append(f"{m['mount']} from {m['server']} over {number(m['seconds'], 's')}")
        out.append(f"  {'op':<12}" + "".join(f"{head:>10}" for _, head, _ in COLUMNS))
        for op, r in m["ops"].items():
            cells = [number(r["ops_per_s"]), number(r["kB_per_s"]), number(r["kB_per_op"]),
                     f"{r['retrans']} ({pct(r['retrans_share'])})", f"{r['rtt_ms']:.1f}", f"{r['exe_ms']:.1f}",
                     f"{r['queue_ms']:.1f}", str(r["errors"])]
            out.append(f"  {op:<12}" + "".join(f"{c:>10}" for c in cells))
        t = m["transport"]
        if t:
            out += wrap(f"transport: {t['sends']:,} sends, {t['recvs']:,} replies; on each send "
                         f"{number(t['mean_outstanding_per_send'])} RPCs were outstanding and "
                         f"{number(t['mean_backlog_per_send'])} waiting for a slot (bklog_u/sends), on average; "
                         f"slot high-water mark since the mount {t['max_slots']} (max_slots)", "  ")
        out.append("")
    out.append("columns")
    out += [line for _, head, means in COLUMNS for line in wrap(f"{head}: {means}", "  ")]
    out += ["", "findings" if result["findings"] else "findings: none"]
    for f in result["findings"]:
        out += finding_lines(f) + [""]
    out += [line for n in result["notes"] for line in wrap(f"note: {n}", "")]
    return "\n".join(out)
