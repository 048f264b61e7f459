#!/usr/bin/env python3
"""Where the recording agent's memory goes, in one run on this machine.

Runs `slotscope record` (the real agent, its real probes) on a directory, and reads its
/proc/PID/smaps at each phase: its start-up peak (the BPF compile), idle, after workloads
that grow per-file and per-process state (one process opening an untraced file again and
again at a busy host's pace, --opens and --open-rate; short-lived processes, --procs),
at the peak of a write storm (a writer of 4 KiB write()s as fast as it can to a traced
file, as bench/syscall_overhead.py's) and some seconds after it (--settle). Each RSS is
broken down by what its pages map:

  rings      the BPF ring buffers (anon_inode:bpf-map: kernel pages, mapped twice)
  compiler   libbcc, LLVM and clang, which BCC compiles the programs with
  libraries  every other library and the interpreter (their code and data)
  heap       anonymous memory: Python objects, malloc, Arrow's buffers (of which
             `arrow`, read in the agent by a reporter thread the bench adds), numpy arrays

against the idle agent (x idle), and the same parts of a floor: a Python process that
imports what the agent imports (numpy, pyarrow, the agent's modules) and does nothing.
Needs root.

    sudo .venv/bin/python bench/memory.py [--idle 5] [--seconds 10] [--settle 15] [--opens 100000]
                                          [--open-rate 10000] [--procs 2000] [--json]
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

from syscall_overhead import WRITER, start_agent

from slotscope.agent.memory import COMPILER, mappings

MiB = 2**20
PARTS = ("rings", "compiler", "libraries", "heap")
# The agent's CLI with a thread that writes its Arrow pool's bytes to $ARROW_REPORT every 0.1 s.
LAUNCHER = """
import os, sys, threading, time
def report():
    import pyarrow as pa
    pool, path = pa.default_memory_pool(), os.environ["ARROW_REPORT"]
    while True:
        with open(path + ".tmp", "w") as f:
            f.write(str(pool.bytes_allocated()))
        os.replace(path + ".tmp", path)
        time.sleep(0.1)
threading.Thread(target=report, daemon=True).start()
from slotscope.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
FLOOR = "import numpy, pyarrow, slotscope.agent.recorder, sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); input()"
# argv: directory, opens, opens per second (a busy host's pace: its fd histories stay short).
OPENER = """
import os, sys, time
path, n, rate = os.path.join(sys.argv[1], "f"), int(sys.argv[2]), float(sys.argv[3])
start = time.monotonic()
for i in range(n):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"x")
    os.close(fd)
    if i % 100 == 99:
        time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
"""


def breakdown(pid: int) -> dict[str, int]:
    """Bytes resident per part (PARTS), from the process's smaps."""
    parts = dict.fromkeys(PARTS, 0)
    for m in mappings(pid):
        parts[_part(m.path)] += m.kb["Rss"] * 1024
    return parts


def _part(name: str) -> str:
    if name.startswith("anon_inode:bpf-map"):
        return "rings"
    if COMPILER.search(name):
        return "compiler"
    if name.startswith("/"):
        return "libraries"
    return "heap"       # [heap], [stack], [anon], [vvar]...: nothing of a file


