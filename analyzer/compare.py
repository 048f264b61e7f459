"""The same job recorded before and after a change: what changed (mount options, sysctls,
kernel from meta.json; write sizes and stability from the capture), the saves and ranks
side by side, whether each symptom of BEFORE is gone, and how far BEFORE's prediction for
that change (whatif.py) was from AFTER's measured save. It answers the checklist's "does it
come back in a clean rerun" row."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import WRITE_SYSCALLS

from .analysis import context
from .attribution import attributed_writes
from .job import Job
from .ranks import rank_table
from .saves import predicted_part
from .thresholds import Thresholds
from . import whatif
from .units import byte_rate, number, pct, size

RERUN = "does it come back in a clean rerun"


def _options(mount: dict) -> dict[str, str]:
    return dict(o.partition("=")[::2] for o in (mount.get("options") or "").split(",") if o)


def meta_changes(before: Job, after: Job) -> list[dict]:
    """What meta.json says changed, per host: kernel, sunrpc sysctls, each mount's options."""
    out = []
    pairs = {c.meta.get("host", "?"): [c.meta, None] for c in before.captures}
    for c in after.captures:
        pairs.setdefault(c.meta.get("host", "?"), [None, None])[1] = c.meta
    for host, (b, a) in sorted(pairs.items()):
        b, a = b or {}, a or {}
        if b.get("kernel") != a.get("kernel"):
            out.append({"host": host, "what": "kernel", "before": b.get("kernel"), "after": a.get("kernel")})
        sb, sa = b.get("sunrpc") or {}, a.get("sunrpc") or {}
        out += [{"host": host, "what": f"sysctl sunrpc.{k}", "before": sb.get(k), "after": sa.get(k)}
                for k in sorted(set(sb) | set(sa)) if sb.get(k) != sa.get(k)]
        mb = {m.get("mountpoint"): _options(m) for m in b.get("nfs_mounts") or []}
        ma = {m.get("mountpoint"): _options(m) for m in a.get("nfs_mounts") or []}
        for mnt in sorted(set(mb) | set(ma), key=str):
            ob, oa = mb.get(mnt, {}), ma.get(mnt, {})
            out += [{"host": host, "what": f"mount {mnt} {k}", "before": ob.get(k), "after": oa.get(k)}
                    for k in sorted(set(ob) | set(oa)) if ob.get(k) != oa.get(k)]
    return out


def _writes(job: Job, result: dict) -> dict:
    """How the save wrote: mean write() and WRITE RPC sizes, the WRITEs' stability, slot wait's share."""
    ranks = [r for r in result["ranks"] if r["bytes_written"]]
    calls = sum(s["count"] for r in ranks for k, s in r["syscalls"].items() if k in WRITE_SYSCALLS)
    w = result["rpc"]["by_proc"].get("WRITE") or {}
    writes = attributed_writes(job)
    stable = (pc.mean(pc.cast(pc.greater(writes["io_stable"], 0), pa.float64())).as_py()
              if writes is not None and writes.num_rows else None)
    return {"write_call_bytes": sum(r["bytes_written"] for r in ranks) / calls if calls else None,
            "write_rpc_bytes": w["bytes"] / w["count"] if w.get("count") else None,
            "stable_share": stable,
            "slot_wait_share": ((w["slot_wait_ns"] + w["session_wait_ns"]) / w["execute_ns"]
                                if w.get("execute_ns") else None)}


def _change(changes: list[dict], before_writes: dict, after_writes: dict) -> whatif.Change | None:
    """The change to predict from what changed: slots, session slots, nconnect, write size, buffering."""
    def after(what):
        v = next((c["after"] for c in changes if c["what"].endswith(what)), None)
        return int(v) if v is not None and str(v).isdigit() else None
    slots, session, nconnect = after("tcp_max_slot_table_entries"), after("nfs_max_session_slots"), after(" nconnect")
    bw, aw = before_writes["write_rpc_bytes"], after_writes["write_rpc_bytes"]
    buffered = (before_writes["stable_share"] or 0) >= 0.5 and (after_writes["stable_share"] or 0) < 0.5 and bool(aw)
    size = int(after_writes["write_call_bytes"]) if bw and aw and not buffered and aw >= 1.5 * bw else None
    c = whatif.Change(slots=slots, session_slots=session, nconnect=nconnect, write_size=size, buffered=buffered)
    return None if c.text() == whatif.NO_CHANGE else c


