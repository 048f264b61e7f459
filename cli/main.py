"""The `slotscope` command. Subcommands import what they need lazily: analyze and
dump work without bcc, and nothing here imports textual unless the TUI runs."""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import math
import os
import re
import sys

from slotscope.capture.safepath import UnsafePath

EPILOG = "Run `slotscope doctor` to see what this machine can trace."
# The exit status of every command, in its --help.
EXIT_STATUS = ("exit status: 0 done; 1 an error, said in one line on stderr (a capture that cannot be read, "
               "a selection that selects nothing, a path refused); 2 a bad command line")
RECORD_EXIT = "; with -- COMMAND, the command's own status"
DEFAULT_INTERVAL = 0.1     # s between samples of a sampled recording (record --no-bpf): 10 Hz


def _record(args) -> int:
    from slotscope.agent.recorder import RecordError, RecordOptions, record, record_ebpf

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.output and not args.ebpf:
        print("slotscope record: -o/--output DIR is required", file=sys.stderr)
        return 2
    opts = RecordOptions(output=args.output, duration=args.duration, paths=args.path, fs=args.fs,
                         pids=args.pid, cgroup=args.cgroup, command=command, force=args.force,
                         group_readable=args.group_readable, status=not args.quiet, max_size=args.max_size,
                         bpf=args.bpf, interval=args.interval, bpf_stats=args.bpf_stats)
    if args.bpf_stats and args.bpf == "off":
        print("slotscope record: --bpf-stats measures the BPF programs; --no-bpf loads none", file=sys.stderr)
        return 2
    if args.interval != DEFAULT_INTERVAL and args.bpf == "on":
        print("slotscope record: --interval is the sampled recording's (--no-bpf); --bpf records every event",
              file=sys.stderr)
        return 2
    try:
        if args.ebpf:
            if args.bpf == "off":
                print("slotscope record: --ebpf prints the BPF program; --no-bpf loads none", file=sys.stderr)
                return 2
            print(record_ebpf(opts), end="")
            return 0
        if args.tui:
            if "{n}" in args.output:
                print("slotscope record: --tui follows one capture; -o cannot have {n}", file=sys.stderr)
                return 2
            from .record_tui import record_with_tui
            return record_with_tui(opts, sys.argv)
        return record(opts, sys.argv)
    except RecordError as exc:
        print(f"slotscope record: {exc}", file=sys.stderr)
        return 1


def _watch(args) -> int:
    from slotscope.agent.recorder import RecordError, record_ebpf
    from slotscope.agent.triggers import parse_triggers
    from slotscope.agent.watch import WatchOptions, watch

    if not args.out and not args.ebpf:
        print("slotscope watch: --out DIR is required", file=sys.stderr)
        return 2
    try:
        triggers = parse_triggers(args.trigger)
    except ValueError as exc:
        print(f"slotscope watch: {exc}", file=sys.stderr)
        return 2
    saves = None
    if "slow_save" in triggers:
        from slotscope.analyzer.saves import SaveClock
        from slotscope.analyzer.thresholds import Thresholds
        saves = SaveClock(Thresholds().save_gap_s)
    opts = WatchOptions(output=args.out, paths=args.path, fs=args.fs, pids=args.pid, cgroup=args.cgroup,
                        group_readable=args.group_readable, status=args.verbose, keep=args.keep,
                        keep_size=args.keep_size, after=args.after, triggers=triggers, rearm=args.rearm,
                        max_disk=args.max_disk, metrics=args.metrics, per_process=args.per_process,
                        bpf_stats=args.bpf_stats,
                        saves=saves)
    try:
        if args.ebpf:
            print(record_ebpf(opts, aggregate=True), end="")
            return 0
        return watch(opts, sys.argv)
    except RecordError as exc:
        print(f"slotscope watch: {exc}", file=sys.stderr)
        return 1


