"""The analysis of a job, as the JSON contract of DESIGN.md: findings, verdict, checklist,
per-rank and per-transport tables, the latency split per procedure."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.format import FORMAT_MAJOR
from slotscope.capture.meta import clock_uncertainty
from slotscope.capture.reader import verified

from . import sampled
from .attribution import attributed_rpcs
from .findings import SEVERITIES, Context, find, verdict
from .job import Job, between, iso_utc
from .kernel_log import fingerprints
from .losses import loss_line, losses
from .mountstats import capture_deltas
from .ranks import rank_table
from .report_text import rank_ranges
from .rpcs import by_proc
from .saves import Save, find_saves, trend
from .thresholds import Thresholds
from .transports import link_util, transport_table
from .units import gbps, mbps, number, pct
from . import whatif

UTC_COLUMNS = ("ts_begin", "ts_end", "ts_first_tx")


def rpc_rows(job: Job) -> pa.Table | None:
    """attributed_rpcs() with UTC copies of the times the findings compare across hosts."""
    rpc = attributed_rpcs(job)
    if rpc is None:
        return None
    for col in UTC_COLUMNS:
        rpc = rpc.append_column(f"{col}_utc", job.to_utc(rpc["host"], rpc[col]))
    return rpc


def log_events(job: Job, kernel_log: pa.Table | None) -> pa.Table | None:
    """Fingerprints of the captures' kmsg rows and of a kernel log given by the user, with UTC
    times: kmsg stamps are the host's monotonic clock; a log's own host decides its clock."""
    parts = []
    kmsg = job.table("kmsg")
    if kmsg is not None:
        fp = fingerprints(kmsg)
        parts.append(fp.set_column(fp.schema.get_field_index("ts_utc_ns"), "ts_utc_ns",
                                   job.to_utc(fp["host"], fp["ts_mono_ns"])))
    if kernel_log is not None:
        fp = fingerprints(kernel_log)
        hosts = {c.meta.get("host", "?") for c in job.captures}
        # A plain dmesg has monotonic stamps only: they are on a capture's clock when the log
        # names that capture's host, or when there is exactly one capture.
        mono = pc.and_(pc.is_null(fp["ts_utc_ns"]), pc.is_valid(fp["ts_mono_ns"]))
        if pc.any(mono).as_py():
            if len(hosts) == 1:
                host = pc.fill_null(fp["host"], next(iter(hosts)))
                fp = fp.set_column(fp.schema.get_field_index("host"), "host", host)
            known = pc.is_in(fp["host"], pa.array(sorted(hosts), pa.string()))
            guess = job.to_utc(pc.fill_null(fp["host"], "?"), pc.fill_null(fp["ts_mono_ns"], 0))
            fp = fp.set_column(fp.schema.get_field_index("ts_utc_ns"), "ts_utc_ns",
                               pc.if_else(pc.and_(mono, pc.fill_null(known, False)), guess, fp["ts_utc_ns"]))
        parts.append(fp)
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="permissive")


def save_window(ranks: list[dict], rpc: pa.Table | None) -> tuple[int, int] | None:
    """The save, in UTC ns: from the first writer's first call to the last one's return, or to
    the end of the last WRITE/COMMIT when writeback outlives the calls."""
    wrote = [r for r in ranks if r["bytes_written"]] or ranks
    bounds = [(r["save_start_ns"], r["save_end_ns"]) for r in wrote]
    if rpc is not None:
        io = pc.and_(pc.is_in(rpc["procname"], pa.array(["WRITE", "COMMIT"])), pc.equal(rpc["complete"], 1))
        if pc.any(io).as_py():
            first = pc.min(pc.if_else(io, rpc["ts_begin_utc"], None)).as_py()
            last = pc.max(pc.if_else(io, rpc["ts_end_utc"], None)).as_py()
            bounds.append((bounds[0][0] if bounds else first, last))
    if not bounds:
        return None
    return min(b[0] for b in bounds), max(b[1] for b in bounds)


def kernel_check(job: Job, rpc: pa.Table | None) -> list[dict]:
    """Per host and procedure: the RPCs the kernel counted during the recording (mountstats at
    start and stop) against the completed ones in the capture. They agree unless events
    were lost or a mount came or went."""
    out = []
    for cap in job.captures:
        if not cap.whole:      # mountstats cover the whole recording, not a window of it
            continue
        if "sampled" in cap.meta:       # its counts are mountstats' own: no traced RPC to check
            continue
        host = cap.meta.get("host", "?")
        kernel: dict[str, int] = {}
        for d in capture_deltas(cap.meta).values():
            for op, c in d["ops"].items():
                kernel[op] = kernel.get(op, 0) + c["ops"]
        if not any(kernel.values()):
            continue
        seen = {}
        if rpc is not None:
            mine = rpc.select(["host", "procname", "complete"])
            mine = mine.filter(pc.and_(pc.equal(mine["host"], host), pc.equal(mine["complete"], 1)))
            seen = {r["procname"]: r["complete_count"] for r in
                    mine.group_by("procname").aggregate([("complete", "count")]).to_pylist()}
        for op, n in sorted(kernel.items()):
            if n:
                out.append({"host": host, "procedure": op, "kernel_ops": n, "captured": seen.get(op, 0)})
    return out


def checklist(result: dict, window: tuple[int, int] | None) -> list[dict]:
    """The questions of the failure write-ups, answered with this capture's numbers."""
    out = []
    for t in result["transports"]:
        out.append(_slots_question(t, result))
        link = t["link"]
        if link:
            util = link["mean_util"]
            speed = gbps(link["speed_bps"]) if link["speed_bps"] else "unknown"
            out.append({"question": f"link utilisation during the save ({link['iface']})",
                        "answer": None if util is None else pct(util),
                        "value": f"mean {mbps(link['mean_tx_bps'])} out, peak {mbps(link['peak_bps'])}, "
                                 f"capacity {speed}"})
    if window:
        secs = (window[1] - window[0]) / 1e9
        durations = sorted(r["save_s"] for r in result["ranks"] if r["bytes_written"])
        like = durations[-1] if durations else None
        out.append({"question": "checkpoint write duration", "answer": number(secs, "s"),
                    "value": (f"ranks {number(durations[0], like=like)}-{number(durations[-1], 's')}, median "
                              f"{number(durations[len(durations) // 2], 's', like=like)}") if durations
                    else "no writes seen"})
    rerun = _rerun(result.get("saves") or [])
    if rerun:
        out.append(rerun)
    return out


