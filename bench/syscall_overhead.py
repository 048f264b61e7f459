#!/usr/bin/env python3
"""What the recording agent costs the process it traces, in one run on this machine.

A writer does 4 KiB write()s to a local file as fast as it can, for a fixed time,
three times: without the agent (the baseline), with `slotscope record` tracing the
file (every write becomes a row), and with the agent running but filtering the file
out (the kernel skips its fd after the first write). Figures are write()s per second
and their ratio to the baseline. Needs root.

    sudo .venv/bin/python bench/syscall_overhead.py [--seconds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
buf = b"w" * 4096
n, end = 0, time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    for _ in range(256):
        os.write(fd, buf)
    n += 256
    os.lseek(fd, 0, 0)
print(n / float(sys.argv[2]))
"""


def writer_rate(path: str, seconds: float) -> float:
    out = subprocess.run([sys.executable, "-c", WRITER, path, str(seconds)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout)


def with_agent(work: str, seconds: float, trace_prefix: str) -> tuple[float, dict]:
    cap = os.path.join(work, f"cap-{len(os.listdir(work))}")
    agent = subprocess.Popen([sys.executable, "-m", "slotscope.agent.cli", "record", "-o", cap,
                              "--path", trace_prefix, "-q"], stderr=subprocess.PIPE, text=True)
    line = agent.stderr.readline()
    if "recording" not in line:
        raise SystemExit(f"agent did not start: {line}{agent.stderr.read()}")
    try:
        rate = writer_rate(os.path.join(work, "data", "w.bin"), seconds)
    finally:
        agent.send_signal(signal.SIGINT)
        agent.wait(60)
    with open(os.path.join(cap, "meta.json")) as f:
        totals = json.load(f)["totals"]
    return rate, totals


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("needs root (BPF)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="slotscope-bench-") as work:
        os.mkdir(os.path.join(work, "data"))
        base = writer_rate(os.path.join(work, "data", "w.bin"), args.seconds)
        traced, t_tot = with_agent(work, args.seconds, os.path.join(work, "data"))
        skipped, s_tot = with_agent(work, args.seconds, os.path.join(work, "elsewhere"))
    result = {
        "baseline_writes_per_s": base,
        "traced_writes_per_s": traced, "traced_ratio": traced / base, "traced_rows": t_tot["rows"],
        "traced_lost": sum(t_tot["lost"].values()),
        "filtered_writes_per_s": skipped, "filtered_ratio": skipped / base, "filtered_rows": s_tot["rows"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'run':<34} {'write()/s':>12} {'vs baseline':>12}")
    print(f"{'no agent (baseline)':<34} {base:>12,.0f} {1:>12.3f}")
    print(f"{'agent, file traced (rows)':<34} {traced:>12,.0f} {traced / base:>12.3f}   "
          f"{t_tot['rows']:,} rows, {result['traced_lost']} lost")
    print(f"{'agent, file filtered out':<34} {skipped:>12,.0f} {skipped / base:>12.3f}   "
          f"{s_tot['rows']:,} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