def _filter_arguments(p: argparse.ArgumentParser) -> None:
    """What record and watch trace, their files' modes, and whether they measure their programs."""
    p.add_argument("--path", action="append", default=[], metavar="PREFIX",
                   help="only files under this path (repeatable); implies --fs any unless --fs is given")
    p.add_argument("--fs", metavar="TYPE", help="only files on this filesystem type (nfs: nfs and nfs4; any: all)")
    p.add_argument("--pid", action="append", type=int, default=[], help="only this process and its descendants")
    p.add_argument("--cgroup", metavar="PATH", help="only tasks in this cgroup v2 directory (and below)")
    p.add_argument("--group-readable", action="store_true", help="capture files 0640/0750 instead of 0600/0700")
    p.add_argument("--bpf-stats", action="store_true",
                   help="turn the kernel's BPF run-time statistics on meanwhile, so that the agent table and "
                        "meta.json say how long our programs ran; they are the whole machine's and slow every BPF "
                        "program on it (two clock reads a run)")


def _doctor(args) -> int:
    from slotscope.agent.doctor import run_doctor
    return run_doctor(ebpf=args.ebpf, load=args.load)


def _open_job(paths):
    from slotscope.analyzer.allocator import use_system_allocator
    from slotscope.capture.reader import CaptureError
    from slotscope.analyzer.job import Job
    use_system_allocator()
    try:
        return Job.open(paths)
    except CaptureError as exc:
        print(f"slotscope: {exc}", file=sys.stderr)
        return None


def _analyze(args) -> int:
    from slotscope.analyzer.analysis import analyze
    from slotscope.capture.reader import CaptureError
    from slotscope.analyzer.job import Job, between, parse_when
    from slotscope.analyzer.kernel_log import KernelLogError, read_kernel_log
    from slotscope.analyzer.report_text import render_text
    from slotscope.analyzer.thresholds import Thresholds
    from slotscope.capture.meta import slotscope_version

    if args.thresholds:
        for name, default, doc in Thresholds.described():
            print(f"{name:<26} {default:<8g} {doc}")
        return 0
    if args.mountstats:
        return _analyze_mountstats(args)
    if not args.captures and not args.kernel_log:
        print("slotscope: analyze needs a CAPTURE, --kernel-log FILE or --mountstats FILE", file=sys.stderr)
        return 2
    job = _open_job(args.captures) if args.captures else Job([])
    if job is None:
        return 1
    try:
        thresholds = Thresholds().override(args.threshold)
        since = parse_when(args.since, job) if args.since else None
        until = parse_when(args.until, job) if args.until else None
        if args.save is not None:
            since, until = _save_window(job, args.save, thresholds)
        if since is not None and until is not None and since >= until:
            raise ValueError(f"--since {args.since} is not before --until {args.until}")
        logs = [read_kernel_log(path) for path in args.kernel_log]
        if since is not None or until is not None:
            whole, job = job, between(job, since, until)
            _check_selects(whole, job, "the window")
        if args.rank:
            _check_ranks(job, args.rank)
    except (ValueError, KernelLogError) as exc:
        print(f"slotscope: {exc}", file=sys.stderr)
        return 1
    try:
        import pyarrow as pa
        log = pa.concat_tables(logs) if logs else None
        result = analyze(job, slotscope_version(), thresholds, log, args.rank or None)
        if args.save is not None and len(result["saves"]) == 1:
            result["saves"][0]["number"] = args.save      # its number in the whole recording
        if args.html:
            from slotscope.analyzer.report_html import write_html
            try:
                write_html(job, result, args.html)
            except UnsafePath as exc:      # its message names the path and why
                print(f"slotscope: {exc.strerror}", file=sys.stderr)
                return 1
            except OSError as exc:
                print(f"slotscope: cannot write {args.html}: {exc.strerror}", file=sys.stderr)
                return 1
    except CaptureError as exc:
        print(f"slotscope: {exc}", file=sys.stderr)
        return 1
    if args.report:
        try:
            _write_reports(job, result, args.report)
        except OSError as exc:      # safepath's refusals name the path and why
            print(f"slotscope: cannot write the reports into {args.report}: {exc.strerror}", file=sys.stderr)
            return 1
    return _output(result, args.json, render_text, args.html and f"HTML report written to {os.path.abspath(args.html)}")