def _slots_question(t: dict, result: dict) -> dict:
    """The checklist's "slot table saturated" for a transport: from its slot samples (BPF), from
    mountstats' counters (a sampled capture: whether they made a slot_saturation finding), or
    not answered."""
    limit = t["max_slots"] if not t["session_slots"] else min(t["max_slots"] or 1 << 30, t["session_slots"])
    full = t["saturated_fraction"]
    question = f"slot table saturated ({t['server']})"
    if full is not None:
        return {"question": question, "answer": "yes" if full >= 0.05 else "no",
                "value": f"peak {t['peak_in_use']} in use of {limit or '?'}, "
                         f"full {100 * full:.0f}% of the save, up to {t['backlog_peak']} waiting"}
    if "sampled" not in result:
        return {"question": question, "answer": None, "value": "no slot samples (the sunrpc probes did not run)"}
    f = next((f for f in result["findings"] if f["kind"] == "slot_saturation" and t["server"] in f["servers"]), None)
    if f is None:
        return {"question": question, "answer": "no",
                "value": f"mountstats: WRITEs did not queue for a slot (limit {limit or '?'})"}
    ev = f["evidence"]
    return {"question": question, "answer": "yes",
            "value": f"mountstats: WRITEs queued {pct(ev['queue_share'])} of their time, each send finding "
                     f"{ev['mean_backlog_per_send']} waiting; high-water {ev['peak_in_use']} of {limit or '?'} "
                     "since the mount"}


def _rerun(saves: list[dict]) -> dict | None:
    """Whether the stall comes back: each save of a recording after the first is a rerun of the
    save. None with fewer than two saves (one save cannot tell)."""
    if len(saves) < 2:
        return None
    stalled = [s for s in saves if s["verdict"] not in (None, "healthy")]
    by_verdict: dict[str, list[int]] = {}
    for s in saves:
        by_verdict.setdefault(s["verdict"] or "nothing to assess", []).append(s["number"])
    return {"question": "does it come back in a clean rerun",
            "answer": "yes" if len(stalled) == len(saves) else f"in {len(stalled)} of {len(saves)} saves" if stalled
            else "no",
            "value": "each save of the recording is a rerun: " + "; ".join(
                f"{v} in {'save' if len(n) == 1 else 'saves'} {rank_ranges(n)}" for v, n in by_verdict.items())}


