"""`slotscope watch --metrics ADDR:PORT`: an OpenMetrics/Prometheus endpoint.

Names start with slotscope_, in base units (seconds, bytes); counters end in _total. The
figures are summed per drain, over each batch of rows at once (never per event), into a few
arrays; a scrape copies them under a lock. Labels are bounded: the syscall, the mount (the
mount point of the traced file) and, for the agent's own counters, the loss counter and the
trigger. Per-process series (pid, comm, rank) are off by default; with them on, at most
`process_cap` processes get their own series and the rest are summed under pid="other".
"""
from __future__ import annotations

import os
import resource
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import WRITE_SYSCALLS

from .mounts import MountTable

# From 100 µs (a write into the page cache) to a minute (a hard mount's retries).
LATENCY_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                     1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BOUNDS_NS = np.array([b * 1e9 for b in LATENCY_BUCKETS_S])
OTHER = "other"
PAGE = os.sysconf("SC_PAGE_SIZE")


class Metrics:
    """What the endpoint serves; fed by observe(name, rows) with every table a drain appends
    (a FlightRecorder listener), and by the watcher's own counts."""

    def __init__(self, per_process: bool = False, process_cap: int = 100):
        self.per_process, self.process_cap = per_process, process_cap
        self._lock = threading.Lock()
        self._latency: dict[tuple[str, str], np.ndarray] = {}   # (syscall, mount) -> bucket counts
        self._latency_sum: dict[tuple[str, str], float] = {}
        self._written: dict[str, int] = {}                      # mount -> bytes
        self._process_written: dict[tuple[str, str, str], int] = {}   # (pid, comm, rank) -> bytes
        self._idents: dict[int, tuple[str, str]] = {}            # tgid -> (comm, rank)
        self._lost: dict[str, int] = {}
        self._incidents: dict[str, int] = {}
        self._mounts: dict[int, str] = {}                       # dev -> mount point
        self.blocked_now = 0
        self.events = lambda: 0                                 # the watcher's count of events read
        self.flight = lambda: (0, 0.0)                          # (bytes, seconds) the flight recorder holds

    def observe(self, name: str, rows: pa.Table) -> None:
        fn = {"syscall": self._syscalls, "loss": self._loss, "procs": self._procs,
              "blocked": self._blocked}.get(name)
        if fn:
            with self._lock:
                fn(rows)

    def incident(self, trigger: str) -> None:
        with self._lock:
            self._incidents[trigger] = self._incidents.get(trigger, 0) + 1

    def _mount(self, dev: int, path: str) -> str:
        if dev not in self._mounts:
            mount = MountTable.read().find(path)
            self._mounts[dev] = mount.mountpoint if mount else "?"
        return self._mounts[dev]

    def _syscalls(self, rows: pa.Table) -> None:
        latency = rows["latency_ns"].to_numpy()
        written = rows["bytes"].fill_null(0)
        by = pa.table({"syscall": pc.cast(rows["syscall"], pa.string()), "dev": rows["dev"].fill_null(0),
                       "bucket": np.searchsorted(_BOUNDS_NS, latency, side="left"), "latency": latency,
                       "written": written, "path": rows["path"]})
        groups = by.group_by(["syscall", "dev", "bucket"]).aggregate(
            [("bucket", "count"), ("latency", "sum"), ("written", "sum"), ("path", "max")])
        for g in groups.to_pylist():
            key = (g["syscall"], self._mount(g["dev"], g["path_max"] or ""))
            if key not in self._latency:
                self._latency[key] = np.zeros(len(_BOUNDS_NS) + 1, np.int64)
                self._latency_sum[key] = 0.0
            self._latency[key][g["bucket"]] += g["bucket_count"]
            self._latency_sum[key] += g["latency_sum"] / 1e9
            if g["syscall"] in WRITE_SYSCALLS:
                self._written[key[1]] = self._written.get(key[1], 0) + g["written_sum"]
        if self.per_process:
            per = pa.table({"tgid": rows["tgid"], "written": written}).group_by("tgid").aggregate([("written", "sum")])
            for g in per.to_pylist():
                if g["written_sum"]:
                    key = self._process_key(g["tgid"])
                    self._process_written[key] = self._process_written.get(key, 0) + g["written_sum"]

    def _process_key(self, tgid: int) -> tuple[str, str, str]:
        comm, rank = self._idents.get(tgid, ("", ""))
        key = (str(tgid), comm, rank)
        if key in self._process_written or len(self._process_written) < self.process_cap:
            return key
        return (OTHER, "", "")

    def _procs(self, rows: pa.Table) -> None:
        for r in rows.select(["tgid", "comm", "rank"]).to_pylist():
            self._idents[r["tgid"]] = (r["comm"] or "", "" if r["rank"] is None else str(r["rank"]))

    def _loss(self, rows: pa.Table) -> None:
        for r in rows.group_by("counter").aggregate([("lost", "sum")]).to_pylist():
            self._lost[r["counter"]] = self._lost.get(r["counter"], 0) + r["lost_sum"]

    def _blocked(self, rows: pa.Table) -> None:
        self.blocked_now = len(set(rows["tid"].to_pylist()))

    # ---- a scrape ----
    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self._lock:
            latency = {k: v.copy() for k, v in self._latency.items()}
            sums, written = dict(self._latency_sum), dict(self._written)
            per_process, lost = dict(self._process_written), dict(self._lost)
            incidents, blocked = dict(self._incidents), self.blocked_now
        h = HistogramMetricFamily("slotscope_syscall_duration_seconds",
                                  "Traced syscalls on traced files, by how long they took (from entry to return)",
                                  labels=["syscall", "mount"])
        for key, counts in sorted(latency.items()):
            cumulative = np.cumsum(counts).tolist()
            buckets = [(f"{b:g}", c) for b, c in zip(LATENCY_BUCKETS_S, cumulative)] + [("+Inf", cumulative[-1])]
            h.add_metric(list(key), buckets, sums[key])
        yield h
        yield _counter("slotscope_written_bytes", "Bytes written by traced syscalls to traced files", ["mount"],
                       written)
        if self.per_process:
            yield _counter("slotscope_process_written_bytes",
                           f"Bytes written to traced files per process (at most {self.process_cap} processes; "
                           f"the rest as pid=\"{OTHER}\")", ["pid", "comm", "rank"], per_process)
        yield GaugeMetricFamily("slotscope_syscalls_blocked",
                                "Traced syscalls in progress for a second or more, at the last snapshot",
                                value=blocked)
        yield _counter("slotscope_lost_events", "Events lost (ring buffers full, probes missed), by counter",
                       ["counter"], lost)
        yield _counter("slotscope_incidents", "Incidents kept, by the trigger that opened them", ["trigger"],
                       incidents)
        yield CounterMetricFamily("slotscope_events", "Events read from the kernel's ring buffers",
                                  value=self.events())
        ru = resource.getrusage(resource.RUSAGE_SELF)
        yield CounterMetricFamily("slotscope_agent_cpu_seconds", "CPU time of the agent (user and system)",
                                  value=ru.ru_utime + ru.ru_stime)
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * PAGE
        yield GaugeMetricFamily("slotscope_agent_resident_memory_bytes", "Resident memory of the agent",
                                value=rss)
        held_bytes, held_s = self.flight()
        yield GaugeMetricFamily("slotscope_flight_recorder_bytes", "Rows the flight recorder holds (Arrow bytes)",
                                value=held_bytes)
        yield GaugeMetricFamily("slotscope_flight_recorder_seconds", "How far back the flight recorder reaches",
                                value=held_s)


def _counter(name: str, doc: str, labels: list[str], values: dict):
    """A counter family with a series per key of `values` (a label value, or a tuple of them)."""
    from prometheus_client.core import CounterMetricFamily
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in sorted(values.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], n)
    return family


def serve(metrics: Metrics, address: str):
    """Serve `metrics` at ADDR:PORT (a thread of prometheus_client's); -> its server, to shut down."""
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    host, port = parse_address(address)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    server, _thread = start_http_server(port, host, registry)
    return server


def parse_address(text: str) -> tuple[str, int]:
    """ADDR:PORT ([v6]:PORT too) -> (addr, port); ValueError saying what is wanted."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics {text}: want ADDR:PORT, such as 127.0.0.1:9465")
    return host.strip("[]") or "0.0.0.0", int(port)
