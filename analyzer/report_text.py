"""The terminal report of an analysis (the dict analyze() returns), readable in 100 columns:
verdict first, then findings with their evidence and fix, the checklist, per-rank and
per-transport tables, the latency split per procedure, and what was lost."""
from __future__ import annotations

import textwrap

from . import evidence, whatif
from .job import utc_ns
from .ranks import rank_name
from .rpcs import COLUMN_LEGEND, SPLIT, split
from .units import clock, duration, ms, number, pct, pids, plural, rate, round_rate, seconds, size

WIDTH = 100
MAX_RANK_ROWS = 40


def wrap(text: str, indent: str, width: int | None = WIDTH) -> list[str]:
    if width is None:
        return [indent + text]
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


def clock_text(clock: dict | None) -> str:
    """A capture's clock (analysis captures[].clock): how far its times may be from other hosts'."""
    if not clock or clock["synchronized"] is None:
        return "clock synchronization not recorded"
    if not clock["synchronized"]:
        return "clock not synchronized (its times line up with other hosts' only as well as it was set)"
    return f"clock synchronized, within {duration(clock['uncertainty_ns'])}"


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, run = [], []
    for r in sorted(ranks):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _wrap_pairs(text: str, indent: str, width: int | None = WIDTH) -> list[str]:
    """wrap() of a list of 'label value' items separated by ', ', breaking between items only
    (a value is not parted from its label, nor a number from its unit)."""
    glued = ", ".join(item.replace(" ", "\0") for item in text.split(", "))
    return [line.replace("\0", " ") for line in wrap(glued, indent, width)]


def finding_when(f: dict) -> str:
    """A finding's time as far as it is known: '18:03:40.254 .. 18:04:03.874 UTC'; a plain
    dmesg's lines know the kernel's uptime only; '' when nothing is known."""
    start, end = utc_ns(f["start"]), utc_ns(f["end"])
    if start is not None and end is not None:
        return f"{clock(start)} .. {clock(end)} UTC" if start != end else f"at {clock(start)} UTC"
    if start is not None or end is not None:
        return f"at {clock(start if start is not None else end)} UTC"
    uptime = f["evidence"].get("kernel_uptime_s")
    return f"{evidence.label('kernel_uptime_s')} {evidence.value('kernel_uptime_s', uptime)}" if uptime else ""


def finding_lines(f: dict, width: int | None = WIDTH) -> list[str]:
    """A finding's lines, wrapped to `width`; None: one line an item, indented, for a caller
    that wraps to a width of its own (the TUI's, where a line wrapped at 100 is cut in two again)."""
    when = finding_when(f)
    out = [f"[{f['severity']}] {f['kind']}" + (f"  {when}" if when else "")]
    out += wrap(f["summary"], "  ", width)
    for line in evidence.lines(f["evidence"]):
        out += _wrap_pairs(line.lstrip(), "    " if line.startswith(" ") else "  ", width)
    who = []
    if f["ranks"]:
        who.append(f"{'rank' if len(f['ranks']) == 1 else 'ranks'} {rank_ranges(f['ranks'])}")
    if f["syscalls"]:
        who.append("syscalls " + ", ".join(f["syscalls"]))
    if f["servers"]:
        who.append(("server " if len(f["servers"]) == 1 else "servers ") + ", ".join(f["servers"]))
    if who:
        out += wrap("; ".join(who), "  ", width)
    out += wrap("fix: " + f["fix"], "  ", width)
    if f.get("confidence"):
        out += wrap(confidence_line(f), "  ", width)
    out += [line for p in f.get("fixes") or [] for line in wrap("predicted: " + whatif.line(p), "    ", width)]
    return out


def confidence_line(f: dict) -> str:
    """How sure a finding made without BPF is, and what a BPF recording would add."""
    return f"confidence {f['confidence']}; a BPF recording would add {f['bpf_would_add']}"


