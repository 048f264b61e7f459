"""`slotscope watch --metrics ADDR:PORT`: an OpenMetrics/Prometheus endpoint.

Names start with slotscope_, in base units (seconds, bytes); counters end in _total. Most
figures come from the kernel's own aggregates (aggregates.py), read with one sweep of their
maps per drain and added here (sweep()): the RPCs' histograms, the transports' integrals, the
calls on traced fds and what each process wrote. The calls that name a path (open, stat,
rename...), which the kernel cannot tell traced, come from their rows (observe()), summed per
batch (never per event). A scrape copies the figures under a lock. Labels are bounded: the syscall, the mount (the
mount point of the traced file) and, for the agent's own counters, the loss counter and the
trigger. Per-process series (pid, comm, rank) are off by default; with them on, at most
`process_cap` processes get their own series and the rest are summed under pid="other".
"""
from __future__ import annotations

import itertools
import os
import resource
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import WRITE_SYSCALLS

from .decode import FD_OPS
from .mounts import MountTable

# From 100 µs (a write into the page cache) to a minute (a hard mount's retries).
LATENCY_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                     1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BOUNDS_NS = np.array([b * 1e9 for b in LATENCY_BUCKETS_S])
OTHER = "other"
IDENTS_MAX = 4096     # processes named for the per-process series before they write
FD_CALLS = pa.array(FD_OPS)     # the calls on an fd that make rows: the kernel adds them up
PAGE = os.sysconf("SC_PAGE_SIZE")


# The histograms: name -> (help, labels).
HISTOGRAMS = {
    "slotscope_syscall_duration_seconds": ("Traced syscalls on traced files, by how long they took (entry to "
                                           "return)", ("syscall", "mount")),
    "slotscope_rpc_slot_wait_seconds": ("RPCs by their wait for a transport slot", ("server", "procedure")),
    "slotscope_rpc_rtt_seconds": ("RPCs by their round trip (sent to reply)", ("server", "procedure")),
    "slotscope_rpc_execute_seconds": ("RPCs by their whole time (begin to end)", ("server", "procedure")),
}
RPC_SPANS = {"slot_wait": "slotscope_rpc_slot_wait_seconds", "rtt": "slotscope_rpc_rtt_seconds",
             "execute": "slotscope_rpc_execute_seconds"}
# Per server, integrals over time of its clients' slots and waiters (the kernel's: aggregates.py).
OCCUPANCY = {
    "slotscope_transport_slots_in_use_seconds": "Slots in use, integrated over time (rate(): the mean in use)",
    "slotscope_transport_backlog_seconds": "Tasks waiting for a slot, integrated over time (rate(): the mean "
                                           "waiting)",
    "slotscope_transport_full_seconds": "Time with tasks waiting for a slot (rate(): the share of time saturated)",
}
SWEPT_OCCUPANCY = dict(zip(("in_use_ns", "backlog_ns", "full_ns"), OCCUPANCY))   # aggregates.Sweep's keys


# The tables whose rows observe() reads, and the method that reads each.
OBSERVERS = {"syscall": "_syscalls", "loss": "_loss", "procs": "_procs", "blocked": "_blocked"}


