#!/usr/bin/env python3
"""How fast can syscall events leave the kernel, and at what cost?

One run, one machine, one producer (a C loop of 1-byte write()s to /dev/null,
pinned to one core; the consumer is pinned to another). Four passes:

  none       the producer alone: its untraced write() rate, the slowdown baseline
  perf       baseline A: BPF_PERF_OUTPUT, default page_cnt, per-event Python callback
  ringbuf    baseline B: BPF_RINGBUF_OUTPUT, per-event Python callback
  slotscope  the agent's own program (bpf/syscalls.c) drained in bulk with
             Loaded.read_batch() on the recorder's cadence (every 20 ms,
             at once when the ring is filling), decoded to Arrow columns

For each: events produced (the producer's own count), received, lost (the gap
and the kernel's own counters), the consumer's CPU time, events/s, % of a core,
ns of consumer CPU per event, and the producer's write() rate under tracing.

    sudo .venv/bin/python bench/drain.py [--seconds 5] [--quick] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from slotscope.agent import kernel
from slotscope.agent.layouts import OP_NUMBER, SYS_EVENT
from slotscope.agent.probes import DRAIN_EVERY  # the agent's own cadence
from slotscope.agent.probes import SyscallProbes as _Sys

SYS_RING_PAGES = _Sys.rings["sys_ring"][1]

# The producer reports through a shared page, not stdout: a final printf would
# be one more traced write() and spoil produced == received.
PRODUCER_C = r"""
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    uint64_t limit = (uint64_t)(atof(argv[1]) * 1e9);
    uint64_t *out = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[2]), 0);
    int fd = open("/dev/null", O_WRONLY);
    char buf[1] = {0}, go;
    struct timespec t0, t;
    uint64_t n = 0, el;

    if (out == MAP_FAILED || fd < 0)
        return 1;
    printf("ready\n");
    fflush(stdout);
    if (read(0, &go, 1) != 1)   /* the consumer says when tracing is in place */
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (int i = 0; i < 1024; i++)   /* the clock (vDSO) only every 1024 writes */
            if (write(fd, buf, 1) != 1)
                return 2;
        n += 1024;
        clock_gettime(CLOCK_MONOTONIC, &t);
        el = (uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000ull + t.tv_nsec - t0.tv_nsec;
        if (el >= limit)
            break;
    }
    out[0] = n;
    out[1] = el;
    _exit(0);
}
"""

# Baselines: the same 64-byte struct as the agent's sys_event, for one tgid,
# on sys_enter_write/sys_exit_write, the way BCC's tools are written.
BASELINE_C = r"""
BPF_HASH(start, u32, struct sys_event, 10240);
BPF_PERCPU_ARRAY(reserve_failed, u64, 1);
#ifdef USE_PERF
BPF_PERF_OUTPUT(events);
#else
BPF_RINGBUF_OUTPUT(events, RING_PAGES);
#endif

TRACEPOINT_PROBE(syscalls, sys_enter_write)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TGID)
        return 0;
    struct sys_event e = {};
    e.ts_enter = bpf_ktime_get_ns();
    e.count = args->count;
    e.offset = -1;
    e.tid = id;
    e.tgid = id >> 32;
    e.fd = args->fd;
    e.fd2 = -1;
    e.op = OP_WRITE;
    u32 tid = id;
    start.update(&tid, &e);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_write)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != TGID)
        return 0;
    u32 tid = id;
    struct sys_event *s = start.lookup(&tid);
    if (!s)
        return 0;
    s->ts_exit = bpf_ktime_get_ns();
    s->ret = args->ret;
#ifdef USE_PERF
    events.perf_submit(args, s, sizeof(*s));   /* losses: the lost callback */
#else
    struct sys_event *e = events.ringbuf_reserve(sizeof(struct sys_event));
    if (!e) {
        int zero = 0;
        u64 *v = reserve_failed.lookup(&zero);
        if (v)
            (*v)++;
    } else {
        __builtin_memcpy(e, s, sizeof(*e));
        events.ringbuf_submit(e, 0);
    }
