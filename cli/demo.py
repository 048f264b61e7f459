"""`slotscope demo`: the main job on the embedded default.

By default a live recording of the bundled checkpoint workload on the local
kernel, then its analysis (needs root). `--sample` analyses the capture shipped
with the project instead: a real checkpoint storm recorded by the agent in the VM
rig against a real NFS server (tests/vm/make-sample regenerates it).

On a terminal the capture opens in the TUI (`slotscope top`); without one (a pipe,
a file, CI) the analysis is printed instead.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from importlib import resources

from slotscope.agent.recorder import RecordError, RecordOptions, record
from slotscope.analyzer.job import Job

from .show import show


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
    workload = [sys.executable, "-m", "slotscope.cli.workload", "--dir", ckpt, "--ranks", str(args.ranks)]
    print(f"slotscope demo: recording a {args.ranks}-rank checkpoint save into {ckpt}", file=sys.stderr)
    try:
        status = record(RecordOptions(output=capture, paths=[ckpt], command=workload, status=False),
                        ["slotscope", "record", "--path", ckpt, "--"] + workload)
        if status:
            print(f"slotscope demo: the workload failed with status {status}", file=sys.stderr)
            return 1
        show(Job.open([capture]))
        if args.keep:
            print(f"\ncapture kept in {capture}", file=sys.stderr)
        return 0
    except RecordError as exc:
        print(f"slotscope demo: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
