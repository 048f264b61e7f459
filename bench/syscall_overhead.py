#!/usr/bin/env python3
"""What the recording agent costs the process it traces, in one run on this machine.

A writer does 4 KiB write()s to a local file as fast as it can, for a fixed time,
three times: without the agent (the baseline), with `slotscope record` tracing the
file (every write becomes a row), and with the agent running but filtering the file
out (the kernel skips its fd after the first write). Figures are write()s per second
and their ratio to the baseline. Then the agent's own cost at a save's pace: the writer
paced to --rate write()s a second, traced, and the agent's CPU while it runs, as a
share of a core and against the writer's own CPU. Needs root.

    sudo .venv/bin/python bench/syscall_overhead.py [--seconds 3] [--rate 4000]
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

# argv: file, seconds, write()s per second (0: as fast as it can). Prints its rate and CPU s.
WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
buf = b"w" * 4096
seconds, rate = float(sys.argv[2]), float(sys.argv[3])
chunk = 256 if not rate else max(1, int(rate / 100))
n, start = 0, time.perf_counter()
while time.perf_counter() < start + seconds:
    for _ in range(chunk):
        os.write(fd, buf)
    n += chunk
    os.lseek(fd, 0, 0)
    if rate:
        time.sleep(max(0.0, start + n / rate - time.perf_counter()))
print(n / seconds, time.process_time())
"""


def writer(path: str, seconds: float, rate: float = 0) -> tuple[float, float]:
    """(write()s per second, the writer's CPU seconds)."""
    out = subprocess.run([sys.executable, "-c", WRITER, path, str(seconds), str(rate)], check=True,
                         capture_output=True, text=True)
    achieved, cpu = out.stdout.split()
    return float(achieved), float(cpu)


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Far more than a storm of a few seconds writes (~150 bytes a row): no row is dropped for size.
MAX_SIZE = "8G"
MAX_CPU_PCT = 15.0      # the goal: the agent keeps up with the traced storm within this share of a core


def start_agent(cap: str, trace_prefix: str | None, launcher: list[str] | None = None,
                options: tuple[str, ...] = ()) -> subprocess.Popen:
    """`slotscope record -o CAP --path PREFIX --max-size MAX_SIZE -q [OPTIONS]`, once it says it is
    recording (warnings, such as a --path that does not exist yet, come first). `launcher`: the
    interpreter's arguments that run the CLI (default `-m slotscope.cli`)."""
    path = ["--path", trace_prefix] if trace_prefix else []
    agent = subprocess.Popen([sys.executable, *(launcher or ["-m", "slotscope.cli"]), "record", "-o", cap,
                              *path, "--max-size", MAX_SIZE, "-q", *options], stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    while not said or "recording to" not in said[-1]:
        said.append(agent.stderr.readline())
        if not said[-1]:
            agent.wait()
            raise SystemExit(f"agent did not start: {''.join(said)}")
    return agent


def with_agent(work: str, seconds: float, trace_prefix: str, rate: float = 0) -> tuple[float, dict, float, float]:
    """-> (the writer's write()s per second, the capture's totals, the writer's and the
    agent's CPU seconds while the writer ran)."""
    cap = os.path.join(work, f"cap-{len(os.listdir(work))}")
    agent = start_agent(cap, trace_prefix)
    try:
        time.sleep(1)        # past the agent's start-up work
        before = cpu_seconds(agent.pid)
        achieved, writer_cpu = writer(os.path.join(work, "data", "w.bin"), seconds, rate)
        agent_cpu = cpu_seconds(agent.pid) - before
    finally:
        agent.send_signal(signal.SIGINT)
        agent.wait(60)
    with open(os.path.join(cap, "meta.json")) as f:
        totals = json.load(f)["totals"]
    return achieved, totals, writer_cpu, agent_cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rate", type=float, default=4000, help="the paced writer's write()s a second (default 4000)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("needs root (BPF)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="slotscope-bench-") as work:
        os.mkdir(os.path.join(work, "data"))
        base, _ = writer(os.path.join(work, "data", "w.bin"), args.seconds)
        traced, t_tot, _, t_agent = with_agent(work, args.seconds, os.path.join(work, "data"))
        skipped, s_tot, _, s_agent = with_agent(work, args.seconds, os.path.join(work, "elsewhere"))
        paced, p_tot, p_writer, p_agent = with_agent(work, args.seconds, os.path.join(work, "data"), args.rate)
    result = {
        "baseline_writes_per_s": base,
        "traced_writes_per_s": traced, "traced_ratio": traced / base, "traced_rows": t_tot["rows"],
        "traced_lost": sum(t_tot["lost"].values()),
        "traced_agent_pct_of_core": 100 * t_agent / args.seconds,
        "traced_agent_ns_per_row": 1e9 * t_agent / t_tot["rows"] if t_tot["rows"] else None,
        "filtered_writes_per_s": skipped, "filtered_ratio": skipped / base, "filtered_rows": s_tot["rows"],
        # the agent with no row of the writer's: the cost of the other processes' file calls on this host
        "filtered_agent_pct_of_core": 100 * s_agent / args.seconds,
        "paced_writes_per_s": paced, "paced_rows": p_tot["rows"], "paced_writer_cpu_s": p_writer,
        "paced_agent_cpu_s": p_agent, "paced_agent_pct_of_core": 100 * p_agent / args.seconds,
        "paced_agent_vs_writer_cpu": p_agent / p_writer if p_writer else None,
    }
    why = [f"lost {result['traced_lost']:,} events"] if result["traced_lost"] else []
    if result["traced_agent_pct_of_core"] > MAX_CPU_PCT:
        why.append(f"{result['traced_agent_pct_of_core']:.1f}% of a core > {MAX_CPU_PCT:g}%")
    result["goal"] = {"met": not why, "why": "; ".join(why) or "no loss, within the CPU budget",
                      "max_cpu_pct": MAX_CPU_PCT}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'run':<34} {'write()/s':>12} {'vs baseline':>12}")
    print(f"{'no agent (baseline)':<34} {base:>12,.0f} {1:>12.3f}")
    print(f"{'agent, file traced (rows)':<34} {traced:>12,.0f} {traced / base:>12.3f}   "
          f"{t_tot['rows']:,} rows, {result['traced_lost']} lost; the agent used "
          f"{result['traced_agent_pct_of_core']:.1f}% of a core, {result['traced_agent_ns_per_row'] or 0:.0f} ns/row")
    print(f"{'agent, file filtered out':<34} {skipped:>12,.0f} {skipped / base:>12.3f}   "
          f"{s_tot['rows']:,} rows; the agent used {result['filtered_agent_pct_of_core']:.1f}% of a core")
    print(f"paced writer, traced: {paced:,.0f} write()/s, {p_tot['rows']:,} rows; the agent used "
          f"{result['paced_agent_pct_of_core']:.1f}% of a core ({p_agent:.2f} s), "
          f"{result['paced_agent_vs_writer_cpu'] or 0:.2f}x the writer's own CPU ({p_writer:.2f} s)")
    print(f"\ngoal (the traced storm: no loss, <= {MAX_CPU_PCT:g}% of a core): "
          f"{'MET' if not why else 'NOT MET'}: {result['goal']['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