def _output(doc: dict, as_json: bool, render, written: str | None) -> int:
    """A command's result: one JSON document on stdout, or its text; where an HTML file went."""
    if as_json:
        json.dump(doc, sys.stdout, indent=2)
        print()
        if written:         # on stderr: stdout stays one JSON document
            print(f"slotscope: {written}", file=sys.stderr)
    else:
        print(render(doc))
        if written:
            print(f"\n{written}")
    return 0


def _analyze_mountstats(args) -> int:
    from slotscope.analyzer.mountstats_report import analyze_copies, copies, render
    from slotscope.analyzer.thresholds import Thresholds
    from slotscope.capture.meta import slotscope_version

    others = [name for name, given in (("CAPTURE", args.captures), ("--kernel-log", args.kernel_log),
                                       ("--html", args.html), ("--since", args.since), ("--until", args.until),
                                       ("--save", args.save is not None), ("--rank", args.rank)) if given]
    if others:
        print(f"slotscope: --mountstats reads mountstats copies alone (with --interval, --json, --threshold), "
              f"not with {', '.join(others)}", file=sys.stderr)
        return 2
    try:
        result = analyze_copies(copies(args.mountstats, args.interval), args.mountstats, slotscope_version(),
                                Thresholds().override(args.threshold))
    except ValueError as exc:          # MountstatsError, or a bad --threshold
        print(f"slotscope: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(render(result))
    return 0


def _whatif(args) -> int:
    from slotscope.analyzer import whatif
    from slotscope.analyzer.analysis import context
    from slotscope.analyzer.job import between
    from slotscope.analyzer.report_text import render_whatif
    from slotscope.analyzer.saves import find_saves
    from slotscope.analyzer.thresholds import Thresholds
    from slotscope.capture.reader import CaptureError

    if args.local_mbps is not None and not args.local_then_copy:
        print("slotscope: --local-mbps goes with --local-then-copy", file=sys.stderr)
        return 2
    change = whatif.Change(slots=args.slots, session_slots=args.session_slots, nconnect=args.nconnect,
                           write_size=args.write_size, buffered=args.buffered, local_then_copy=args.local_then_copy,
                           local_mbps=args.local_mbps or whatif.LOCAL_MBPS)
    if change.text() == whatif.NO_CHANGE:
        print("slotscope: whatif needs a change (--slots, --session-slots, --nconnect, --write-size, --buffered "
              "or --local-then-copy)", file=sys.stderr)
        return 2
    job = _open_job(args.captures)
    if job is None:
        return 1
    th = Thresholds()
    try:
        saves = find_saves(job, th.save_gap_s)
        # several saves: each its own; one: the whole recording, as analyze and compare predict it
        windows = ([(s.number, between(job, s.start_ns, s.end_ns)) for s in saves] if len(saves) > 1
                   else [(saves[0].number if saves else None, job)])
        doc = {"change": change.text(), "model": whatif.MODEL, "saves": []}
        for number, part in windows:
            measured, why = whatif.measure(context(part, th))
            doc["saves"].append({"number": number, "inputs": [whatif.inputs_json(t) for t in measured],
                                 "input_lines": [line for t in measured for line in whatif.inputs_lines(t)],
                                 "predictions": [p.as_json() for p in whatif.predict(measured, why, change)]})
    except CaptureError as exc:
        print(f"slotscope: {exc}", file=sys.stderr)
        return 1
    return _output(doc, args.json, render_whatif, None)


def _compare(args) -> int:
    from slotscope.analyzer.analysis import analyze
    from slotscope.analyzer.compare import compare, tables
    from slotscope.analyzer.report_text import render_compare
    from slotscope.capture.meta import slotscope_version
    from slotscope.capture.reader import CaptureError

    before = args.before or args.captures[:1]
    after = args.after or args.captures[1:]
    if args.captures and (args.before or args.after) or len(before) < 1 or len(after) < 1 \
            or (not args.before and len(args.captures) != 2):
        print("slotscope: compare BEFORE AFTER, or --before CAPTURE... --after CAPTURE...", file=sys.stderr)
        return 2
    jobs = [_open_job(paths) for paths in (before, after)]
    if None in jobs:
        return 1
    try:
        results = [analyze(job, slotscope_version()) for job in jobs]
        doc = compare(*jobs, *results)
        sections = tables(doc)
        if args.html:
            from slotscope.analyzer.report_html import render_compare_html, write_page
            try:
                write_page(render_compare_html(f"slotscope compare: {' '.join(before)} -> {' '.join(after)}",
                                               sections), args.html)
            except (UnsafePath, OSError) as exc:
                print(f"slotscope: {exc}", file=sys.stderr)
                return 1
    except CaptureError as exc:
        print(f"slotscope: {exc}", file=sys.stderr)
        return 1
    return _output(doc, args.json, lambda _: render_compare(sections),
                   args.html and f"HTML comparison written to {os.path.abspath(args.html)}")


def _write_reports(job, result: dict, folder: str) -> None:
    """report.txt, report.json and report.html into `folder`, each replaced whole and never
    through a planted link (safepath), 0600: an incident's reports, beside its capture."""
    from slotscope.analyzer.report_html import render_html
    from slotscope.analyzer.report_text import render_text
    from slotscope.capture.safepath import create_file
    for name, text in (("report.txt", render_text(result) + "\n"),
                       ("report.json", json.dumps(result, indent=2) + "\n"),
                       ("report.html", render_html(job, result))):
        with create_file(os.path.join(folder, name), 0o600) as f:
            f.write(text.encode())


def _holds_rows(job) -> bool:
    # through the job's memo, which analyze() then reads instead of the capture again
    return any(job.per_capture(t) for t in ("syscall", "rpc"))


def _check_selects(whole, job, what: str) -> None:
    """ValueError when a selection leaves nothing of captures that hold something: a script
    that gates on the verdict must not read an empty selection as a healthy save."""
    from slotscope.analyzer.job import iso_utc
    if not _holds_rows(whole) or _holds_rows(job):
        return
    starts = [int(c.meta["start"]["realtime_ns"]) for c in whole.captures if c.meta.get("start")]
    stops = [int(c.meta["stop"]["realtime_ns"]) for c in whole.captures if c.meta.get("stop")]
    span = f" (the capture spans {iso_utc(min(starts))} .. {iso_utc(max(stops))})" if starts and stops else ""
    raise ValueError(f"nothing was recorded in {what}{span}")


def _check_ranks(job, wanted: list[int]) -> None:
    """ValueError naming the --rank values that are no rank of the job, and the ranks there are."""
    from slotscope.analyzer.ranks import rank_table
    if not _holds_rows(job):
        return              # nothing to assess, whatever the ranks asked for
    present = sorted({r["rank"] for r in rank_table(job) if r["rank"] is not None})
    missing = sorted(set(wanted) - set(present))
    if missing:
        from slotscope.analyzer.report_text import rank_ranges
        there = f"ranks {rank_ranges(present)}" if present else "no ranked process"
        raise ValueError(f"no rank {', '.join(map(str, missing))} in the capture ({there})")


def _save_window(job, number: int, thresholds) -> tuple[int, int]:
    """The UTC window of save `number` (1, 2, ...) of the job; ValueError when there is none."""
    from slotscope.analyzer.saves import find_saves
    saves = find_saves(job, thresholds.save_gap_s)
    if not 1 <= number <= len(saves):
        raise ValueError(f"--save {number}: the capture holds {len(saves)} save{'' if len(saves) == 1 else 's'}"
                         + (f" (1-{len(saves)})" if len(saves) > 1 else ""))
    return saves[number - 1].start_ns, saves[number - 1].end_ns


def _dump(args) -> int:
    import pyarrow.csv as pacsv

    from slotscope.capture.reader import CaptureError

    from slotscope.capture.tables import TABLES
    job = _open_job([args.capture])
    if job is None:
        return 1
    cap = job.captures[0]
    if args.table not in TABLES and args.table not in cap.tables():     # an old capture's own table reads
        print(f"slotscope: unknown table '{args.table}' (tables: {', '.join(sorted(TABLES))})", file=sys.stderr)
        return 1
    try:
        table = cap.read(args.table)
    except CaptureError as exc:
        print(f"slotscope: {exc}", file=sys.stderr)
        return 1
    for p in cap.problems:
        print(f"slotscope: {p}", file=sys.stderr)
    if table is None:
        known = ", ".join(cap.tables()) or "none"
        print(f"slotscope: no rows in table '{args.table}' (tables with data: {known})", file=sys.stderr)
        return 0
    if args.format == "csv":
        flat = table.select([f.name for f in table.schema if not _nested(f.type)])
        pacsv.write_csv(flat, sys.stdout.buffer)
    elif args.format == "jsonl":
        for row in table.to_pylist():
            sys.stdout.write(json.dumps(row, default=str) + "\n")
    else:       # one JSON document: an array of the rows, written row by row
        sys.stdout.write("[")
        for n, row in enumerate(table.to_pylist()):
            sys.stdout.write((",\n" if n else "\n") + json.dumps(row, default=str))
        sys.stdout.write("\n]\n")
    return 0


def _export(args) -> int:
    from slotscope.capture.reader import CaptureError
    from slotscope.analyzer.export import ExportError, export_parquet

    try:
        done = export_parquet(args.captures, args.parquet, force=args.force)
    except (CaptureError, ExportError) as exc:
        print(f"slotscope export: {exc}", file=sys.stderr)
        return 1
    for p in done["problems"]:
        print(f"slotscope export: {p}", file=sys.stderr)
    hosts = sorted({h for per_host in done["tables"].values() for h in per_host})
    print(f"wrote {args.parquet}: {len(args.captures)} capture(s) from {len(hosts)} host(s) ({', '.join(hosts)})")
    for table, per_host in sorted(done["tables"].items()):
        print(f"  {table:<10} {sum(per_host.values()):>10} rows")
    return 0


def positive_number(unit: str):
    """A parser of a positive number of `unit` on the command line."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r}: want a positive number of {unit}")
        return value
    return parse


positive_seconds = positive_number("seconds")


SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def positive_int(text: str) -> int:
    """A count of at least 1 on the command line."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def size(text: str) -> int:
    """A size as 500M, 2G, 1.5G, 800K or bytes (units of 1024; a trailing B or iB is allowed)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    value = float(m[1]) * SIZE_UNITS[m[2].upper()] if m else 0
    if value < 2**20:
        raise argparse.ArgumentTypeError(f"{text!r}: want a size of at least 1M, such as 500M or 2G")
    return int(value)


def _nested(t) -> bool:
    import pyarrow as pa
    return pa.types.is_map(t) or pa.types.is_list(t) or pa.types.is_struct(t)


def _top(args) -> int:
    from .show import show
    job = _open_job(args.captures)
    return 1 if job is None else show(job, poll_seconds=max(args.poll, 0.05))


def _demo(args) -> int:
    from .demo import run_demo
    return run_demo(args)


def parser() -> argparse.ArgumentParser:
    from slotscope.agent import watch_defaults as wd
    from slotscope.agent.triggers import REARM_S, described
    from slotscope.capture.meta import slotscope_version
    p = argparse.ArgumentParser(prog="slotscope", description="Why does the checkpoint save stall on NFS?",
                                epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"slotscope {slotscope_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    d = sub.add_parser("doctor", help="what this machine can trace, and why not")
    d.add_argument("--ebpf", action="store_true", help="print the BPF C program of every probe group that can "
                                                       "run here (with its -D flags as #defines), and exit")
    d.add_argument("--load", action="store_true", help="also compile and load the probe groups that can run, as "
                                                       "record would, then unload them: only a compile tells whether "
                                                       "BCC and this kernel's headers agree (as long as record's "
                                                       "start); per group, the attach points expected here against "
                                                       "those that attached")
    d.set_defaults(func=_doctor)

    r = sub.add_parser("record", help="trace and write a capture (root; without it, sampled from /proc)",
                       description="Trace file syscalls (and NFS/RPC where the kernel has them) into a capture "
                                   "directory. By default only files on NFS mounts are recorded. Where BPF cannot "
                                   "be used (not root), sample /proc and mountstats instead, said in one line.")
    r.add_argument("-o", "--output", metavar="DIR",
                   help="capture directory to create (local disk); with {n} in it, each SIGUSR1 ends the "
                        "capture and starts the next, numbered from 1, without loading the probes again")
    r.add_argument("--duration", type=positive_seconds, metavar="SECONDS", help="stop after this many seconds (a traced -- COMMAND still running is stopped too)")
    r.add_argument("--max-size", type=size, metavar="SIZE",
                   help="at most this much capture (e.g. 500M, 2G); past it rows are counted as lost, not "
                        "written (default: half the free space of its filesystem at the start)")
    _filter_arguments(r)
    r.add_argument("--force", action="store_true", help="write into an existing non-empty directory")
    r.add_argument("-q", "--quiet", action="store_true", help="no status line")
    b = r.add_mutually_exclusive_group()
    b.add_argument("--no-bpf", dest="bpf", action="store_const", const="off", default="auto",
                   help="no BPF: sample /proc (the job's processes) and /proc/self/mountstats (every NFS mount) "
                        "every --interval; what an ordinary user can run. Without --bpf or --no-bpf, record "
                        "samples where BPF cannot be used (not root, no CAP_BPF), and says why in one line")
    b.add_argument("--bpf", dest="bpf", action="store_const", const="on",
                   help="BPF or nothing: fail where the probes cannot load instead of sampling")
    r.add_argument("--interval", type=positive_seconds, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help=f"between samples, when sampling (default {DEFAULT_INTERVAL:g})")
    r.add_argument("--ebpf", action="store_true",
                   help="print the BPF C program this recording would load (these filters), and exit")
    r.add_argument("--tui", action="store_true",
                   help="watch the capture in the terminal UI while it records (q or Ctrl-C stops both)")
    r.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS",
                   help="trace this command and its descendants; stop when it exits (a stop by Ctrl-C, "
                        "SIGTERM or q ends it: SIGTERM, then SIGKILL if it lingers)")
    r.set_defaults(func=_record)

    w = sub.add_parser("watch", help="stay running; keep the last minutes in memory and write an incident "
                                     "capture, analysed, when a trigger fires (root)",
                       description="Trace as record does, keeping only the last --keep seconds of rows in memory. "
                                   "When a trigger fires, those rows and the next --after seconds become a capture "
                                   "OUT/incident-<UTC>-<trigger>/ with report.txt, report.json and report.html. "
                                   "SIGTERM stops; SIGHUP reads the mounts again and re-arms the triggers.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--out", metavar="DIR", help="where incidents are written (local disk; created 0700 if "
                                                 "missing); required but with --ebpf")
    w.add_argument("--keep", type=positive_seconds, default=wd.KEEP_S, metavar="SECONDS",
                   help=f"seconds of rows kept in memory (default {wd.KEEP_S:g})")
    w.add_argument("--keep-size", type=size, default=wd.KEEP_BYTES, metavar="SIZE",
                   help=f"and at most this many bytes of them (LZ4-compressed; default {wd.KEEP_BYTES >> 20}M): "
                        "the oldest go first")
    w.add_argument("--after", type=positive_seconds, default=wd.AFTER_S, metavar="SECONDS",
                   help=f"seconds of rows after the trigger that the incident holds too (default {wd.AFTER_S:g})")
    w.add_argument("--trigger", action="append", default=[], metavar="NAME=VALUE",
                   help="change a trigger's value, or NAME=off (see the list below)")
    w.add_argument("--rearm", type=positive_seconds, default=REARM_S, metavar="SECONDS",
                   help=f"seconds a trigger's condition must stay false before it fires again (default {REARM_S:g})")
    w.add_argument("--max-disk", type=size, default=wd.MAX_DISK, metavar="SIZE",
                   help=f"incidents take at most this much disk; the oldest are removed (default {wd.MAX_DISK >> 30}G)")
    w.add_argument("--metrics", metavar="ADDR:PORT", help="serve OpenMetrics/Prometheus metrics at "
                                                         "http://ADDR:PORT/metrics")
    w.add_argument("--per-process", type=positive_int, nargs="?", const=wd.PROCESS_CAP, default=0, metavar="CAP",
                   help=f"also per-process metrics (pid, comm, rank) for at most CAP processes "
                        f"(default {wd.PROCESS_CAP})")
    _filter_arguments(w)
    w.add_argument("-v", "--verbose", action="store_true", help="a status line every 5 s")
    w.add_argument("--ebpf", action="store_true",
                   help="print the BPF C program this watch would load (these filters, its aggregates), and exit")
    w.set_defaults(func=_watch)

    a = sub.add_parser("analyze", help="name the cause of a stall from captures")
    a.add_argument("captures", nargs="*", metavar="CAPTURE", help="captures of one job (one per node)")
    a.add_argument("--json", action="store_true", help="machine output (DESIGN.md's JSON contract)")
    a.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with plots")
    a.add_argument("--report", metavar="DIR", help="also write report.txt, report.json and report.html "
                                                   "into DIR (0600)")
    a.add_argument("--since", metavar="T", help="only from T: seconds since the capture started, or ISO 8601 UTC")
    a.add_argument("--until", metavar="T", help="only until T (same forms as --since)")
    a.add_argument("--save", type=int, metavar="N", help="only save N of the recording (its window: the "
                   "saves are listed in the report); instead of --since/--until")
    a.add_argument("--rank", type=int, action="append", metavar="R", help="only rank R (repeatable)")
    a.add_argument("--kernel-log", action="append", default=[], metavar="FILE",
                   help="also read a kernel log (dmesg or journalctl -k output; also without a capture)")
    a.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override a finding's threshold (see --thresholds)")
    a.add_argument("--thresholds", action="store_true", help="list the thresholds and what they mean")
    a.add_argument("--mountstats", nargs="+", metavar="FILE",
                   help="no capture: copies of /proc/self/mountstats, two files (with --interval) or one of copies "
                        "each headed by a timestamp line; prints nfsiostat's columns explained and the findings")
    a.add_argument("--interval", type=positive_seconds, metavar="SECONDS",
                   help="with two --mountstats files: the seconds between the two copies")
    a.set_defaults(func=_analyze)

    w = sub.add_parser("whatif", help="predict each save's duration under a change (slots, nconnect, write size...)",
                       description="Predict each save's duration, the job's and each rank's, under a change, "
                                   "with a range, from Little's law on what the capture measured: round trips, "
                                   "the server's time against the RPCs in flight, WRITE sizes, the slot limit, "
                                   "the link's speed. Prints the model's inputs, and 'cannot predict' with why "
                                   "where the capture lacks one.")
    w.add_argument("captures", nargs="+", metavar="CAPTURE", help="captures of one job (one per node)")
    w.add_argument("--slots", type=positive_int, metavar="N", help="transport slots per connection "
                   "(sunrpc.tcp_max_slot_table_entries)")
    w.add_argument("--session-slots", type=positive_int, metavar="N", help="NFSv4.1 session slots")
    w.add_argument("--nconnect", type=positive_int, metavar="N", help="TCP connections per mount")
    w.add_argument("--write-size", type=positive_int, metavar="BYTES", help="bytes per write() (still synchronous)")
    w.add_argument("--buffered", action="store_true", help="write through the page cache, flush and COMMIT once "
                                                           "per file")
    w.add_argument("--local-then-copy", action="store_true", help="save to local disk, copy to NFS in the "
                                                                  "background: the blocking time and the copy's")
    w.add_argument("--local-mbps", type=positive_number("MB/s"), metavar="M", help="the local disk's write speed in MB/s "
                   "(default 1000, a datacentre NVMe SSD's sustained write, conservatively)")
    w.add_argument("--json", action="store_true", help="machine output")
    w.set_defaults(func=_whatif)

    c = sub.add_parser("compare", help="the same job before and after a change: what changed, what it bought",
                       description="Compare two recordings of the same job, before and after a change: what "
                                   "changed (mount options, sysctls, kernel; write sizes and stability), the saves "
                                   "and ranks side by side, whether each symptom of BEFORE is gone, and the error "
                                   "of BEFORE's prediction for that change (slotscope whatif).")
    c.add_argument("captures", nargs="*", metavar="BEFORE AFTER", help="one capture each")
    c.add_argument("--before", nargs="+", metavar="CAPTURE", help="the job's captures before (one per node)")
    c.add_argument("--after", nargs="+", metavar="CAPTURE", help="the job's captures after")
    c.add_argument("--json", action="store_true", help="machine output")
    c.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    c.set_defaults(func=_compare)

    from slotscope.capture.tables import TABLES
    du = sub.add_parser("dump", help="print one table of a capture")
    du.add_argument("capture")
    du.add_argument("--table", "-t", required=True, metavar="TABLE",
                    help="the table to print: " + ", ".join(sorted(TABLES)))
    du.add_argument("-O", "--format", choices=("csv", "json", "jsonl"), default="csv",
                    help="csv (nested columns left out), json (one document: an array of the rows) or "
                         "jsonl (JSON Lines: one row per line); default csv")
    du.set_defaults(func=_dump)

    ex = sub.add_parser("export", help="write captures as a Parquet dataset for DuckDB, Spark or Trino",
                        description="Write captures (one per host) as hive-partitioned Parquet: "
                                    "DIR/<table>/host=<host>/part-<capture>.parquet, plus DIR/captures.")
    ex.add_argument("captures", nargs="+", metavar="CAPTURE")
    ex.add_argument("--parquet", required=True, metavar="DIR", help="output directory (new or empty)")
    ex.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    ex.set_defaults(func=_export)

    t = sub.add_parser("top", help="watch a capture live, or replay a finished one, in a terminal UI",
                       description="Follow a capture while `slotscope record` writes it (no root needed to "
                                   "watch a capture you may read), or replay a finished one with a time cursor. "
                                   "Keys: q quit, p pause, left/right scrub, / filter, enter drill down, s sort, "
                                   "f findings, ? help. Without a terminal (a pipe, a file) it prints the "
                                   "analysis, as `analyze` does.")
    t.add_argument("captures", nargs="+", metavar="CAPTURE", help="captures of one job (one per node)")
    t.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                   help="how often to look for new data in a capture being recorded (default 1)")
    t.set_defaults(func=_top)

    de = sub.add_parser("demo", help="run the main job on the embedded default: the TUI on a terminal, else the "
                                         "analysis printed (root)",
                        description="Record the bundled workload, a checkpoint save to local disk, and show its "
                                    "analysis: the TUI on a terminal, else the text. When that save is healthy or "
                                    "the kernel has no NFS to trace, go on to the capture shipped with slotscope, a "
                                    "save stalled on NFS (--sample shows it alone).")
    de.add_argument("--ranks", type=positive_int, default=4, help="ranks of the bundled workload (default 4)")
    de.add_argument("--keep", metavar="DIR", help="write the recording into DIR (default: a new directory "
                                                  "in $TMPDIR or /tmp, kept too)")
    de.add_argument("--force", action="store_true", help="with --keep: write into an existing non-empty DIR "
                                                         "(as record --force)")
    de.add_argument("--sample", action="store_true",
                    help="analyse the shipped capture of a real NFS checkpoint storm (no root needed)")
    de.set_defaults(func=_demo)
    p.epilog = f"{EPILOG} {EXIT_STATUS}."
    for name, command in sub.choices.items():
        command.epilog = EXIT_STATUS + (RECORD_EXIT if name == "record" else "") + "."
    w.epilog = "triggers (--trigger NAME=VALUE; NAME=off turns one off):\n" + "".join(
        f"  {name:<15} default {default:<4} {doc}\n" for name, default, doc in described()) + "\n" + w.epilog
    return p


def main(argv: list[str] | None = None) -> int:
    # A fatal signal (a SIGSEGV in a C extension: one killed the agent on 7.3 with no trace) prints
    # each thread's Python stack to stderr, which the agent's log keeps; unless stderr is no file
    # (main() called in a process whose stderr is captured).
    with contextlib.suppress(io.UnsupportedOperation):
        faulthandler.enable()
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
