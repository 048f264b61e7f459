"""The HTML report of an analysis: one self-contained page (inline CSS, plots as inline SVG,
no scripts, nothing fetched) with the content of the terminal report and the five plots of
plots.py, the recording's saves marked on the time plots. The style sheet is report.css,
shipped with the package and inlined here.
"""
from __future__ import annotations

import html
import math
import os
from importlib.resources import files
from typing import TYPE_CHECKING

from slotscope.capture.safepath import create_file

from .job import Job, utc_ns
from .losses import loss_when
from . import evidence, whatif
from .findings import SEVERITIES
from .report_text import (clock_text, confidence_line, finding_when, headline, rank_ranges, slowest_rank,
                          verdict_findings, verdict_line)
from .rpcs import COLUMN_LEGEND, SPLIT, split
from .units import clock, ms, number, pct, plural, rate, round_rate, seconds, size

if TYPE_CHECKING:
    from .plots import Plot

MAX_RANK_TABLE_ROWS = 256
MAX_NESTED_ROWS = 16


def write_html(job: Job, result: dict, path: str) -> None:
    """Write the report of `result` (analyze(job, ...)) to `path`, replacing it whole (written
    beside it, renamed over it), never through a planted link nor over another user's file
    (safepath). OSError when it cannot be written."""
    write_page(render_html(job, result), path)


def render_html(job: Job, result: dict) -> str:
    from .plots import build_plots      # matplotlib loads only when a report is drawn
    return _page(result, build_plots(job, result))


def _e(v) -> str:
    return html.escape("-" if v is None else str(v), quote=True)


def _severity(result: dict) -> str:
    if result["verdict"] is None:
        return "none"
    if result["verdict"] == "healthy":
        return "healthy"
    sev = [f["severity"] for f in verdict_findings(result)]
    return next((s for s in SEVERITIES if s in sev), "info")


