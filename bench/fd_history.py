#!/usr/bin/env python3
"""What one fd opened and closed very often costs the agent's fd table.

The agent keeps each (process, fd)'s mappings of the last few seconds (agent/files.py,
FdTable), so that an event decoded late still finds the file its fd named then. A
process that opens and closes files at a high rate (a data loader, a metadata storm)
reuses the same fd numbers: its history is rate x seconds long. This times FdTable.set()
for one fd set at several rates over 8 s of event time, and prints the cost per set as
a ratio to the slowest rate: it should stay flat (a list's pop(0) once made it grow
with the history: 0.6 us at 1,000/s, 9 us at 50,000/s).

    bench/fd_history.py [--rates 1000,10000,50000]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from slotscope.agent.files import HISTORY_NS, FdTable  # noqa: E402

SECONDS = 8


def cost_per_set(rate: int) -> tuple[float, int]:
    table, key, step = FdTable(), FdTable.key(100, 5), 10**9 // rate
    t = time.perf_counter()
    for i in range(rate * SECONDS):
        table.set(key, 10**12 + i * step, i)
    return (time.perf_counter() - t) / (rate * SECONDS), len(table.history[key])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1000,10000,50000")
    rates = [int(r) for r in ap.parse_args().rates.split(",")]
    base = None
    print(f"{'sets/s of one fd':>16} {'history':>9} {'us per set':>11} {'vs first':>9} {'% of a core':>12}")
    for rate in rates:
        cost, kept = cost_per_set(rate)
        base = base or cost
        print(f"{rate:>16,} {kept:>9,} {cost * 1e6:>11.2f} {cost / base:>9.2f} {cost * rate * 100:>12.1f}")
    print(f"(history kept: {HISTORY_NS / 1e9:g} s of mappings per fd)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