#endif
    start.delete(&tid);
    return 0;
}
"""


class Producer:
    """The write() loop, spawned and held at its start line until go()."""

    def __init__(self, exe: str, seconds: float, cpu: int | None):
        self.shm = os.memfd_create("drain-producer")
        os.ftruncate(self.shm, 4096)
        self.proc = subprocess.Popen([exe, str(seconds), str(self.shm)], pass_fds=(self.shm,),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if cpu is not None:
            os.sched_setaffinity(self.proc.pid, {cpu})
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("producer did not start")
        self.pid = self.proc.pid

    def go(self) -> None:
        self.proc.stdin.write(b"g")
        self.proc.stdin.flush()

    def running(self) -> bool:
        return self.proc.poll() is None

    def result(self) -> tuple[int, float]:
        """(writes done, seconds taken)."""
        if self.proc.wait() != 0:
            raise RuntimeError(f"producer failed with status {self.proc.returncode}")
        n, ns = np.frombuffer(os.pread(self.shm, 16, 0), np.uint64)
        return int(n), ns / 1e9

    def kill(self) -> None:
        if self.running():
            self.proc.kill()
            self.proc.wait()
        if self.shm is not None:
            os.close(self.shm)
            self.shm = None


class NoTracing:
    name, label = "none", "no tracing"

    def __init__(self, pid: int):
        self.received = 0

    def drain(self) -> None:
        time.sleep(0.05)

    def kernel_lost(self) -> int:
        return 0

    def close(self) -> None:
        pass


class PerfBaseline:
    """Baseline A: BCC's defaults, a per-event callback decoding with ctypes."""
    name, label = "perf", "A: perf buffer, per-event callback"

    def __init__(self, pid: int):
        from bcc import BPF
        self.bpf = BPF(text=SYS_EVENT.c_struct() + BASELINE_C,
                       cflags=[f"-DTGID={pid}", f"-DOP_WRITE={OP_NUMBER['write']}", "-DUSE_PERF"])
        self.received = self.lost = self.bytes = 0
        self.bpf["events"].open_perf_buffer(self._event, lost_cb=self._lost)  # page_cnt=8

    def _event(self, cpu, data, size):
        ev = self.bpf["events"].event(data)
        self.received += 1
        self.bytes += ev.ret

    def _lost(self, count):
        self.lost += count

    def drain(self) -> None:
        self.bpf.perf_buffer_poll(timeout=50)

    def kernel_lost(self) -> int:
        return self.lost

    def close(self) -> None:
        self.bpf.cleanup()


class RingbufBaseline:
    """Baseline B: a BPF ring buffer (as large as the agent's), per-event callback."""
    name, label = "ringbuf", "B: ring buffer, per-event callback"

    def __init__(self, pid: int):
        from bcc import BPF
        self.bpf = BPF(text=SYS_EVENT.c_struct() + BASELINE_C,
                       cflags=[f"-DTGID={pid}", f"-DOP_WRITE={OP_NUMBER['write']}",
                               f"-DRING_PAGES={SYS_RING_PAGES}"])
        self.received = self.bytes = 0
        self.bpf["events"].open_ring_buffer(self._event)

    def _event(self, ctx, data, size):
        ev = self.bpf["events"].event(data)
        self.received += 1
        self.bytes += ev.ret

    def drain(self) -> None:
        self.bpf.ring_buffer_poll(timeout=50)

    def kernel_lost(self) -> int:
        return int(sum(self.bpf["reserve_failed"][0]))

    def close(self) -> None:
        self.bpf.cleanup()


class Slotscope:
    """The agent's program and bulk reader; Arrow decoding counts as consumer CPU."""
    name, label = "slotscope", "slotscope: bulk ring read + Arrow"

    def __init__(self, pid: int, poll_ms: float | None = None):
        from slotscope.agent.layouts import warm_up
        from slotscope.agent.probes import Filters, SyscallProbes, load
        probes = SyscallProbes()
        reason = probes.can_run()
        if reason:
            raise RuntimeError(reason)
        self.pid = pid
        self.poll = DRAIN_EVERY if poll_ms is None else poll_ms / 1000
        self.loaded = load([probes], Filters(tgids=[pid]))
        warm_up()    # as the recorder does: pyarrow's lazy start-up (~0.15 s) is not a drain's cost
        self.received = self.bytes = self.other = self.batches = 0
        self.max_fill = 0.0

    def drain(self) -> None:
        self.max_fill = max(self.max_fill, self.loaded.fill())
        batch = self.loaded.read_batch()
        sys_ev = batch["sys_ring"]
        if len(sys_ev):
            cols = SYS_EVENT.to_arrow(sys_ev)
            mine = (sys_ev["tgid"] == self.pid) & (sys_ev["op"] == OP_NUMBER["write"])
            n = int(np.count_nonzero(mine))
            self.received += n
            self.other += len(sys_ev) - n
            self.bytes += int(cols["ret"].to_numpy().sum())
            self.batches += 1
        for name in ("path_ring", "proc_ring"):
            if len(batch[name]):
                self.loaded.rings[name].layout.to_arrow(batch[name])
        self.loaded.wait(self.poll)  # as the recorder

    def kernel_lost(self) -> int:
        loss = self.loaded.loss_totals()
        return loss["sys_ring_full"] + loss["inflight_full"]

    def close(self) -> None:
        self.loaded.close()