def _rank_rows(ranks: list[dict]) -> list[str]:
    out = [f"{'rank':>5} {'host':<8} {'pids':<9} {'written':>10} {'WRITEs':>6} {'mean WRITE':>10} "
           f"{'slot wait':>9} {'blocked':>8} {'save':>7}  top syscall (s)"]
    shown = sorted(ranks, key=lambda r: -r["blocked_ns"])[:MAX_RANK_ROWS] if len(ranks) > MAX_RANK_ROWS else ranks
    for r in shown:
        top = max(r["syscalls"].items(), key=lambda kv: kv[1]["total_ns"], default=None)
        top_text = f"{top[0]} {top[1]['count']}x {seconds(top[1]['total_ns'])}" if top else "-"
        out.append(f"{'-' if r['rank'] is None else r['rank']:>5} {r['host'][:8]:<8} {pids(r['pids']):<9} "
                   f"{size(r['bytes_written']):>10} {'-' if r['write_rpcs'] is None else r['write_rpcs']:>6} "
                   f"{size(r['mean_rpc_bytes']):>10} {seconds(r['slot_wait_ns']):>9} {seconds(r['blocked_ns']):>8} "
                   f"{r['save_s']:>7.2f}  {top_text[:WIDTH - 82]}")
    if len(shown) < len(ranks):
        out.append(f"  ... {len(ranks) - len(shown)} more ranks (the {len(shown)} most blocked are shown; "
                   "--json or --rank R for the rest)")
    return out


def _wait_rows(waits: list[dict]) -> list[str]:
    """Per rank of a sampled capture: its samples, time seen waiting on NFS, and its waits by share."""
    out = [f"{'rank':>5} {'pids':<9} {'samples':>7} {'on NFS':>7}  waits (share of samples); call, file"]
    for w in waits[:MAX_RANK_ROWS]:
        kinds = ", ".join(f"{k} {pct(v)}" for k, v in list(w["waits"].items())[:3])
        where = "; ".join(x for x in (w["syscall"], w["path"]) if x)
        out.append(f"{'-' if w['rank'] is None else w['rank']:>5} {pids(w['pids']):<9} {w['samples']:>7} "
                   f"{seconds(w['nfs_wait_s'] * 1e9):>7}  {kinds}" + (f"; {where}" if where else ""))
    if len(waits) > MAX_RANK_ROWS:
        out.append(f"  ... {len(waits) - MAX_RANK_ROWS} more (--json for all)")
    return out if waits else []


def _transport_rows(transports: list[dict]) -> list[str]:
    out = [f"{'host':<10} {'server':<22} {'slots':>6} {'peak':>5} {'full':>5} {'waiting':>7}  link"]
    for t in transports:
        link = t["link"]
        if link:
            speed = round_rate(link["speed_bps"]) if link["speed_bps"] else "speed unknown"
            util = "" if link["mean_util"] is None else f" ({pct(link['mean_util'])})"
            link_text = f"{link['iface']} {speed}, {rate(link['mean_tx_bps'])} out{util}"
        else:
            link_text = "-"
        full = "-" if t["saturated_fraction"] is None else f"{100 * t['saturated_fraction']:.0f}%"
        slots = t["max_slots"] if not t.get("session_slots") else f"{t['max_slots']}/{t['session_slots']}"
        row = (f"{t['host'][:10]:<10} {(t['server'] or '?')[:22]:<22} {slots or '?':>6} "
               f"{'-' if t['peak_in_use'] is None else t['peak_in_use']:>5} {full:>5} "
               f"{'-' if t['backlog_peak'] is None else t['backlog_peak']:>7}  ")
        out.append(row + link_text[:WIDTH - len(row)])
        for x in t.get("xprts") or []:    # the kernel's own counters, per connection
            out.append(f"  transport {x['id']}: {x['max_reqs']} slots, peak {x['peak_num_reqs']} allocated "
                       f"({x['min_reqs']} preallocated), tasks waiting for one {pct(x['saturated_fraction'])} "
                       f"of the save, up to {x['backlog_peak']}")
    return out


