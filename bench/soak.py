#!/usr/bin/env python3
"""Does `slotscope watch` hold for an hour: flat memory, no leaked fds (run by hand, not in CI).

Starts `slotscope watch` (real BPF on this machine's kernel: the syscall probes; --path on the
soak's own directory, --metrics on 127.0.0.1) and, every --every seconds, a save: --ranks new
processes each write a checkpoint file (--small-mib in 4 KiB write()s, then --mib in 1 MiB
write()s), fsync it and rename it over the last one; then idle. After --warmup seconds (the
flight recorder's --keep of 120 s filled), and every --interval seconds after, it reads the
watch process's RSS (VmRSS; and its children's, the incidents' analyses, if any), its open fds
(/proc/PID/fd), its threads, and scrapes its metrics endpoint once (the metrics path is soaked
too: the events, lost events and incidents come from there). At the end it stops watch with
SIGTERM and checks that it exits 0 within STOP_S (the time it took to say "stopped", its
probes detached, is printed apart).

The figures: RSS after the warm-up, its min and max, and the slope of a least-squares line
over the second half of the samples (the first half holds the allocators settling); the
lowest RSS of each sixth of the run (a leak lifts them, a burst of the host's events only
spikes); the same two for RSS less the flight recorder's rows (its metric; bounded by
--keep-size, they fill as the host's events come); the fds first, last and most. The verdict: flat if that slope, RSS less
the rows, is under --bound MiB an hour and the last sample has as many fds as the first.

With --own-cgroup the saves run in a cgroup of their own and watch traces that cgroup (`watch
--cgroup`) as well as the path: the host's other processes' calls are dropped in the kernel, so
their bursts (which the first hours' RSS steps came with) are not in the memory measured.

slow_save is off: on a host shared with other jobs, one save whose fsync waits three times the
median is the disk's weather, and an incident (its capture, its analysis process) would be
in the memory measured. The other triggers keep their defaults: none should fire.

    sudo .venv/bin/python bench/soak.py [--minutes 60] [--interval 20] [--every 15] [--ranks 4]
                                        [--mib 8] [--small-mib 1] [--warmup 150] [--bound 5]
                                        [--own-cgroup]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from memory import MiB, status
from syscall_overhead import cpu_seconds

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import cgroups  # noqa: E402  (tests/cgroups.py, which the live tests use too)

STOP_S = 10.0           # watch must exit this soon after SIGTERM
# argv: folder, rank, 4 KiB write()s, 1 MiB write()s. A rank's save: write a temporary, fsync, rename.
RANK = """
import os, sys
folder, rank, small, big = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
final = os.path.join(folder, f"rank{rank}.pt")
fd = os.open(final + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for _ in range(small):
    os.write(fd, b"p" * 4096)
for _ in range(big):
    os.write(fd, b"s" * 2**20)
os.fsync(fd)
os.close(fd)
os.replace(final + ".tmp", final)
"""
CALLS_PER_SAVE = 4      # besides its write()s: open, fsync, close, rename


class Watch:
    """`slotscope watch` on `traced`, its log in a file (an hour of it would fill a pipe nobody reads)."""

    def __init__(self, work: str, traced: str, cgroup: str | None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
        self.log = os.path.join(work, "watch.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "slotscope.cli", "watch", "--out", os.path.join(work, "out"),
                 "--path", traced, *(["--cgroup", cgroup] if cgroup else []), "--metrics", self.url.split("/")[2],
                 "--trigger", "slow_save=off"],
                stdout=subprocess.DEVNULL, stderr=log)
        self.pid = self.proc.pid
        end = time.monotonic() + 300        # the BPF compile, on a busy host
        while "watching" not in self.said():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.proc.kill()
                raise SystemExit(f"watch did not start:\n{self.said()}")
            time.sleep(0.5)

    def said(self) -> str:
        with open(self.log) as f:
            return f.read()

    def metrics(self) -> dict[str, dict[str, float]]:
        """Each sample name's values by their labels' values ("" for none)."""
        with urllib.request.urlopen(self.url, timeout=10) as r:
            text = r.read().decode()
        out: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, {})[",".join(s.labels.values())] = s.value
        return out

    def sample(self, t: float) -> dict:
        if self.proc.poll() is not None:
            raise SystemExit(f"watch exited ({self.proc.returncode}) during the soak:\n{self.said()}")
        kids = _descendants(self.pid)
        # Before the scrape: its request's thread and socket may outlive it by a moment.
        out = {"t": t, "rss": status(self.pid, "VmRSS"), "children": len(kids),
               "children_rss": sum(_rss(k) for k in kids), "fds": len(os.listdir(f"/proc/{self.pid}/fd")),
               "threads": status(self.pid, "Threads"), "cpu_s": cpu_seconds(self.pid)}
        scrape = time.monotonic()
        m = self.metrics()
        out["scrape_ms"] = (time.monotonic() - scrape) * 1e3
        out["lost_by"] = m.get("slotscope_lost_events_total", {})        # by counter
        out["incidents_by"] = m.get("slotscope_incidents_total", {})     # by trigger
        out["events"] = sum(m.get("slotscope_events_total", {}).values())
        out["flight"] = sum(m.get("slotscope_flight_recorder_bytes", {}).values())   # its rows, at most --keep-size
        out["lost"], out["incidents"] = sum(out["lost_by"].values()), sum(out["incidents_by"].values())
        return out

    def stop(self) -> dict:
        """SIGTERM, then its exit status (None: killed after a minute) and the seconds until it
        said it stopped (the probes detached, the last line of its log) and until it exited."""
        start = time.monotonic()
        said = None
        self.proc.send_signal(signal.SIGTERM)
        while self.proc.poll() is None and time.monotonic() < start + 60:
            if said is None and "stopped (" in self.said():
                said = time.monotonic() - start
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            return {"rc": None, "said_s": said, "exit_s": None}
        return {"rc": self.proc.returncode, "said_s": said, "exit_s": time.monotonic() - start}


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                out += kids
                todo += kids
        except FileNotFoundError:
            pass                # it exited meanwhile
    return out


def _rss(pid: int) -> int:
    try:
        return status(pid, "VmRSS")
    except (FileNotFoundError, KeyError):
        return 0                # exited, or a zombie


def save(folder: str, ranks: int, small: int, big: int, cgroup: str | None) -> int:
    """One save by `ranks` new processes at once (in `cgroup`, if any); -> the file calls they made."""
    procs = [subprocess.Popen([*(cgroups.into(cgroup) if cgroup else []), sys.executable, "-c", RANK, folder, str(r), str(small), str(big)])
             for r in range(ranks)]
    if any(p.wait() for p in procs):
        raise SystemExit("a rank's save failed")
    return ranks * (small + big + CALLS_PER_SAVE)


def rest(s: dict) -> float:
    """A sample's RSS less its flight recorder's rows (bounded by --keep-size, they fill as the
    host's events come): what a leak would lift."""
    return s["rss"] - s["flight"]


def slope_per_hour(samples: list[dict], value=lambda s: s["rss"]) -> float:
    """MiB an hour of a least-squares line through the second half's values (default RSS)."""
    mid = (samples[0]["t"] + samples[-1]["t"]) / 2
    half = [s for s in samples if s["t"] >= mid]
    t = np.array([s["t"] for s in half]) / 3600
    return float(np.polyfit(t, np.array([value(s) for s in half]) / MiB, 1)[0])


def floors(samples: list[dict], parts: int = 6, value=lambda s: s["rss"]) -> list[float]:
    """The lowest value (MiB; default RSS) of each part of the run: a leak lifts them, a burst's
    transient does not."""
    span = (samples[-1]["t"] - samples[0]["t"]) / parts or 1.0
    low = [float("inf")] * parts
    for s in samples:
        i = min(parts - 1, int((s["t"] - samples[0]["t"]) / span))
        low[i] = min(low[i], value(s) / MiB)
    return low


def soak(args, work: str, cgroup: str | None) -> dict:
    traced = os.path.join(work, "data")
    os.mkdir(traced)
    load = [os.getloadavg()[0]]
    watch = Watch(work, traced, cgroup)
    small, big = int(args.small_mib * 256), args.mib
    start = time.monotonic()
    end, next_save, next_sample = start + args.minutes * 60, start, start + args.warmup
    calls = saves = 0
    samples: list[dict] = []
    try:
        while True:
            now = time.monotonic()
            if now >= next_save:
                calls += save(traced, args.ranks, small, big, cgroup)
                saves += 1
                next_save += args.every
            if now >= next_sample or now >= end:
                samples.append(watch.sample(now - start))
                load.append(os.getloadavg()[0])
                s = samples[-1]
                print(f"{s['t']:7.0f} s  RSS {s['rss'] / MiB:6.1f} MiB  flight {s['flight'] / MiB:5.1f} MiB  fds {s['fds']:3d}  threads {s['threads']:2d}  "
                      f"children {s['children']}  events {s['events']:,.0f}  lost {s['lost']:,.0f}  "
                      f"incidents {s['incidents']:.0f}  load {load[-1]:.2f}", flush=True)
                next_sample += args.interval
            if now >= end:
                break
            time.sleep(max(0.0, min(next_save, next_sample, end) - time.monotonic()))
        producers = resource.getrusage(resource.RUSAGE_CHILDREN)     # watch is not reaped yet: the ranks'
    finally:
        stop = watch.stop()
    elapsed = samples[-1]["t"]
    first, last = samples[0], samples[-1]
    return {
        "minutes": elapsed / 60, "saves": saves, "calls": calls,
        "events": last["events"], "lost": last["lost_by"], "incidents": last["incidents_by"],
        "rss_start": first["rss"] / MiB, "rss_end": last["rss"] / MiB,
        "rss_min": min(s["rss"] for s in samples) / MiB, "rss_max": max(s["rss"] for s in samples) / MiB,
        "children_rss_max": max(s["children_rss"] for s in samples) / MiB,
        "slope": slope_per_hour(samples), "floors": floors(samples), "samples": len(samples),
        "rest_slope": slope_per_hour(samples, rest), "rest_floors": floors(samples, value=rest),
        "fds": (first["fds"], last["fds"], max(s["fds"] for s in samples)),
        "threads": (first["threads"], last["threads"], max(s["threads"] for s in samples)),
        "scrape_ms": max(s["scrape_ms"] for s in samples),
        "watch_cpu": (last["cpu_s"] - first["cpu_s"]) / (last["t"] - first["t"]) * 100 if len(samples) > 1 else 0.0,
        "ranks_cpu": (producers.ru_utime + producers.ru_stime) / elapsed * 100,
        "load": (min(load), sum(load) / len(load), max(load)),
        "stop": stop,
        "log": [line for line in watch.said().splitlines() if "watching" not in line],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="length of the soak (default 60)")
    p.add_argument("--interval", type=float, default=20.0, help="s between samples (default 20)")
    p.add_argument("--warmup", type=float, default=150.0, help="s before the first sample (default 150: watch's "
                                                                 "--keep of 120 s filled)")
    p.add_argument("--every", type=float, default=15.0, help="s between saves (default 15)")
    p.add_argument("--ranks", type=int, default=4, help="processes that save at once (default 4)")
    p.add_argument("--mib", type=int, default=8, help="MiB each writes in 1 MiB write()s (default 8)")
    p.add_argument("--small-mib", type=float, default=1.0, help="MiB each writes in 4 KiB write()s first (default 1)")
    p.add_argument("--bound", type=float, default=5.0, help="flat: RSS slope under this many MiB/h (default 5)")
    p.add_argument("--own-cgroup", action="store_true",
                   help="the saves in a cgroup of their own, which watch traces: the host's other calls are not in it")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # the finally clauses stop watch, remove the data
    if os.geteuid() != 0:
        print("needs root (BPF)", file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="slotscope-soak-", dir="/var/tmp")
    cgroup = None
    if args.own_cgroup:
        if (root := cgroups.cgroup2_root()) is None:
            print("--own-cgroup: no cgroup v2 hierarchy mounted", file=sys.stderr)
            return 1
        cgroup = os.path.join(root, os.path.basename(work))
        os.mkdir(cgroup)
    try:
        r = soak(args, work, cgroup)
    finally:
        shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
        if cgroup:
            os.rmdir(cgroup)        # empty: every save's ranks were awaited
    flat = r["rest_slope"] < args.bound and r["fds"][0] == r["fds"][1]
    print(f"\nsoak: {r['minutes']:.1f} min, {r['saves']} saves of {args.ranks} ranks x "
          f"({args.small_mib:g} MiB in 4 KiB + {args.mib} MiB in 1 MiB write()s, fsync, rename)")
    print(f"file calls made: {r['calls']:,}; the agent's events ({'the cgroup' if cgroup else 'every process'}'s): "
          f"{r['events']:,.0f}; "
          f"lost: {_by(r['lost'])}; incidents: {_by(r['incidents'])}")
    print(f"RSS (MiB): {r['rss_start']:.1f} after the warm-up, {r['rss_end']:.1f} at the end, "
          f"min {r['rss_min']:.1f}, max {r['rss_max']:.1f}; slope over the second half "
          f"{r['slope']:+.2f} MiB/h ({r['samples']} samples); children's RSS at most {r['children_rss_max']:.1f}")
    print("RSS floor (MiB) per sixth of the run: " + ", ".join(f"{f:.1f}" for f in r["floors"]))
    print(f"RSS less the flight recorder's rows: slope {r['rest_slope']:+.2f} MiB/h, floor per sixth "
          + ", ".join(f"{f:.1f}" for f in r["rest_floors"]))
    print("fds first/last/max: {}/{}/{}; threads first/last/max: {}/{}/{}".format(*r["fds"], *r["threads"]))
    print(f"CPU, % of a core: watch {r['watch_cpu']:.1f}, the ranks {r['ranks_cpu']:.1f}; "
          "load average min/mean/max {:.2f}/{:.2f}/{:.2f}; slowest scrape {:.0f} ms".format(*r["load"], r["scrape_ms"]))
    stop = r["stop"]
    clean = stop["rc"] == 0 and stop["exit_s"] <= STOP_S
    said = "never" if stop["said_s"] is None else f"{stop['said_s']:.1f} s"
    print("watch after SIGTERM: " + ("killed after 60 s" if stop["rc"] is None else
                                     f"exited {stop['rc']} in {stop['exit_s']:.1f} s") +
          f" (said it stopped in {said}; at most {STOP_S:g} s to exit 0)")
    print(f"its log beside the start line: {r['log'] or 'nothing'}; kept in {work}")
    print(f"verdict: {'FLAT' if flat else 'NOT FLAT'} (RSS less the flight recorder's rows: slope "
          f"{r['rest_slope']:+.2f} MiB/h against < {args.bound:g}; "
          f"fds {r['fds'][0]} -> {r['fds'][1]})" + ("" if clean else "; watch did not stop cleanly"))
    return 0 if flat and clean else 1


def _by(counts: dict[str, float]) -> str:
    return f"{sum(counts.values()):,.0f}" + "".join(f", {k} {v:,.0f}" for k, v in counts.items() if v)


if __name__ == "__main__":
    sys.exit(main())