def status(pid: int, field: str) -> int:
    """A number of /proc/PID/status: in bytes for a size (VmRSS), as it is for a count (Threads)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                words = line.split()
                return int(words[1]) * (1024 if words[2:] == ["kB"] else 1)
    raise KeyError(field)


class Agent:
    """`slotscope record` on `traced`, with the Arrow reporter."""

    def __init__(self, work: str, traced: str):
        self.report = os.path.join(work, "arrow")
        os.environ["ARROW_REPORT"] = self.report
        self.cap = os.path.join(work, "cap")
        self.proc = start_agent(self.cap, traced, ["-c", LAUNCHER])
        self.pid = self.proc.pid

    def sample(self, label: str) -> dict:
        parts = breakdown(self.pid)
        with open(self.report) as f:
            arrow = int(f.read())
        return {"phase": label, "rss": sum(parts.values()), **parts, "arrow": arrow}

    def peak(self, label: str, best: dict | None) -> dict:
        """The high-water mark since the last reset (VmHWM), with the breakdown of the largest
        sample taken meanwhile (`best`; none: smaps says what is resident now, not at the peak)."""
        out = dict(best or dict.fromkeys((*PARTS, "arrow")), phase=label)
        out["rss"] = status(self.pid, "VmHWM")
        return out

    def reset_peak(self) -> None:
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")        # the process's peak RSS starts again from its RSS now

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        with open(os.path.join(self.cap, "meta.json")) as f:
            return json.load(f)["totals"]


def run_sampling(agent: Agent, cmd: list[str], label: str) -> dict:
    """Run `cmd` to its end, sampling the agent every 0.25 s: its peak meanwhile."""
    agent.reset_peak()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    best = None
    while proc.poll() is None:
        s = agent.sample(label)
        if best is None or s["rss"] > best["rss"]:
            best = s
        time.sleep(0.25)
    if proc.returncode:
        raise SystemExit(f"{label}: the workload failed ({proc.returncode})")
    return agent.peak(label, best)


def floor() -> dict:
    """A Python process that imports what the agent imports and does nothing else."""
    proc = subprocess.Popen([sys.executable, "-c", FLOOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    parts = breakdown(proc.pid)
    proc.communicate("\n")
    return {"phase": "floor: the imports alone", "rss": sum(parts.values()), **parts, "arrow": None}


def measure(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="slotscope-memory-") as work:
        traced, untraced = os.path.join(work, "traced"), os.path.join(work, "untraced")
        os.mkdir(traced)
        os.mkdir(untraced)
        agent = Agent(work, traced)
        try:
            rows = [agent.peak("start-up (compile)", None)]
            agent.reset_peak()
            time.sleep(args.idle)
            rows.append(agent.sample("idle"))
            # Before the storm: the memory it frees would hide their growth.
            if args.opens:
                run_sampling(agent, [sys.executable, "-c", OPENER, untraced, str(args.opens), str(args.open_rate)],
                             "opens")
                time.sleep(args.idle)
                rows.append(agent.sample(f"after {args.opens:,} opens"))
            if args.procs:
                run_sampling(agent, ["sh", "-c", f"for i in $(seq {args.procs}); do /bin/true; done"], "processes")
                time.sleep(args.idle)
                rows.append(agent.sample(f"after {args.procs:,} processes"))
            storm = [sys.executable, "-c", WRITER, os.path.join(traced, "w.bin"), str(args.seconds), "0"]
            rows.append(run_sampling(agent, storm, "write storm, peak"))
            time.sleep(args.settle)
            rows.append(agent.sample("after the storm"))
        finally:
            totals = agent.stop()
    rows.append(floor())
    idle = rows[1]["rss"]
    for row in rows:
        row["x_idle"] = row["rss"] / idle
    return {"rows": rows, "storm_rows": totals["rows"], "lost": sum(totals["lost"].values())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--idle", type=float, default=5.0, help="s the agent idles before each idle sample (default 5)")
    p.add_argument("--seconds", type=float, default=10.0, help="s of the write storm (default 10)")
    p.add_argument("--settle", type=float, default=15.0, help="s from the storm's end to the last sample (default 15)")
    p.add_argument("--opens", type=int, default=100_000, help="opens of an untraced file by one process (0: none)")
    p.add_argument("--open-rate", type=float, default=10_000, help="their pace, opens a second (default 10,000)")
    p.add_argument("--procs", type=int, default=2000, help="short-lived processes (0: none)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("needs root (BPF)", file=sys.stderr)
        return 1
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cols = ("rss", *PARTS, "arrow")
    print(f"{'MiB':<26}" + "".join(f"{c:>10}" for c in cols) + f"{'x idle':>8}")
    for row in result["rows"]:
        print(f"{row['phase']:<26}" + "".join(f"{row[c] / MiB:>10.1f}" if row[c] is not None else f"{'-':>10}"
                                            for c in cols) + f"{row['x_idle']:>8.2f}")
    print(f"the storm: {result['storm_rows']:,} rows, {result['lost']:,} events lost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