def _proc_rows(by_proc: dict) -> list[str]:
    out = ["  " + COLUMN_LEGEND,
           f"{'procedure':<12} {'count':>7} {'bytes':>10} "
           + "".join(f"{part.column:>8} " for part in SPLIT)
           + f"{'execute':>8} {'p50':>8} {'p99':>8}"]
    for name, p in sorted(by_proc.items(), key=lambda kv: -kv[1].get("execute_ns", 0)):
        means = split(p)
        if means is None:
            out.append(f"{name:<12} {0:>7}  ({p.get('outstanding', 0)} outstanding)")
            continue
        out.append(f"{name:<12} {p['count']:>7,} {size(p['bytes']):>10} "
                   + "".join(f"{ms(means[part.key]):>8} " for part in SPLIT)
                   + f"{ms(means['execute_ns']):>8} {ms(p['p50_ns']):>8} {ms(p['p99_ns']):>8}")
        if p.get("outstanding"):
            out.append(f"{'':<12} {'+' + str(p['outstanding']):>7}  still outstanding when recording stopped")
    return out


def _counts(items) -> list[tuple]:
    """(item, how often) in order of first appearance."""
    counts: dict = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return list(counts.items())


def slowest_rank(save: dict) -> str | None:
    """A save's slowest writer and its time: 'rank 2 (4.51 s)'."""
    slow = save["slowest_rank"]
    return slow and f"{rank_name(slow)} ({duration(1e9 * slow['seconds'])})"


def headline(result: dict) -> str | None:
    """The line under the verdict: the save window (or the saves) and the ranks in it."""
    if not result.get("window"):
        return None
    w, saves = result["window"], result.get("saves") or []
    what = f"{len(saves)} saves" if len(saves) > 1 else "save window"
    return (f"{what} {w['start']} .. {clock(utc_ns(w['end']))} UTC ({number(w['seconds'], 's')}), "
            + plural(sum(1 for r in result['ranks'] if r['rank'] is not None), "rank")
            + (", verdicts " + ", ".join(f"{v} x{n}" for v, n in _counts(s["verdict"] for s in saves))
               if len(saves) > 1 else ""))


def _save_rows(saves: list[dict], trend: dict | None) -> list[str]:
    """The recording's saves, one line each, and how they compare."""
    out = []
    for s in saves:
        out += wrap(f"save {s['number']} {clock(utc_ns(s['start']))} .. {clock(utc_ns(s['end']))} UTC ({number(s['duration_s'], 's')}): "
                     f"{s['what']}, {size(s['bytes'])}"
                     + (f"; {s['renamed']} of its {plural(s['files'], 'file')} written under a temporary name and renamed"
                        if s["renamed"] else "")
                     + f"; first write {duration(s['before_first_write_ns'])} after the first file event"
                     + (" (DCP plans the save with collectives before writing)" if "dcp" in s["formats"] else "")
                     + (f"; slowest {slowest_rank(s)}" if s["slowest_rank"] else "")
                     + f"; verdict {s['verdict'] or '-'}", "  ")
    if trend:
        out += wrap(f"trend: {trend['text']}", "  ")
    return out


def verdict_findings(result: dict) -> list[dict]:
    """The findings the verdict is made of: the recording's, or those of the first save it comes
    from (verdict_saves: the recording as a whole was healthy)."""
    if result.get("verdict_saves"):
        return next(s["findings"] for s in result["saves"] if s["number"] == result["verdict_saves"][0])
    return result["findings"]


def verdict_line(result: dict) -> str:
    head = f"verdict: {result['verdict'] or 'nothing to assess'}"
    findings = verdict_findings(result)
    if findings and result["verdict"] not in (None, "healthy"):
        head += f" ({findings[0]['severity']})"
    return head


