"""`slotscope demo`: the main job on the embedded default.

By default a live recording of the bundled checkpoint workload on the local
kernel, then its analysis (needs root). `--sample` analyses the capture shipped
with the project instead: a real checkpoint storm recorded by the agent in the VM
rig against a real NFS server (tests/vm/make-sample regenerates it).

The workload saves to local disk, which rarely stalls, and a kernel without NFS
cannot show what slotscope is for: when the local save is healthy or there is no
NFS to trace, the demo says so and goes on to the shipped capture. On a terminal
a capture opens in the TUI (`slotscope top`), after Enter for the shipped one;
without a terminal (a pipe, a file, CI) the analyses are printed instead.

The recording is kept (in a new directory under $TMPDIR, or --keep DIR), so that
every path the demo names still exists when it ends; the checkpoint is removed.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
from importlib import resources

from slotscope.agent.recorder import RecordError, RecordOptions, record
from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job
from slotscope.analyzer.report_text import WIDTH, render_text
from slotscope.capture.meta import slotscope_version

from .show import interactive, show

NFS_GROUPS = ("sunrpc", "nfs")   # without them a recording cannot see an NFS stall


def sample_path() -> str:
    return str(resources.files("slotscope.analyzer").joinpath("sample"))


def run_demo(args) -> int:
    if args.sample:
        return show(Job.open([sample_path()]))
    if os.geteuid() != 0:
        print("slotscope demo: records with BPF, which needs root: run it with sudo "
              "(or `slotscope demo --sample` for the shipped capture)", file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="slotscope-demo-")
    capture = args.keep or os.path.join(work, "capture")
    ckpt = os.path.join(work, "checkpoint")
    os.mkdir(ckpt, 0o700)
    workload = [sys.executable, "-m", "slotscope.cli.workload", "--dir", ckpt, "--ranks", str(args.ranks)]
    print(f"slotscope demo: recording the bundled workload, a {args.ranks}-rank checkpoint save to local disk "
          f"(into a temporary directory, removed at the end)", file=sys.stderr)
    try:
        status = record(RecordOptions(output=capture, paths=[ckpt], command=workload, status=False,
                                      force=args.force),
                        ["slotscope", "record", "--path", ckpt, "--"] + workload)
        if status:
            print(f"slotscope demo: the workload failed with status {status}", file=sys.stderr)
            return 1
        _show_recording(Job.open([capture]))
        print(f"\nslotscope demo: your recording is kept in {capture} (`slotscope top {capture}` replays it)",
              file=sys.stderr)
        return 0
    except RecordError as exc:
        print(f"slotscope demo: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
        try:
            os.rmdir(work)          # empty unless it holds the recording
        except OSError:
            pass


def _show_recording(job: Job) -> None:
    """The local recording; then, when it cannot show what slotscope is for, the shipped capture."""
    skipped = job.captures[0].meta.get("probes", {}).get("skipped", {})
    no_nfs = any(group in skipped for group in NFS_GROUPS)
    result = analyze(job, slotscope_version())
    verdict = result["verdict"]
    if verdict not in (None, "healthy") and not no_nfs:
        show(job)                       # a finding: the user's own story, in the TUI on a terminal
        return
    print(render_text(result))
    said = {"healthy": "is healthy", None: "has nothing to assess"}.get(verdict, f"has the verdict {verdict}")
    why = f"the save above went to local disk and {said}" + (
        ", and this kernel has no NFS client to trace" if no_nfs else "")
    then = "press Enter to open it in the terminal UI (q quits it)" if interactive() else "its analysis follows"
    print("\n" + textwrap.fill(f"slotscope demo: {why}. What slotscope is for, a checkpoint save stalled on NFS, "
                               f"is in the capture shipped with it, recorded by the agent against a real NFS "
                               f"server (`slotscope demo --sample`): {then}.", WIDTH) + "\n", flush=True)
    if interactive():
        try:
            input()
        except EOFError:
            return
    show(Job.open([sample_path()]))