class Metrics:
    """What the endpoint serves; fed by sweep() with what the kernel's aggregates added, by
    observe(name, rows) with every table a drain appends (a FlightRecorder listener), and by
    the watcher's own counts."""

    def __init__(self, per_process: bool = False, process_cap: int = 100):
        self.per_process, self.process_cap = per_process, process_cap
        self._lock = threading.Lock()
        self._buckets: dict[str, dict[tuple, np.ndarray]] = {name: {} for name in HISTOGRAMS}
        self._sums: dict[str, dict[tuple, float]] = {name: {} for name in HISTOGRAMS}
        self._written: dict[str, int] = {}                      # mount -> bytes
        self._process_written: dict[tuple[str, str, str], int] = {}   # (pid, comm, rank) -> bytes
        self._process_blocked: dict[tuple[str, str, str], float] = {}  # (pid, comm, rank) -> s in traced calls
        self._idents: dict[int, tuple[str, str]] = {}            # tgid -> (comm, rank): the newest IDENTS_MAX
        self._keys: dict[int, tuple[str, str, str]] = {}         # tgid -> its series' labels, once it has them
        self._occupancy: dict[str, dict[str, float]] = {name: {} for name in OCCUPANCY}   # -> server -> s
        self._lost: dict[str, int] = {}
        self._incidents: dict[str, int] = {}
        self._mounts: dict[int, str] = {}                       # dev -> mount point
        self.blocked_now = 0
        self.events = lambda: 0                                 # the watcher's count of events read
        self.flight = lambda: (0, 0.0)                          # (bytes, seconds) the flight recorder holds

    def observe(self, name: str, rows: pa.Table) -> None:
        method = OBSERVERS.get(name)
        if method:
            with self._lock:
                getattr(self, method)(rows)

    def sweep(self, swept) -> None:
        """What the kernel's aggregates added since the last sweep (an aggregates.Sweep)."""
        with self._lock:
            for (server, procedure), spans in swept.rpcs.items():
                for span, (counts, sum_ns) in spans.items():
                    self._add_histogram(RPC_SPANS[span], (server, procedure), counts, sum_ns)
            for server, grown in swept.transports.items():
                for key, name in SWEPT_OCCUPANCY.items():
                    per = self._occupancy[name]
                    per[server] = per.get(server, 0.0) + grown[key] / 1e9
            for (syscall, mount), (counts, sum_ns, written) in swept.calls.items():
                self._add_histogram("slotscope_syscall_duration_seconds", (syscall, mount), counts, sum_ns)
                if syscall in WRITE_SYSCALLS:
                    self._written[mount] = self._written.get(mount, 0) + written
            if self.per_process:
                for tgid, (written, blocked_ns) in swept.processes.items():
                    self._add_process(tgid, written, blocked_ns)

    def _add_histogram(self, name: str, key: tuple, counts, sum_ns: float) -> None:
        buckets, total = self._buckets[name], self._sums[name]
        if key not in buckets:
            buckets[key], total[key] = np.zeros(len(BOUNDS_NS) + 1, np.int64), 0.0
        buckets[key] += np.asarray(counts, np.int64)
        total[key] += sum_ns / 1e9

    def _add_process(self, tgid: int, written: int, blocked_ns: int) -> None:
        if written or blocked_ns:
            key = self._process_key(tgid)
            self._process_written[key] = self._process_written.get(key, 0) + written
            self._process_blocked[key] = self._process_blocked.get(key, 0.0) + blocked_ns / 1e9

    def incident(self, trigger: str) -> None:
        with self._lock:
            self._incidents[trigger] = self._incidents.get(trigger, 0) + 1

    def _mount(self, dev: int, path: str) -> str:
        if dev not in self._mounts:
            mount = MountTable.read().find(path)
            self._mounts[dev] = mount.mountpoint if mount else "?"
        return self._mounts[dev]

    def mount_of(self, dev: int, path: str) -> str:
        """The mount point of a traced file's device, its `mount` label."""
        with self._lock:
            return self._mount(dev, path)

    def _syscalls(self, rows: pa.Table) -> None:
        """The rows of calls that name a path: the kernel adds up the calls on fds (sweep)."""
        rows = rows.filter(pc.invert(pc.is_in(pc.cast(rows["syscall"], pa.string()), FD_CALLS)))
        if not rows.num_rows:
            return
        devs = rows["dev"].fill_null(0).to_numpy()
        known = np.unique(devs)
        named = np.flatnonzero(rows["path"].is_valid().to_numpy())   # a path of each device, to find its mount
        with_path, first = np.unique(devs[named], return_index=True)
        path_of = dict(zip(with_path.tolist(), rows["path"].take(pa.array(named[first])).to_pylist()))
        mounts = [self._mount(d, path_of.get(d, "")) for d in known.tolist()]
        calls = pc.dictionary_encode(pc.cast(rows["syscall"], pa.string()).combine_chunks())
        values_ns = rows["latency_ns"].to_numpy()
        buckets = np.searchsorted(BOUNDS_NS, values_ns, side="left")
        # One number per (syscall, device, bucket): the groups are a few, the rows may be many.
        per_call = np.searchsorted(known, devs) * (len(BOUNDS_NS) + 1) + buckets
        key = calls.indices.to_numpy() * (known.size * (len(BOUNDS_NS) + 1)) + per_call
        for k, count, sum_ns in zip(*_sums(key, values_ns)):
            call, rest = divmod(k, known.size * (len(BOUNDS_NS) + 1))
            dev, bucket = divmod(rest, len(BOUNDS_NS) + 1)
            counts = np.zeros(len(BOUNDS_NS) + 1, np.int64)
            counts[bucket] = count
            self._add_histogram("slotscope_syscall_duration_seconds",
                                (calls.dictionary[call].as_py(), mounts[dev]), counts, sum_ns)
        if self.per_process:
            for tgid, _, ns in zip(*_sums(rows["tgid"].to_numpy(), values_ns)):
                self._add_process(tgid, 0, ns)

    def _process_key(self, tgid: int) -> tuple[str, str, str]:
        key = self._keys.get(tgid)
        if key is None and len(self._keys) < self.process_cap:
            key = self._keys[tgid] = (str(tgid), *self._idents.get(tgid, ("", "")))
        return key or (OTHER, "", "")

    def _procs(self, rows: pa.Table) -> None:
        """Each process's name and rank, for the per-process series' labels: only with them, and
        only the newest IDENTS_MAX (a daemon sees every process the host starts for weeks)."""
        if not self.per_process:
            return
        for r in rows.select(["tgid", "comm", "rank"]).to_pylist():
            self._idents[r["tgid"]] = (r["comm"] or "", "" if r["rank"] is None else str(r["rank"]))
        for tgid in list(itertools.islice(self._idents, max(0, len(self._idents) - IDENTS_MAX))):
            del self._idents[tgid]

    def _loss(self, rows: pa.Table) -> None:
        for counter, lost in zip(rows["counter"].to_pylist(), rows["lost"].to_pylist()):
            self._lost[counter] = self._lost.get(counter, 0) + lost

    def _blocked(self, rows: pa.Table) -> None:
        self.blocked_now = len(set(rows["tid"].to_pylist()))

    # ---- a scrape ----
    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self._lock:
            buckets = {name: {k: v.copy() for k, v in per.items()} for name, per in self._buckets.items()}
            sums = {name: dict(per) for name, per in self._sums.items()}
            occupancy = {name: dict(per) for name, per in self._occupancy.items()}
            written, lost = dict(self._written), dict(self._lost)
            per_process, blocked_s = dict(self._process_written), dict(self._process_blocked)
            incidents, blocked = dict(self._incidents), self.blocked_now
        for name, (doc, labels) in HISTOGRAMS.items():
            h = HistogramMetricFamily(name, doc, labels=list(labels))
            for key, counts in sorted(buckets[name].items()):
                cumulative = np.cumsum(counts).tolist()
                h.add_metric(list(key), [(f"{b:g}", c) for b, c in zip(LATENCY_BUCKETS_S, cumulative)]
                             + [("+Inf", cumulative[-1])], sums[name][key])
            yield h
        for name, doc in OCCUPANCY.items():
            yield _counter(name, doc, ["server"], occupancy[name])
        yield _counter("slotscope_written_bytes", "Bytes written by traced syscalls to traced files", ["mount"],
                       written)
        if self.per_process:
            yield _counter("slotscope_process_written_bytes",
                           f"Bytes written to traced files per process (at most {self.process_cap} processes; "
                           f"the rest as pid=\"{OTHER}\")", ["pid", "comm", "rank"], per_process)
            yield _counter("slotscope_process_blocked_seconds",
                           f"Time in traced syscalls on traced files per process (at most {self.process_cap} "
                           f"processes; the rest as pid=\"{OTHER}\")", ["pid", "comm", "rank"], blocked_s)
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
        yield GaugeMetricFamily("slotscope_flight_recorder_bytes", "Bytes the flight recorder holds (rows and records, compressed)",
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


def _sums(keys: np.ndarray, values: np.ndarray) -> tuple[list, list, list]:
    """Per distinct key: the key, how many values it has and their sum. numpy, not Arrow's
    group_by: that loads Arrow's query engine, and with it the dataset and filesystem modules
    (S3's among them), ~13 MiB of the agent's memory."""
    distinct, which = np.unique(keys, return_inverse=True)
    return (distinct.tolist(), np.bincount(which, minlength=distinct.size).tolist(),
            np.bincount(which, weights=values, minlength=distinct.size).tolist())