def render_text(result: dict) -> str:
    findings = result["findings"]
    out = [verdict_line(result)]
    sub = headline(result)
    if sub:
        out.append(sub)
    out += [line for n in result["notes"] for line in wrap(f"note: {n}", "")]
    if result.get("saves"):
        out += ["", "saves" if len(result["saves"]) > 1 else "the save"]
        out += _save_rows(result["saves"], result.get("save_trend"))
    out.append("")
    out.append("findings" if findings else "findings: none")
    for f in findings:
        out += finding_lines(f)
        out.append("")
    if result.get("checklist"):
        out.append("checklist")
        for c in result["checklist"]:
            out += wrap(f"{c['question']}: {c['answer'] or '-'} ({c['value']})", "  ")
        out.append("")
    if result["ranks"] or not result.get("sampled"):
        out.append("per rank (times in seconds)")
        out += _rank_rows(result["ranks"]) if result["ranks"] else ["  (no traced syscalls on matching files)"]
    if result.get("sampled"):
        out += [f"where the ranks were (a sample every {number(result['sampled']['interval_s'], 's')})"]
        out += _wait_rows(result["sampled"]["waits"]) or ["  (no samples of the job's threads)"]
        out += wrap("waits: " + "; ".join(f"{k}: {v}" for k, v in result["sampled"]["wait_kinds"].items()), "  ")
    if result["transports"]:
        out += ["", "per transport"] + _transport_rows(result["transports"])
    if result["rpc"]["by_proc"]:
        out += ["", "RPCs by procedure (ms per RPC; p50 and p99 of execute)"] + _proc_rows(result["rpc"]["by_proc"])
    if result.get("kernel_check"):
        out += wrap("the kernel's count over the recording (mountstats), captured: " + ", ".join(
            f"{k['procedure']} {k['kernel_ops']:,}/{k['captured']:,}" for k in result["kernel_check"]), "")
    out.append("")
    for cap in result["captures"]:
        out += wrap(f"capture {cap['path']}: host {cap['host']}, kernel {cap['kernel']}, "
                     f"{cap['start'] or '?'} .. {cap['end'] or 'still recording'}, "
                     f"{plural(cap['lost_events'], 'event')} lost, {clock_text(cap.get('clock'))}"
                     + ("" if cap.get("verified", True) else ", segments not verified (written before checksums)"), "")
    out += [f"problem: {p}" for p in result["problems"]]     # unwrapped: they name paths
    return "\n".join(out)


def render_whatif(doc: dict) -> str:
    """`slotscope whatif`: the model, then per save its measured inputs and predictions, each
    rank's, and what the model leaves out."""
    out = [f"what if: {doc['change']}"]
    out += wrap("model: Little's law per transport: in flight = min(slot limit, what the ranks offer); each "
                 "WRITE holds its slot for the overhead + wire + the server's time at that load; throughput = in "
                 "flight x WRITE size / hold, at most the link's speed", "")
    for save in doc["saves"]:
        out += ["", f"save {save['number']}" if save["number"] else "the recording", "  measured:"]
        out += [part for line in save["input_lines"]
                for part in wrap(line.lstrip(), "    " + line[:len(line) - len(line.lstrip())])] or ["    -"]
        for p in save["predictions"]:
            out += wrap(whatif.line(p), "  ")
            ranks = [r for r in p["ranks"] if r.get("predicted_s") is not None]
            if ranks:
                out += wrap("per rank: " + ", ".join(
                    f"{rank_name(r)} {number(r['measured_s'], like=r['measured_s'])} -> "
                    f"{number(r['predicted_s'], 's', like=r['predicted_s'])}" for r in ranks[:16])
                    + (f", ... {len(ranks) - 16} more (--json)" if len(ranks) > 16 else ""), "    ")
            out += [line for n in p["notes"] for line in wrap(f"note: {n}", "    ")]
    return "\n".join(out)


def render_compare(sections: list[tuple[str, list[str], list[list[str]]]]) -> str:
    """`slotscope compare`: compare.tables() as aligned columns."""
    out = []
    for title, head, rows in sections:
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]
        out += ["", title] if out else [title]
        for row in ([head] if any(head) else []) + rows:
            # the last column wrapped under itself, the others kept in their columns
            lead = "  " + "".join(c.ljust(w + 2) for c, w in zip(row[:-1], widths))
            last = textwrap.wrap(row[-1], max(WIDTH - len(lead), 30), break_on_hyphens=False) or [""]
            out += [(lead + last[0]).rstrip()] + [" " * len(lead) + part for part in last[1:]]
    return "\n".join(out)