def rusage_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(method_cls, exe: str, seconds: float, cpus: tuple, **kw) -> dict:
    prod = Producer(exe, seconds, cpus[0])
    method = None
    try:
        method = method_cls(prod.pid, **kw)  # compiles and attaches before the producer starts
        t0, c0, r0 = time.monotonic(), time.thread_time(), rusage_cpu()
        prod.go()
        t_last = t0
        while prod.running():
            before = method.received
            method.drain()
            if method.received != before:
                t_last = time.monotonic()
        produced, prod_s = prod.result()
        # Tail: what is still in the buffers, until all is accounted for or it goes quiet.
        idle_since = time.monotonic()
        while (method.received + method.kernel_lost() < produced
               and time.monotonic() - idle_since < 0.5 and method.name != "none"):
            before = method.received
            method.drain()
            if method.received != before:
                t_last = idle_since = time.monotonic()
        cpu = time.thread_time() - c0
        cpu_rusage = rusage_cpu() - r0
        wall = time.monotonic() - t0
        kernel_lost = method.kernel_lost()  # before close(): the counters live in the maps
        extra = {k: getattr(method, k) for k in ("bytes", "other", "batches", "max_fill") if hasattr(method, k)}
    finally:
        prod.kill()
        if method is not None:
            method.close()
    received = method.received
    traced = method.name != "none"
    return {
        "method": method.name, "label": method.label,
        "produced": produced, "producer_seconds": prod_s, "producer_writes_per_s": produced / prod_s,
        "received": received if traced else None,
        "lost": produced - received if traced else None,
        "kernel_lost": kernel_lost if traced else None,
        "consumer_cpu_s": cpu, "consumer_cpu_rusage_s": cpu_rusage, "wall_s": wall,
        "events_per_s": received / max(t_last - t0, 1e-9) if traced else None,
        "cpu_pct_of_core": 100 * cpu / wall,
        "ns_per_event": 1e9 * cpu / received if traced and received else None,
        **extra,
    }


def build_producer(tmp: str) -> str:
    src, exe = os.path.join(tmp, "producer.c"), os.path.join(tmp, "producer")
    with open(src, "w") as f:
        f.write(PRODUCER_C)
    subprocess.run(["gcc", "-O2", "-o", exe, src], check=True)
    return exe


def pick_cpus() -> tuple:
    """(producer cpu, consumer cpu); no pinning on a single-core machine."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return (None, None)
    os.sched_setaffinity(0, {allowed[1]})
    return (allowed[0], allowed[1])


def add_ratios(results: list[dict]) -> None:
    base = {r["method"]: r for r in results}
    none, a = base.get("none"), base.get("perf")
    for r in results:
        if "error" in r:
            continue
        if none:
            r["producer_slowdown"] = none["producer_writes_per_s"] / r["producer_writes_per_s"]
        if a and "error" not in a and r["events_per_s"] and a["events_per_s"]:
            r["x_baseline_a_events_per_s"] = r["events_per_s"] / a["events_per_s"]
            if r["ns_per_event"] and a["ns_per_event"]:
                r["x_baseline_a_cpu_per_event"] = a["ns_per_event"] / r["ns_per_event"]


def goal(results: list[dict], max_cpu_pct: float = 15.0) -> dict:
    """The issue's goal: no loss, Arrow-decoded, at most 15% of a core."""
    s = next((r for r in results if r["method"] == "slotscope" and "error" not in r), None)
    if s is None:
        return {"met": False, "why": "slotscope did not run"}
    why = []
    if s["lost"] or s["kernel_lost"]:
        why.append(f"lost {s['lost']} events (kernel counted {s['kernel_lost']})")
    if s["cpu_pct_of_core"] > max_cpu_pct:
        why.append(f"{s['cpu_pct_of_core']:.1f}% of a core > {max_cpu_pct}%")
    return {"met": not why, "why": "; ".join(why) or "no loss, within the CPU budget",
            "max_cpu_pct": max_cpu_pct}