def _rate(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds if seconds else None


def compare(before: Job, after: Job, rb: dict, ra: dict) -> dict:
    """The comparison of two analyses (analyze() of `before` and of `after`)."""
    changes = meta_changes(before, after)
    wb, wa = _writes(before, rb), _writes(after, ra)
    saves = [{"number": b["number"], "before_s": b["duration_s"], "after_s": a["duration_s"],
              "before_Bps": _rate(b["bytes"], b["duration_s"]), "after_Bps": _rate(a["bytes"], a["duration_s"]),
              "before_verdict": b["verdict"], "after_verdict": a["verdict"]}
             for b, a in zip(rb.get("saves") or [], ra.get("saves") or [])]
    ranks_a = {(r["host"], r["rank"]): r for r in ra["ranks"] if r["bytes_written"]}
    ranks = []
    for r in rb["ranks"]:
        a = ranks_a.get((r["host"], r["rank"]))
        if r["bytes_written"] and a:
            ranks.append({"rank": r["rank"], "host": r["host"], "before_s": r["save_s"], "after_s": a["save_s"],
                          "before_Bps": _rate(r["bytes_written"], r["save_s"]),
                          "after_Bps": _rate(a["bytes_written"], a["save_s"])})
    after_kinds = {f["kind"] for f in ra["findings"] if f["severity"] in ("critical", "warning")}
    symptoms = [{"kind": f["kind"], "severity": f["severity"], "gone": f["kind"] not in after_kinds}
                for f in rb["findings"] if f["severity"] in ("critical", "warning")]
    out = {"changed": changes, "writes": {"before": wb, "after": wa}, "saves": saves, "ranks": ranks,
           "window_s": {"before": rb["window"] and rb["window"]["seconds"],
                        "after": ra["window"] and ra["window"]["seconds"]},
           "verdicts": {"before": rb["verdict"], "after": ra["verdict"]}, "symptoms": symptoms, "prediction": None}
    change = _change(changes, wb, wa)
    th = Thresholds()
    part = predicted_part(after, th.save_gap_s)
    actual = whatif.save_span(ra["ranks"] if part is after else rank_table(part))     # ra's: the whole recording's
    if change is not None and actual:
        measured, why = whatif.measure(context(predicted_part(before, th.save_gap_s), th))
        p = whatif.predict(measured, why, change)
        pred = max(p, key=lambda x: x.predicted_s or 0).as_json()
        if pred["predicted_s"] is not None and not pred["why"]:
            pred["actual_s"] = actual
            pred["error"] = round((pred["predicted_s"] - actual) / actual, 3)
            pred["within_range"] = pred["range"][0] <= actual <= pred["range"][1]
        out["prediction"] = pred
    back = [s["kind"] for s in symptoms if not s["gone"]]
    stall = rb["verdict"] if rb["verdict"] not in (None, "healthy") else None
    out["checklist"] = [{"question": RERUN,       # the stall is BEFORE's verdict
                         "answer": None if stall is None else "yes" if stall in back else "no",
                         "value": (f"BEFORE's verdict {rb['verdict']}; after the change: verdict {ra['verdict']}"
                                   + (f"; still there: {', '.join(back)}" if back else "")
                                   + (f"; gone: {', '.join(s['kind'] for s in symptoms if s['gone'])}"
                                      if any(s["gone"] for s in symptoms) else ""))}]
    return out


def tables(doc: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """The comparison as (title, head, rows) of formatted cells: one formatting for the terminal
    and the HTML page."""
    def s(v):
        return "-" if v is None else number(v, "s")

    def ratio(b, a):
        return f"{b / a:.2f}x faster" if a and b and a <= b else f"{a / b:.2f}x slower" if a and b else "-"
    wb, wa = doc["writes"]["before"], doc["writes"]["after"]
    out = [("what changed", ["host", "what", "before", "after"],
            [[c["host"], c["what"], str(c["before"]), str(c["after"])] for c in doc["changed"]]
            + [["capture", label, fmt(wb[k]), fmt(wa[k])] for k, label, fmt in (
                ("write_call_bytes", "mean write() size", size), ("write_rpc_bytes", "mean WRITE RPC", size),
                ("stable_share", "stable (FILE_SYNC/DATA_SYNC) WRITEs", pct),
                ("slot_wait_share", "slot wait's share of WRITE time", pct)) if fmt(wb[k]) != fmt(wa[k])]),
           ("the job", ["", "before", "after", ""],
            [["save window", s(doc["window_s"]["before"]), s(doc["window_s"]["after"]),
              ratio(doc["window_s"]["before"], doc["window_s"]["after"])],
             ["verdict", str(doc["verdicts"]["before"]), str(doc["verdicts"]["after"]), ""]]),
           ("saves", ["save", "before", "after", "", "throughput before", "after", "verdict before", "after"],
            [[str(x["number"]), s(x["before_s"]), s(x["after_s"]), ratio(x["before_s"], x["after_s"]),
              byte_rate(x["before_Bps"]), byte_rate(x["after_Bps"]), str(x["before_verdict"]),
              str(x["after_verdict"])] for x in doc["saves"]]),
           ("ranks", ["rank", "host", "before", "after", "throughput before", "after"],
            [[str(r["rank"]), r["host"], s(r["before_s"]), s(r["after_s"]), byte_rate(r["before_Bps"]),
              byte_rate(r["after_Bps"])] for r in doc["ranks"]]),
           ("symptoms of BEFORE", ["finding", "severity", "after the change"],
            [[x["kind"], x["severity"], "gone" if x["gone"] else "still there"] for x in doc["symptoms"]])]
    p = doc["prediction"]
    if p:
        rows = [["change", p["change"]], ["predicted from BEFORE", whatif.line(p)]]
        if p.get("actual_s") is not None:
            rows += [["measured after", s(p["actual_s"])],
                     ["error", f"{100 * p['error']:+.0f}% ({'within' if p['within_range'] else 'outside'} "
                               "the predicted range)"]]
        out.append(("BEFORE's prediction for this change", ["", ""], rows))
    out.append(("checklist", ["question", "answer", ""],
                [[c["question"], c["answer"] or "-", c["value"]] for c in doc["checklist"]]))
    return [t for t in out if t[2]]