def _verdict_of_the_saves(result: dict) -> None:
    """A recording healthy as a whole can hold saves that are not: a job's ranks end together at
    its last save (or its end) while one node was late in each save. The saves' verdict is then the
    recording's, the most severe first (then the most frequent), with `verdict_saves` naming the
    saves it comes from and a note saying so."""
    stalled = [s for s in result["saves"] if s["verdict"] not in (None, "healthy")]
    if result["verdict"] != "healthy" or not stalled:
        return
    def weight(v: str) -> tuple:
        mine = [s for s in stalled if s["verdict"] == v]
        return (min(SEVERITIES.index(s["findings"][0]["severity"]) if s["findings"] else len(SEVERITIES)
                    for s in mine), -len(mine))
    result["verdict"] = min(dict.fromkeys(s["verdict"] for s in stalled), key=weight)
    result["verdict_saves"] = [s["number"] for s in stalled if s["verdict"] == result["verdict"]]
    result["notes"].insert(0, f"the recording as a whole is healthy, its saves are not: the verdict is that of "
                              f"{'save' if len(result['verdict_saves']) == 1 else 'saves'} "
                              f"{rank_ranges(result['verdict_saves'])} (see each save's findings)")


def separate_note(sep: dict) -> str:
    """The note on one host's captures that do not overlap in time (Job.separate_recordings)."""
    names = [" + ".join(r) for r in sep["recordings"]]
    gaps = ", ".join(number(g, "s") for g in sep["gaps_s"])
    return (f"{sep['host']}'s captures {', '.join(names[:-1])} and {names[-1]} do not overlap in time "
            f"({gaps} apart): separate recordings, merged here as one, so the window and figures span "
            "them all; compare them by analysing each alone: "
            + "; ".join(f"slotscope analyze {' '.join(r)}" for r in sep["recordings"]))


def save_report(save: Save, result: dict) -> dict:
    """One save of the recording: what it wrote, and the analysis of its window (`result`)."""
    wrote = [r for r in result["ranks"] if r["bytes_written"]]
    slowest = max(wrote, key=lambda r: r["save_s"], default=None)
    write = result["rpc"]["by_proc"].get("WRITE") or {}
    return {
        "number": save.number, "start": iso_utc(save.start_ns), "end": iso_utc(save.end_ns),
        "duration_s": save.seconds, "first_write": iso_utc(save.first_write_ns),
        "before_first_write_ns": save.first_write_ns - save.start_ns,
        "directory": save.directory, "what": save.what["text"], "formats": save.what["formats"],
        # DESIGN.md's one format: the library's, "mixed" for a save of several, null when none is known
        "format": (save.what["formats"] or [None])[0] if len(save.what["formats"]) <= 1 else "mixed",
        "bytes": save.bytes, "files": len(save.files), "renamed": save.renamed,
        "ranks": len({(r["host"], r["rank"]) for r in wrote if r["rank"] is not None}),
        "by_rank": [{"rank": r["rank"], "host": r["host"], "pids": r["pids"], "bytes": r["bytes_written"],
                     "seconds": r["save_s"]} for r in wrote],
        "slowest_rank": slowest and {"rank": slowest["rank"], "host": slowest["host"], "pids": slowest["pids"],
                                     "seconds": slowest["save_s"]},
        "write_rpcs": write.get("count"),
        "write_execute_ns": write["execute_ns"] / write["count"] if write.get("count") else None,
        "slot_wait_ns": sum(r["slot_wait_ns"] or 0 for r in wrote) if any(r["slot_wait_ns"] is not None
                                                                            for r in wrote) else None,
        "flush_ns": sum(r["flush_ns"] for r in wrote),
        "verdict": result["verdict"], "findings": result["findings"],
    }


def context(job: Job, th: Thresholds, kernel_log: pa.Table | None = None) -> Context:
    """What the detectors and the what-if model look at."""
    ranks = rank_table(job)
    rpc = rpc_rows(job)
    window = save_window(ranks, rpc)
    return Context(job, th, ranks, transport_table(job, window), rpc, window, log_events(job, kernel_log))


def predict_fixes(ctx: Context, findings: list) -> None:
    """Each finding's fixes with their predicted effect, from one measure of the model's inputs."""
    if not {f.kind for f in findings} & set(whatif.PREDICTED):
        return
    measured, why = whatif.measure(ctx)
    for f in findings:
        f.fixes = whatif.fixes(f.kind, measured, why)
        note = whatif.elsewhere(f.fixes)
        if note:
            f.fix = f"{note}; {f.fix}"


def _fixes_of_slowest(result: dict) -> None:
    """A recording of several saves: each finding's predictions are those of its slowest save
    (the model predicts a save, and the recording's window spans the pauses between them)."""
    slowest = max(result["saves"], key=lambda s: s["duration_s"])
    by_kind = {f["kind"]: f["fixes"] for f in slowest["findings"]}
    for f in result["findings"]:
        f["fixes"] = [{**p, "save": slowest["number"]} for p in by_kind.get(f["kind"], [])]