def fmt_table(results: list[dict]) -> str:
    head = ("method", "produced", "received", "lost", "kern.lost", "M ev/s", "prod M wr/s",
            "slowdown", "CPU s", "% core", "ns/ev", "x A ev/s", "x A cpu/ev")
    rows = [head]
    for r in results:
        if "error" in r:
            rows.append((r["method"], "error: " + r["error"][:60]) + ("",) * (len(head) - 2))
            continue
        f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        rows.append((r["method"], f(r["produced"], ","), f(r["received"], ","), f(r["lost"], ","),
                     f(r["kernel_lost"], ","), f(r["events_per_s"] and r["events_per_s"] / 1e6, ".2f"),
                     f(r["producer_writes_per_s"] / 1e6, ".2f"), f(r.get("producer_slowdown"), ".2f") + "x",
                     f(r["consumer_cpu_s"], ".3f"), f(r["cpu_pct_of_core"], ".1f"), f(r["ns_per_event"], ".0f"),
                     f(r.get("x_baseline_a_events_per_s"), ".1f"), f(r.get("x_baseline_a_cpu_per_event"), ".1f")))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def summary_line(r: dict) -> str:
    if "error" in r:
        return f"{r['method']}: error: {r['error']}"
    if r["method"] == "none":
        return f"no tracing: producer {r['producer_writes_per_s'] / 1e6:.2f} M write()/s"
    ratio = r.get("x_baseline_a_events_per_s")
    return (f"{r['method']}: {r['events_per_s'] / 1e6:.2f} M ev/s, {r['lost']:,} lost "
            f"(kernel counted {r['kernel_lost']:,}), {r['cpu_pct_of_core']:.0f}% of a core, "
            f"{r['ns_per_event'] or 0:.0f} ns CPU/event"
            + (f", {ratio:.1f}x baseline A" if ratio and r["method"] != "perf" else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="producer run time per method (default 5)")
    ap.add_argument("--quick", action="store_true", help="1 s per method (smoke test)")
    ap.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    ap.add_argument("--poll-ms", type=float, default=None,
                    help=f"slotscope's drain cadence (default: the recorder's, {DRAIN_EVERY * 1000:g} ms)")
    ap.add_argument("--methods", default="none,perf,ringbuf,slotscope", help="comma-separated subset")
    args = ap.parse_args(argv)
    seconds = 1.0 if args.quick else args.seconds

    if os.geteuid() != 0:
        print("drain.py needs root (BPF): run it with sudo", file=sys.stderr)
        return 2
    if kernel.ensure_tracefs() is None:  # before bcc is imported: bcc picks tracefs at import
        print("tracefs is not mounted", file=sys.stderr)
        return 2
    err = kernel.bcc_import_error()
    if err:
        print(f"cannot import bcc: {err}", file=sys.stderr)
        return 2

    classes = {c.name: c for c in (NoTracing, PerfBaseline, RingbufBaseline, Slotscope)}
    cpus = pick_cpus()
    results = []
    with tempfile.TemporaryDirectory(prefix="slotscope-drain-") as tmp:
        exe = build_producer(tmp)
        for name in args.methods.split(","):
            kw = {"poll_ms": args.poll_ms} if name == "slotscope" else {}
            if not args.json:
                print(f"running {name} for {seconds:g} s ...", file=sys.stderr)
            try:
                results.append(measure(classes[name], exe, seconds, cpus, **kw))
            except Exception as exc:  # one broken method must not hide the others' figures
                results.append({"method": name, "error": f"{type(exc).__name__}: {exc}"})
    add_ratios(results)
    verdict = goal(results)
    out = {"kernel": os.uname().release, "cpus": os.cpu_count(), "pinning": {"producer": cpus[0], "consumer": cpus[1]},
           "seconds_per_method": seconds, "poll_ms": args.poll_ms or DRAIN_EVERY * 1000, "sys_ring_pages": SYS_RING_PAGES,
           "methods": results, "goal": verdict}
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(fmt_table(results))
        print()
        for r in results:
            print(summary_line(r))
        print(f"\ngoal (no loss, Arrow columns, <= {verdict.get('max_cpu_pct', 15)}% of a core): "
              f"{'MET' if verdict['met'] else 'NOT MET'}: {verdict['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
