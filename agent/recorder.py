"""`slotscope record` with BPF: load the probes, drain them, write the capture, stop cleanly
(recording.py: what every recording does).

One thread drains: it never reads anything that can block on the traced NFS
mount (see files.py); process identities are read by worker threads.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from .attach_plan import compare
from .decode import Decoder
from .files import FileRegistry, mount_tables, traced_devs
from .layouts import LOSS_COUNTERS, SLOT_EVENT, warm_up
from .memory import arrow_from_malloc
from .probes import DRAIN_EVERY, Filters, SyscallProbes, ebpf_text, load_falling_back, runnable_groups
from .recording import QUIT, RecordError, RecordOptions, Recording, _filter_warnings, _monotonic_ns, empty
from .rpc_rows import ClientNames, rpc_table, slots_table

BLOCKED_MIN_NS = 1_000_000_000   # a syscall in progress this long is 'blocked' in the snapshots
# The tables the recorder writes itself; the probe groups' streams and the samplers write the rest.
OWN_TABLES = ("procs", "blocked", "loss", "agent")
__all__ = ("QUIT", "RecordError", "RecordOptions", "Recorder", "record", "record_ebpf")


def record_groups() -> tuple[list, dict]:
    """The probe groups a recording loads: the syscall group is required, the others are
    optional (a machine without NFS still records syscalls), each skipped with its reason."""
    groups, skipped = runnable_groups()
    if SyscallProbes.name in skipped:
        raise RecordError(f"cannot trace syscalls: {skipped[SyscallProbes.name]}")
    return groups, skipped


def record_ebpf(opts: RecordOptions, aggregate: bool = False) -> str:
    """The BPF program `record` (`watch`: aggregate) would load with these options (--ebpf)."""
    groups, skipped = record_groups()
    # The traced command's pid is known only once it runs; the program depends only on
    # whether processes are filtered at all.
    tgids = list(opts.pids) + ([0] if opts.command else [])
    devs = traced_devs(opts.file_filter(), mount_tables())
    return ebpf_text(groups, Filters(tgids=tgids, cgroup=opts.cgroup, devs=devs,
                                     prefixes=opts.file_filter().prefixes, aggregate=aggregate), skipped)


class Recorder(Recording):
    """A recording from BPF probes: the programs are loaded once, and stay loaded over the
    captures of a recording of several (SIGUSR1), without compiling them again."""

    WAIT = DRAIN_EVERY

    def __init__(self, opts: RecordOptions, argv: list[str]):
        super().__init__(opts, argv)
        self._loss_seen = dict.fromkeys(LOSS_COUNTERS, 0)

    def _check_options(self) -> None:
        self.groups, self.skipped = record_groups()
        if self.opts.cgroup and not os.path.isdir(self.opts.cgroup):
            raise RecordError(f"--cgroup {self.opts.cgroup}: not a cgroup v2 directory")
        self.devs = traced_devs(self.file_filter, mount_tables())

    def _filters(self) -> Filters:
        return Filters(tgids=self.tgids, cgroup=self.opts.cgroup, devs=self.devs,
                       prefixes=self.file_filter.prefixes)

    def _attach(self) -> None:
        filters = self._filters()
        self.loaded, groups = load_falling_back(self.groups, filters, self.skipped, self._say)
        if self.opts.bpf_stats:
            self.loaded.measure_programs()
        arrow_from_malloc()
        self.attached = {g.name: (self.loaded.syscalls if isinstance(g, SyscallProbes) else True) for g in groups}
        # What this kernel gave in place of what a group reads first: said once, kept in meta.json.
        self.fell_back = {g.name: g.fallbacks() for g in groups if g.fallbacks()}
        for name, notes in self.fell_back.items():
            self._say(f"probe group {name} fell back: {'; '.join(notes)}", always=True)
        # What each group expected to attach on this kernel against what did (doctor --load's check).
        plans, unplanned = compare(groups, self.loaded.attached())
        self.attach_plan = {"groups": {name: plan.as_json() for name, plan in plans.items()}, "unplanned": unplanned}
        for name, plan in plans.items():
            if plan.missing():
                self._say(f"probe group {name}: {plan.summary()}; {'; '.join(plan.details())}", always=True)
        self.streams = [stream for g in groups for stream in g.streams]

    def _wake_on(self, fd: int) -> None:
        self.loaded.wake_on(fd)

    def _probes_meta(self) -> dict:
        return {"attached": dict(self.attached), "skipped": dict(self.skipped), "fell_back": dict(self.fell_back),
                "attach_plan": self.attach_plan}

    def _capture_started(self) -> None:
        """The files and processes learnt afresh (from /proc for those already running)."""
        loaded = self.loaded
        registry = FileRegistry(self.file_filter)
        self.decoder = Decoder(registry, self.identities, loaded.ignore_fd, nfs_calls="nfs" in loaded.groups)
        self.decoder.fds.scan_proc(registry, self.tgids or None)
        self.clients = ClientNames()
        self.events = self._status_events = 0
        self._loss_start = dict(self._loss_seen)
        self._runtime_start = loaded.program_runtime()

    def _warnings(self) -> list[str]:
        return _filter_warnings(self.opts, self.devs)

    def _warm_up(self) -> None:
        # Before saying "recording": pyarrow's and numpy's lazy start-up (seconds under
        # emulation) must not open a gap in the samples or slow the first save traced.
        warm_up()

    def _wait(self, seconds: float) -> None:
        """Until the next drain: `seconds`, or sooner when data or a signal arrives."""
        self.loaded.wait(seconds)
        empty(self._wake_r)

    def _recording_what(self) -> str:
        loaded = self.loaded
        return (f"{len(loaded.syscalls)} syscalls"
                f"{', ' + ', '.join(loaded.groups[1:]) if len(loaded.groups) > 1 else ''}")

    def _last_rows(self) -> None:
        """The rows that end a capture, taken while the probes are attached."""
        self._drain()
        self._write_blocked()
        super()._last_rows()
        for table, rows in self._outstanding_rows():
            self.writer.append(table, rows)

    def _outstanding_rows(self) -> list[tuple[str, pa.Table]]:
        """The RPCs begun and not completed: their rows, and the slots rows of those that took a slot."""
        outstanding = self.loaded.outstanding_rpcs()
        if not outstanding.size:
            return []
        return [("rpc", rpc_table(outstanding, self.clients, _monotonic_ns())),
                ("slots", slots_table(np.empty(0, SLOT_EVENT.dtype), outstanding, self.clients))]

    def _capture_ending(self) -> None:
        self.meta["probes"]["runtime"] = self._runtime()   # what each probe cost, over the capture

    def _detach(self) -> None:
        self.loaded.close()

    def _totals(self) -> dict:
        return {"events": self.events, "rows": self.rows, "lost": self._lost(),
                "unnamed_fd_rows": self.decoder.unnamed}

    def _lost(self) -> dict[str, int]:
        return {name: total - self._loss_start[name] for name, total in self._loss_seen.items()}

    def _runtime(self) -> dict[str, dict[str, int]]:
        """Each program's runs and run time during this capture (their counters run from the load)."""
        start = self._runtime_start
        return {name: {k: v - start.get(name, {}).get(k, 0) for k, v in counts.items()}
                for name, counts in self.loaded.program_runtime().items()}

    def _events(self) -> int:
        return self.events

    def _bpf_runtime(self) -> dict[str, int | None]:
        """Kernel time spent in all our programs during this capture (None without bpf_stats)."""
        progs = self._runtime()
        if not progs:
            return {"bpf_run_ns": None, "bpf_run_cnt": None}
        return {"bpf_run_ns": sum(p["run_ns"] for p in progs.values()),
                "bpf_run_cnt": sum(p["run_cnt"] for p in progs.values())}

    def _totals_line(self) -> str:
        return (f"{self.events} events, {self.rows} rows, {sum(self._lost().values())} lost, "
                f"capture in {self.output}")

    def _status_text(self, elapsed: float) -> str:
        rate = (self.events - self._status_events) / elapsed
        self._status_events = self.events
        return f"{rate / 1000:.1f}k events/s, {sum(self._loss_seen.values())} lost"

    # ---- the drain ----
    def _drain(self) -> None:
        batch = self.loaded.read_batch()
        self.events += sum(arr.size for arr in batch.values())
        for stream in self.streams:
            records = [batch[ring] for ring in stream.rings]
            if stream.each_drain or any(r.size for r in records):
                self._take(stream, records)
        self._tick()

    def _take(self, stream, records: list) -> None:
        """A stream's records of this drain, into the capture as rows."""
        rows = stream.build(self, *records)
        if rows is not None:
            self.writer.append(stream.table, rows)
            self.rows += rows.num_rows

    def _write_blocked(self):
        """The `blocked` rows of now (None: nothing blocked), written."""
        now = _monotonic_ns()
        rows = self.decoder.blocked(*self.loaded.in_flight(), now, BLOCKED_MIN_NS)
        if rows is not None:
            self.writer.append("blocked", rows)
        return rows

    def _every_second(self) -> None:
        self._write_blocked()

    def _new_losses(self) -> dict[str, int]:
        totals = self.loaded.loss_totals()
        new = {name: total - self._loss_seen[name] for name, total in totals.items()}
        self._loss_seen = totals
        return new


def record(opts: RecordOptions, argv: list[str]) -> int:
    """Record with BPF, or sampled (--no-bpf, or where BPF cannot be used and --bpf is not given)."""
    from .sampled import SampledRecorder, sampled_reason
    reason = sampled_reason(opts)
    return (SampledRecorder(opts, argv, reason) if reason else Recorder(opts, argv)).run()