def analyze(job: Job, version: str, thresholds: Thresholds | None = None,
            kernel_log: pa.Table | None = None, ranks_only: list[int] | None = None,
            each_save: bool = True) -> dict:
    """The whole recording's analysis and, with each_save, the same for every save in it."""
    th = thresholds or Thresholds()
    ctx = context(job, th, kernel_log)
    ranks, rpc, window, transports = ctx.ranks, ctx.rpc, ctx.window, ctx.transports
    counters = sampled.from_job(job)
    if counters:
        counters.link_util = link_util(ctx.transports)
    findings = find(ctx, sampled.detect(counters, th) if counters else [])
    if counters:
        sampled.qualify(findings, counters)
    predict_fixes(ctx, findings)
    notes = []
    nothing = not ranks and rpc is None and ctx.log is None and (counters is None or counters.ops is None)
    if nothing:
        notes.append(("nothing to assess: no NFS operation counted in mountstats" if counters else
                      "nothing to assess: no traced syscalls, RPCs or kernel log lines")
                     + (" in the window" if not job.captures[0].whole else "") if job.captures
                     else "nothing to assess")
    elif counters is not None:
        notes.append(f"sampled capture (no BPF): findings from mountstats counters and samples every "
                     f"{number(counters.interval_ns / 1e9, 's')}; {counters.confidence()}; a stall shorter than the "
                     "interval is counted but may not be seen in a sample")
    elif rpc is None and job.captures:
        notes.append("no RPC rows: slot-table, server and WRITE findings need the sunrpc/NFS probes "
                     "(a kernel with NFS); syscalls and kernel logs were analysed")
    if ranks_only is not None:
        wanted = set(ranks_only)
        ranks = [r for r in ranks if r["rank"] in wanted]
        findings = [f for f in findings if not f.ranks or wanted & set(f.ranks)]
    separate = job.separate_recordings()
    notes += [separate_note(s) for s in separate]
    saves = find_saves(job, th.save_gap_s) if each_save else None
    spans = ([(f"save {s.number}", s.start_ns, s.end_ns) for s in saves] if saves is not None
             else [("the save", *window)] if window else [])
    lost = losses(job, spans, ranks)
    many_hosts = len({c.meta.get("host") for c in job.captures}) > 1
    notes += [loss_line(x, many_hosts) for x in lost]
    result = {
        "slotscope_version": version,
        "schema": FORMAT_MAJOR,
        "captures": [{
            "path": c.path, "host": c.meta.get("host"), "kernel": c.meta.get("kernel"),
            "start": iso_utc((c.meta.get("start") or {}).get("realtime_ns")),
            "end": iso_utc((c.meta.get("stop") or {}).get("realtime_ns")),
            "lost_events": job.lost_events(c),
            "verified": verified(c.meta),
            "clock": clock_uncertainty(c.meta),
        } for c in job.captures],
        "verdict": None if nothing else verdict(findings),
        "findings": [f.as_json() for f in findings],
        "window": window and {"start": iso_utc(window[0]), "end": iso_utc(window[1]),
                              "seconds": (window[1] - window[0]) / 1e9},
        "ranks": ranks,
        "transports": [{k: v for k, v in t.items() if not k.startswith("_")} | {
            "link": t["link"] and {k: v for k, v in t["link"].items() if not k.startswith("_")}}
            for t in transports],
        "rpc": {"by_proc": by_proc(rpc)},
        "thresholds": th.as_dict(),
        "notes": notes,
        "problems": job.problems(),
        "losses": lost,
        "separate_recordings": separate,
    }
    if counters is not None:
        per_rank = sampled.waits(counters)
        result["sampled"] = {"interval_s": counters.interval_ns / 1e9, "confidence": counters.confidence(),
                             "waits": per_rank, "wait_kinds": sampled.meanings(per_rank)}
    if saves is not None:
        result["saves"] = [save_report(s, analyze(between(job, s.start_ns, s.end_ns), version, th, kernel_log,
                                                  ranks_only, each_save=False))
                           for s in saves]
        result["save_trend"] = trend(result["saves"])
        if len(result["saves"]) > 1:
            _fixes_of_slowest(result)
        _verdict_of_the_saves(result)
    result["checklist"] = checklist(result, window)
    result["kernel_check"] = kernel_check(job, rpc)
    off = [k for k in result["kernel_check"] if abs(k["captured"] - k["kernel_ops"]) > 0.01 * k["kernel_ops"]]
    if off:
        notes.append("the capture and the kernel's mountstats disagree on "
                     + ", ".join(f"{k['procedure']} ({k['captured']} captured, {k['kernel_ops']} counted on "
                                 f"{k['host']})" for k in off[:4])
                     + ": events lost, or mounts that came or went while recording")
    return result