def _table(head: list[str], rows: list[list], numeric: set[int] = frozenset(), cls: str = "",
           row_classes: list[str] | None = None) -> str:
    """A table; every cell is escaped here."""
    out = [f'<table class="{cls}">' if cls else "<table>", "<thead><tr>"]
    out += [f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>" for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for n, row in enumerate(rows):
        tr = f'<tr class="{_e(row_classes[n])}">' if row_classes else "<tr>"
        out.append(tr + "".join(f'<td class="n">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                                for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _nested(key: str, value) -> str:
    """An evidence value that is a record, a list of records or a tally: a small table in a
    <details>, its summary the value in one line when it is short."""
    head, rows = evidence.table(value)
    numeric = {i for i in range(len(head)) if all(r[i][:1].isdigit() or r[i] == "-" for r in rows)}
    body = _table(head, rows[:MAX_NESTED_ROWS], numeric=numeric)
    if len(rows) > MAX_NESTED_ROWS:
        body += f"<p class=\"note\">... {len(rows) - MAX_NESTED_ROWS} more (see --json)</p>"
    count = plural(len(rows), "row") if isinstance(value, list) else plural(len(rows), "entry", "entries")
    inline = evidence.value(key, value) if isinstance(value, dict) and len(value) <= 4 else ""
    return (f'<details><summary title="{_e(key)}">{_e(evidence.label(key))}{": " + _e(inline) if inline else ""} '
            f'<span class="when">({count})</span></summary>{body}</details>')


def _finding(f: dict) -> str:
    sev = f["severity"] if f["severity"] in SEVERITIES else "info"
    scalars = evidence.scalars(f["evidence"])
    nested = evidence.nested(f["evidence"])
    # the evidence table in up to three columns of label/value pairs; the JSON key in the title
    cols = 3 if len(scalars) > 8 else (2 if len(scalars) > 3 else 1)
    per = math.ceil(len(scalars) / cols) if scalars else 0
    grid = "".join(_evidence_table(scalars[i * per:(i + 1) * per]) for i in range(cols) if scalars[i * per:(i + 1) * per])
    who = []
    if f["ranks"]:
        who.append(f"<b>{'rank' if len(f['ranks']) == 1 else 'ranks'}</b> {_e(rank_ranges(f['ranks']))}")
    if f["syscalls"]:
        who.append(f"<b>syscalls</b> {_e(', '.join(f['syscalls']))}")
    if f["servers"]:
        who.append(f"<b>{'server' if len(f['servers']) == 1 else 'servers'}</b> {_e(', '.join(f['servers']))}")
    when = finding_when(f)
    return "".join([
        f'<article class="finding sev-{sev}" data-kind="{_e(f["kind"])}" data-severity="{_e(sev)}">',
        f'<header><span class="badge">{_e(sev)}</span><span class="kind">{_e(f["kind"])}</span>',
        f'<span class="when">{_e(when)}</span>' if when else "", "</header>",
        f'<p class="summary">{_e(f["summary"])}</p>',
        f'<div class="evidence-grid">{grid}</div>' if grid else "",
        "".join(_nested(k, v) for k, v in nested),
        f'<p class="who">{"; ".join(who)}</p>' if who else "",
        f'<p class="fix"><b>fix:</b> {_e(f["fix"])}</p>',
        f'<p class="confidence">{_e(confidence_line(f))}</p>' if f.get("confidence") else "",
        _predictions(f.get("fixes") or []),
        "</article>",
    ])


def _predictions(fixes: list[dict]) -> str:
    """The fix's changes with their predicted effect (whatif.py), one item each."""
    if not fixes:
        return ""
    items = "".join(f'<li data-change="{_e(p["change"])}">{_e(whatif.line(p))}</li>' for p in fixes)
    return f'<div class="predictions"><b>predicted:</b><ul>{items}</ul></div>'


def _evidence_table(pairs: list[tuple[str, str, str]]) -> str:
    """(key, label, value) rows: the label read, the JSON key in its title."""
    rows = "".join(f'<tr><td title="{_e(k)}">{_e(name)}</td><td class="n">{_e(text)}</td></tr>'
                   for k, name, text in pairs)
    return ('<table class="evidence"><thead><tr><th>evidence</th><th class="n">value</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>")


def _saves(result: dict) -> str:
    """The recording's saves, one row each with its verdict's colour, and how they compare."""
    saves = result["saves"]
    if not saves:
        return '<section id="saves"><h2>Saves</h2><p class="note">none: no traced file was written</p></section>'
    rows = [[s["number"], f"{clock(utc_ns(s['start']))} .. {clock(utc_ns(s['end']))} UTC",
             seconds(1e9 * s["duration_s"]), s["what"], size(s["bytes"]), slowest_rank(s) or "-", s["verdict"] or "-",
             ", ".join(dict.fromkeys(f["kind"] for f in s["findings"])) or "none"] for s in saves]
    out = ['<section id="saves"><h2>Saves</h2>',
           _table(["save", "window", "duration (s)", "what was saved", "bytes", "slowest rank", "verdict",
                   "findings"], rows, numeric={0, 2, 4}, cls="saves",
                  row_classes=[f"sev-{_severity(s)}" for s in saves])]
    if result.get("save_trend"):
        out.append(f'<p class="trend"><b>trend:</b> {_e(result["save_trend"]["text"])}</p>')
    out.append("</section>")
    return "".join(out)


def _rank_table(ranks: list[dict]) -> str:
    if not ranks:
        return '<p class="note">no traced syscalls on matching files</p>'
    shown = ranks
    if len(ranks) > MAX_RANK_TABLE_ROWS:
        shown = sorted(ranks, key=lambda r: -r["blocked_ns"])[:MAX_RANK_TABLE_ROWS]
    rows = []
    for r in shown:
        pids = ", ".join(map(str, r["pids"][:4])) + (f" +{len(r['pids']) - 4}" if len(r["pids"]) > 4 else "")
        top = max(r["syscalls"].items(), key=lambda kv: kv[1]["total_ns"], default=None)
        top_text = f"{top[0]} {top[1]['count']:,}x {seconds(top[1]['total_ns'], unit=True)}" if top else "-"
        rows.append(["-" if r["rank"] is None else r["rank"], r["host"], pids, r["comm"] or "-",
                     size(r["bytes_written"]), "-" if r["write_rpcs"] is None else f"{r['write_rpcs']:,}",
                     size(r["mean_rpc_bytes"]), seconds(r["slot_wait_ns"]), seconds(r["blocked_ns"]),
                     f"{r['save_s']:.2f}", top_text])
    out = _table(["rank", "host", "pids", "comm", "written", "WRITEs", "mean WRITE", "slot wait (s)",
                  "blocked (s)", "save (s)", "top syscall"], rows, numeric={0, 4, 5, 6, 7, 8, 9})
    if len(shown) < len(ranks):
        out += (f'<p class="note">{len(ranks) - len(shown)} more ranks: the {len(shown)} most blocked are '
                "shown (--json or --rank R for the rest)</p>")
    return out


def _wait_table(samples: dict) -> str:
    """Per rank of a sampled capture: its share of samples in each wait, the call and file."""
    rows = [["-" if w["rank"] is None else w["rank"], ", ".join(map(str, w["pids"][:4])), f"{w['samples']:,}",
             seconds(w["nfs_wait_s"] * 1e9), ", ".join(f"{k} {pct(v)}" for k, v in w["waits"].items()),
             w["syscall"] or "-", w["path"] or "-"] for w in samples["waits"][:MAX_RANK_TABLE_ROWS]]
    legend = "; ".join(f"{k}: {v}" for k, v in samples["wait_kinds"].items())
    return (_table(["rank", "pids", "samples", "on NFS (s)", "waits (share of samples)", "call", "file"], rows,
                   numeric={0, 2, 3}) + f'<p class="note">a sample every {number(samples["interval_s"], "s")}; '
            f"{_e(legend)}</p>")


def _transport_table(transports: list[dict]) -> str:
    rows = []
    for t in transports:
        link = t["link"]
        if link:
            speed = round_rate(link["speed_bps"]) if link["speed_bps"] else "speed unknown"
            util = "" if link["mean_util"] is None else f", mean {pct(link['mean_util'])}"
            peak = "" if link["peak_util"] is None else f", peak {100 * link['peak_util']:.1f}%"
            link_text = (f"{link['iface']} {speed}, {rate(link['mean_tx_bps'])} out, "
                         f"{rate(link['mean_rx_bps'])} in{util}{peak}")
        else:
            link_text = "-"
        m = t.get("mount") or {}
        mount = " ".join(f"{k}={m[k]}" for k in ("vers", "proto", "nconnect", "wsize") if m.get(k) is not None)
        slots = t["max_slots"] if not t.get("session_slots") else f"{t['max_slots']}/{t['session_slots']}"
        rows.append([t["host"], t["server"] or "?", (m.get("mountpoint") or "") + (" " + mount if mount else ""),
                     slots or "?", "-" if t["peak_in_use"] is None else t["peak_in_use"],
                     "-" if t["saturated_fraction"] is None else f"{100 * t['saturated_fraction']:.0f}%",
                     "-" if t["backlog_peak"] is None else t["backlog_peak"],
                     "-" if t.get("mean_waiting") is None else f"{t['mean_waiting']:.2f}", link_text])
        for x in t.get("xprts") or []:     # the kernel's own counters, per connection
            rows.append(["", f"transport {x['id']}", f"{x['min_reqs']} preallocated", x["max_reqs"],
                         f"{x['peak_num_reqs']} allocated", f"{100 * x['saturated_fraction']:.0f}%",
                         x["backlog_peak"], "-", ""])
    return _table(["host", "server", "mount", "slots", "peak in use", "full", "waiting peak", "mean waiting",
                   "link"], rows, numeric={3, 4, 5, 6, 7})


def _proc_table(by_proc: dict) -> str:
    head = ["procedure", "count", "bytes", *(part.column for part in SPLIT), "execute", "p50", "p99",
            "retrans/timeouts", "outstanding"]
    rows = []
    for name, p in sorted(by_proc.items(), key=lambda kv: -kv[1].get("execute_ns", 0)):
        means = split(p)
        if means is None:
            rows.append([name, 0] + ["-"] * (len(head) - 3) + [p.get("outstanding", 0)])
            continue
        rows.append([name, f"{p['count']:,}", size(p["bytes"]), *(ms(means[part.key]) for part in SPLIT),
                     ms(means["execute_ns"]), ms(p["p50_ns"]), ms(p["p99_ns"]),
                     f"{p.get('retransmits', 0)}/{p.get('timeouts', 0)}", p.get("outstanding", 0)])
    return _table(head, rows, numeric=set(range(1, len(head))))


def _figure(plot: Plot) -> str:
    attrs = f'class="plot" id="plot-{plot.name}" data-plot="{plot.name}"'
    if plot.xlims:
        lo, hi = plot.xlims[0]
        attrs += (f' data-time-axis="utc" data-xlim-utc-ns="{lo} {hi}"'
                  f' data-xlims-utc-ns="{_e(";".join(f"{a} {b}" for a, b in plot.xlims))}"'
                  f' data-axes-x="{_e(";".join(f"{a} {b}" for a, b in plot.axes_x))}"'
                  f' data-saves-utc-ns="{_e(";".join(f"{s.number} {s.start} {s.end}" for s in plot.saves))}"')
    body = plot.svg if plot.svg else f'<p class="note">{_e(plot.note)}</p>'
    caption = f"<figcaption>{_e(plot.caption.strip())}</figcaption>" if plot.caption.strip() else ""
    return f"<figure {attrs}><h3>{_e(plot.title)}</h3>{body}{caption}</figure>"


def _head(title: str) -> str:
    """The page up to <main>: its title and the inlined style sheet."""
    css = files("slotscope.analyzer").joinpath("report.css").read_text(encoding="utf-8")
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="referrer" content="no-referrer">'
            f"<title>{_e(title)}</title><style>\n{css}</style></head><body><main>")


def render_compare_html(title: str, sections: list[tuple[str, list[str], list[list[str]]]]) -> str:
    """`slotscope compare --html`: compare.tables() as a page."""
    return "".join([_head(title), f"<h1>{_e(title)}</h1>"]
                   + [f"<section><h2>{_e(name)}</h2>{_table(head, rows)}</section>" for name, head, rows in sections]
                   + ["</main></body></html>"])


def write_page(text: str, path: str) -> None:
    """Write a page to `path`, replacing it whole, never through a planted link nor over
    another user's file (safepath). OSError when it cannot be written."""
    umask = os.umask(0)
    os.umask(umask)
    with create_file(os.fspath(path), 0o666 & ~umask) as f:
        f.write(text.encode())


def _page(result: dict, plots: dict[str, Plot]) -> str:
    sev = _severity(result)
    verdict = result["verdict"] or "nothing to assess"
    head = verdict_line(result)
    sub = headline(result)
    hosts = sorted({c["host"] or "?" for c in result["captures"]})
    title = f"slotscope: {verdict} ({', '.join(hosts)})" if hosts else f"slotscope: {verdict}"
    out = [
        _head(title),
        f"<h1>slotscope {_e(result.get('slotscope_version'))} report: "
        f"{_e(', '.join(c['path'] for c in result['captures']) or 'no capture')}</h1>",
        f'<section id="verdict" class="banner sev-{sev}" data-verdict="{_e(result["verdict"] or "")}" '
        f'data-severity="{sev}"><div class="verdict">{_e(head)}</div>',
        f'<div class="sub">{_e(sub)}</div>' if sub else "",
        "</section>",
    ]
    if result["notes"]:
        out.append('<div class="notes">' + "".join(f"<p>note: {_e(n)}</p>" for n in result["notes"]) + "</div>")
    if "saves" in result:
        out.append(_saves(result))

    out.append('<section id="findings"><h2>Findings</h2>')
    if result["findings"]:
        out += [_finding(f) for f in result["findings"]]
    else:
        out.append('<p class="note">none</p>')
    out.append("</section>")

    if result.get("checklist"):
        rows = [[c["question"], c["answer"] or "-", c["value"]] for c in result["checklist"]]
        out += ['<section id="checklist"><h2>Checklist</h2>', _table(["question", "answer", "measured"], rows),
                "</section>"]

    out += ['<section id="timeline" class="timeaxis"><h2>Timeline</h2>',
            '<p class="note">The time plots share one UTC time axis (same range, aligned).</p>'
            if sum(bool(plots[n].svg) for n in ("occupancy", "link", "ranks")) > 1 else "",
            _figure(plots["occupancy"]), _figure(plots["link"]), _figure(plots["ranks"]), "</section>"]

    out += ['<section id="ranks"><h2>Per rank</h2>', _rank_table(result["ranks"]), "</section>"]
    if result.get("sampled"):
        out += ['<section id="waits"><h2>Where the ranks were (samples)</h2>', _wait_table(result["sampled"]),
                "</section>"]
    out.append('<section id="transports"><h2>Per transport</h2>')
    out.append(_transport_table(result["transports"]) if result["transports"]
               else '<p class="note">no NFS transports in this capture</p>')
    out.append("</section>")
    out.append('<section id="rpcs"><h2>RPCs by procedure</h2>')
    if result["rpc"]["by_proc"]:
        out.append(f'<p class="note">ms per RPC ({_e(COLUMN_LEGEND)}); p50 and p99 of execute</p>')
        out.append(_proc_table(result["rpc"]["by_proc"]))
    out += [_figure(plots["latency"]), "</section>"]
    out += ['<section id="sizes"><h2>Write sizes</h2>', _figure(plots["sizes"]), "</section>"]

    out.append('<section id="captures"><h2>Captures and losses</h2>')
    rows = [[c["path"], c["host"], c["kernel"], c["start"] or "?", c["end"] or "still recording",
             f"{c['lost_events']:,}", clock_text(c.get("clock"))] for c in result["captures"]]
    out.append(_table(["capture", "host", "kernel", "start", "end", "events lost", "clock"], rows, numeric={5}))
    if result.get("losses"):
        rows = [[x["host"], x["probe"], x["counter"], x["what"], f"{x['lost']:,}",
                 loss_when(x), x["effect"]]
                for x in result["losses"]]
        out.append(_table(["host", "probe", "counter", "what was lost", "events", "when", "what it can affect"],
                          rows, numeric={4}, cls="losses"))
    for p in result["problems"]:
        out.append(f'<p class="note">problem: {_e(p)}</p>')
    out.append("</section>")
    if result.get("thresholds"):
        out.append("<details><summary>thresholds used</summary>"
                   + _table(["threshold", "value"], [[k, f"{v:g}"] for k, v in result["thresholds"].items()])
                   + "</details>")
    out.append(f"<footer>slotscope {_e(result.get('slotscope_version'))}, capture format "
               f"{_e(result.get('schema'))}. Times are UTC.</footer>")
    out.append("</main></body></html>\n")
    return "\n".join(out)
