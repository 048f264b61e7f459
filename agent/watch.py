"""`slotscope watch`: `record` left running, writing nothing until something goes wrong.

The same probes, drain and decoding as `record` (a Recorder whose capture is a
FlightRecorder in memory), and the kernel's own aggregates besides (aggregates.py, compiled
for watch alone): after every drain one sweep of their maps feeds the metrics and the
slot_full_s and blocked_s triggers (triggers.py), which are then evaluated; rows are built
every drain only of the tables the metrics and triggers still read (ROWS_READ). When one fires,
the flight recorder's rows and those of the next --after seconds become an incident capture
(incidents.py), analysed in a process of its own.

Signals: SIGTERM or SIGINT stop (an incident being collected is written with what it holds,
and its analysis waited for, up to STOP_WAIT s); SIGHUP reloads: the mount table is read
again (a mount made since that matches the filters is traced from then on) and every trigger
is re-armed.
"""
from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.recfunctions import repack_fields

from slotscope.capture.writer import CaptureWriteError

from .aggregates import Aggregator, Writes, monotonic_ns, read_maps, write_maps
from .conditions import Blocked, longest_full, not_responding, returned_blocked, slow_save
from .files import UNKNOWN, FdTable, mount_tables, traced_devs
from .flight import FlightRecorder, packed_records
from .incidents import Incident, incident_name, open_out, prune
from .meta import clock_pair
from .metrics import FD_CALLS, OBSERVERS, Metrics, serve
from .probes import DRAIN_EVERY, Filters
from .recorder import Recorder
from .recording import RecordError, RecordOptions, _refuse_traced_output
from .triggers import REARM_S, Arming
from .watch_defaults import AFTER_S, KEEP_BYTES, KEEP_S, MAX_DISK, PROCESS_CAP

# What the watch logs without -v: all but the status lines.
LOGGED = ("watching", "incident", "stopped", "SIGHUP", "warning", "no incident", "--max-disk")
STOP_WAIT = 60.0            # s a stop waits for an incident's writing and analysis
TRIGGER_TABLES = ("syscall", "blocked", "kmsg")   # whose rows the triggers read (_observe)
# Every drain's rows of these are built; a stateless stream's other records wait in the flight
# recorder for an incident (flight.py).
ROWS_READ = frozenset(OBSERVERS) | frozenset(TRIGGER_TABLES)


@dataclass
class WatchOptions(RecordOptions):
    keep: float = KEEP_S
    keep_size: int = KEEP_BYTES
    after: float = AFTER_S
    triggers: dict = field(default_factory=dict)     # name -> value (triggers.parse_triggers)
    rearm: float = REARM_S
    max_disk: int = MAX_DISK
    metrics: str | None = None                       # ADDR:PORT
    per_process: int = 0                             # 0: no per-process series; else their cap
    saves: object | None = None                      # slow_save's clock: feed(rows, now_ns) -> a save ended
                                                     # (durations_s); given by the cli (analyzer.saves.SaveClock)


def journal_stderr() -> bool:
    """Whether stderr is systemd's journal stream (systemd sets JOURNAL_STREAM to its dev:ino)."""
    want = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return want == f"{st.st_dev}:{st.st_ino}"


def log_line(text: str, journal: bool) -> str:
    """One log line: to the journal with its syslog priority prefix (<4> warning, <6> info; it
    stamps the time itself), elsewhere with the UTC time."""
    if journal:
        return f"<{4 if text.startswith(('warning', 'no incident')) else 6}>{text}"
    return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} slotscope: {text}"


class Watcher(Recorder):
    def __init__(self, opts: WatchOptions, argv: list[str]):
        super().__init__(opts, argv)
        self.journal = journal_stderr()
        self.metrics = Metrics(per_process=bool(opts.per_process), process_cap=opts.per_process or PROCESS_CAP)
        self.events = 0     # none read yet: the endpoint serves from open(), while the probes compile
        self.metrics.events = lambda: self.events
        self.metrics.flight = self._held
        self.arming = Arming(opts.triggers, opts.rearm)
        self.full_since: dict[str, int] = {}       # server -> since when its slot table is full (the last sweep)
        self.blocked = Blocked()
        self.aggregator: Aggregator | None = None
        self.incident: Incident | None = None      # open from its trigger until its analysis ends
        self.collect_until: float | None = None    # while the incident takes rows: until when
        self.reload_requested = False
        self._server = None
        self._reset_seen()

    def _held(self) -> tuple[int, float]:
        """(bytes, seconds) the flight recorder holds, for the metrics (from their thread)."""
        writer = getattr(self, "writer", None)
        oldest = writer.oldest() if writer is not None else None
        return (writer.size_bytes(), time.monotonic() - oldest) if oldest is not None else (0, 0.0)

    def _reset_seen(self) -> None:
        self._blocked_ns, self._blocked_call, self._kmsg_line, self._save_ended = 0, None, None, False

    # ---- the recorder's hooks ----
    def _filters(self) -> Filters:
        filters = super()._filters()
        filters.aggregate = True
        return filters

    def _capture_started(self) -> None:
        super()._capture_started()
        if self.aggregator is None:     # once: the kernel's sums run from the load, across captures
            self.aggregator = Aggregator(lambda cid: self.clients.server(cid), self._decide)
            # the clients there now mapped before their first RPC: none of it is missed
            if "sunrpc" in self.loaded.groups:
                write_maps(self.loaded.bpf, Writes(clients=self.aggregator.clients(self.clients.listed())))

    def _decide(self, tgid: int, fd: int, gen: int):
        """What the fd held at generation gen (the kernel's fd_gen: when it was made, 0 before
        the recording): (dev, mount, path) of a traced file, False for another, None not yet known
        (its opening not decoded yet)."""
        at = self.decoder.fds.at(FdTable.key(tgid, fd), gen)
        if at is None or at[0] != gen or at[1] == UNKNOWN:
            return None
        info = self.decoder.registry.info(at[1]) if at[1] >= 0 else None
        if info is None:
            return False
        return info.dev, self.metrics.mount_of(info.dev, info.path), info.path

    def open(self) -> None:
        if self.opts.metrics:
            try:
                self._server = serve(self.metrics, self.opts.metrics)
            except (OSError, ValueError) as exc:
                raise RecordError(f"--metrics {self.opts.metrics}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            super().open()
        except BaseException:
            self._stop_server()
            raise
        signal.signal(signal.SIGHUP, self._on_reload)

    def _on_reload(self, _signum, _frame):
        self.reload_requested = True

    def _restore_signals(self) -> None:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        super()._restore_signals()

    def _create_writer(self, number: int) -> FlightRecorder:
        opts = self.opts
        _refuse_traced_output(opts.output, self.file_filter)
        try:
            open_out(opts.output, 0o750 if opts.group_readable else 0o700)
        except CaptureWriteError as exc:
            raise RecordError(str(exc)) from None
        except OSError as exc:
            raise RecordError(f"--out {opts.output}: {exc.strerror}") from None
        flight = FlightRecorder(opts.output, opts.keep, opts.keep_size)
        flight.listeners.append(self._observe)
        return flight

    def _say_recording(self) -> None:
        opts = self.opts
        triggers = ", ".join(f"{n}={'on' if v is True else f'{v:g}'}" for n, v in opts.triggers.items()) or "none"
        self._say(f"watching ({self._recording_what()}): "
                  f"keeping the last {opts.keep:g} s (at most {opts.keep_size / 2**20:g} MiB) in memory; "
                  f"triggers {triggers}; incidents to {opts.output} (at most {opts.max_disk / 2**20:g} MiB)"
                  f"{'; metrics at http://' + opts.metrics + '/metrics' if opts.metrics else ''}")

    def _totals_line(self) -> str:
        return (f"{self.events} events, {self.rows} rows, {sum(self._lost().values())} lost; "
                f"incidents in {self.opts.output}")

    def _say(self, text: str, always: bool = False) -> None:
        if self.opts.status or always or text.startswith(LOGGED):
            print(log_line(text, self.journal), file=sys.stderr, flush=True)

    def _take(self, stream, records: list) -> None:
        if not stream.stateless or stream.table in ROWS_READ or self.collect_until is not None:
            super()._take(stream, records)      # an incident being collected takes rows
            return
        for r in records:       # the servers' names read while their clients exist
            if "client_id" in r.dtype.names:
                self.clients.learn(r["client_id"])
        drained = _Drained(self.clients, self.now_ns())
        records = [repack_fields(r[list(stream.fields[ring])]) if ring in stream.fields else r
                   for ring, r in zip(stream.rings, records)]
        self.writer.hold(stream.table, packed_records(functools.partial(stream.build, drained), records))
        self.rows += sum(r.size for r in records)

    def _drain(self) -> None:
        super()._drain()
        self._sweep()
        if self.reload_requested:
            self._reload()
        self._evaluate()

    def _sweep(self) -> None:
        """One read of the kernel's aggregates: to the metrics and the triggers."""
        bpf = self.loaded.bpf
        raw = read_maps(bpf, self.loaded.groups, processes=self.metrics.per_process,
                        servers=len(self.aggregator.index))
        swept, writes = self.aggregator.sweep(raw, monotonic_ns())
        write_maps(bpf, writes)
        self.metrics.sweep(swept)
        self.full_since = swept.full_since
        if swept.longest and swept.longest["ns"] > self._blocked_ns:
            call = swept.longest
            self._blocked_ns = call["ns"]
            self._blocked_call = {"tgid": call["tgid"], "syscall": call["syscall"], "path": call["path"],
                                  "ts_enter": call["ts_enter"], "in_progress": False}

    def _write_blocked(self):
        rows = super()._write_blocked()
        self.blocked.feed_snapshot(rows)
        return rows

    def finish(self, failure: str | None) -> str | None:
        if self.collect_until is not None:
            self._close_incident(f"the watch stopped ({self.stop_reason}) {self.collect_until - time.monotonic():.1f} s "
                                 f"before the end of the incident's window")
        failure = super().finish(failure)
        self._stop_server()
        incident = self.incident
        if incident is not None and not incident.wait(STOP_WAIT):
            self._say(f"incident {incident.name}: still being written or analysed {STOP_WAIT:g} s after the stop; "
                      f"its analysis goes on in its own process", always=True)
        return failure

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- what the rows say ----
    def _observe(self, name: str, rows) -> None:
        """Every table a drain appends: to the metrics (those of calls that name a path), to the
        incident being collected, and what the triggers read."""
        self.metrics.observe(name, rows)
        if self.collect_until is not None:
            self.incident.add(name, rows)
        if name == "syscall":
            # the calls that name a path and returned, blocked for their latency (the kernel has those on fds)
            ns, call = returned_blocked(rows.filter(pc.invert(pc.is_in(pc.cast(rows["syscall"], pa.string()),
                                                                       FD_CALLS))))
            if ns > self._blocked_ns:
                self._blocked_ns, self._blocked_call = ns, call
            if self.opts.saves is not None:
                self._save_ended |= self.opts.saves.feed(rows, time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        elif name == "kmsg" and self._kmsg_line is None:
            self._kmsg_line = not_responding(rows)

    def _holding(self) -> dict[str, dict]:
        """The triggers whose conditions hold after this drain, each with what it saw (its
        "summary" said in the log)."""
        triggers, holding = self.opts.triggers, {}
        now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        ns, call = self.blocked.longest(now_ns)
        if self._blocked_ns > ns:
            ns, call = self._blocked_ns, self._blocked_call
        if "blocked_s" in triggers and ns >= triggers["blocked_s"] * 1e9:
            holding["blocked_s"] = {
                "summary": f"{call['syscall']} on {call['path']} by pid {call['tgid']} blocked "
                           f"{ns / 1e9:.1f} s{' and counting' if call['in_progress'] else ''}",
                "blocked_s": ns / 1e9, "call": call}
        full_ns, server = longest_full(self.full_since, now_ns)
        if "slot_full_s" in triggers and server and full_ns >= triggers["slot_full_s"] * 1e9:
            holding["slot_full_s"] = {"summary": f"the slot table of {server} full for {full_ns / 1e9:.1f} s",
                                      "full_s": full_ns / 1e9, "server": server}
        saves = self.opts.saves
        if saves is not None and "slow_save" in triggers:
            ended = saves.feed(None, now_ns) or self._save_ended
            took = saves.durations_s
            if ended and slow_save(took, triggers["slow_save"]):
                median = float(np.median(took[:-1]))
                holding["slow_save"] = {"summary": f"a save took {took[-1]:.1f} s, {took[-1] / median:.1f} times the "
                                                   f"median {median:.1f} s of the {len(took) - 1} before",
                                        "save_s": took[-1], "median_s": median}
        if triggers.get("not_responding") and self._kmsg_line:
            holding["not_responding"] = {"summary": f"the kernel said '{self._kmsg_line}'", "line": self._kmsg_line}
        return holding

    def _evaluate(self) -> None:
        holding = self._holding()
        self._reset_seen()
        now = time.monotonic()
        fire, noted = self.arming.observe(now, set(holding), self.incident is not None)
        if noted and self.incident is not None:
            self.incident.also |= noted - {self.incident.trigger}
        if self.collect_until is not None and now >= self.collect_until:
            self._close_incident(None)
        if fire and self.stop_reason is None:
            self._open_incident(fire, holding[fire])

    # ---- incidents ----
    def _open_incident(self, trigger: str, seen: dict) -> None:
        opts, fired = self.opts, clock_pair()
        name = incident_name(fired["realtime_ns"], trigger)
        blocked_s = opts.triggers.get("blocked_s")
        try:
            incident = Incident(opts.output, name, trigger, opts.group_readable, opts.max_disk,
                                ["--threshold", f"hung_s={blocked_s:g}"] if blocked_s else [], self._incident_done)
        except CaptureWriteError as exc:
            self._say(f"no incident for {trigger}: {exc}", always=True)
            return
        self.metrics.incident(trigger)
        oldest = self.writer.oldest()
        incident.started = (oldest if oldest is not None else time.monotonic()) - DRAIN_EVERY
        incident.fired, incident.seen = fired, seen
        for table, rows in self.writer.contents():
            incident.add(table, rows)
        self.incident, self.collect_until = incident, time.monotonic() + opts.after
        before = fired["monotonic_ns"] / 1e9 - incident.started
        self._say(f"incident {name} opened: {seen['summary']}; keeping the {before:.0f} s before it and the next "
                  f"{opts.after:g} s", always=True)

    def _close_incident(self, cut_short: str | None) -> None:
        incident, opts = self.incident, self.opts
        self.collect_until = None
        stop = clock_pair()
        start_ns = int(incident.started * 1e9)
        meta = dict(self.meta)
        meta["start"] = {"monotonic_ns": start_ns,
                         "realtime_ns": stop["realtime_ns"] - (stop["monotonic_ns"] - start_ns),
                         "uncertainty_ns": stop["uncertainty_ns"]}
        meta["stop"], meta["stop_reason"] = stop, "incident"
        meta["incident"] = {
            "trigger": incident.trigger, "threshold": opts.triggers[incident.trigger], "seen": incident.seen,
            "fired": incident.fired, "also": sorted(incident.also),
            "before_s": (incident.fired["monotonic_ns"] - start_ns) / 1e9,
            "after_s": (stop["monotonic_ns"] - incident.fired["monotonic_ns"]) / 1e9,
            "held_s": (stop["monotonic_ns"] - start_ns) / 1e9,
            "keep_s": opts.keep, "keep_bytes": opts.keep_size,
            "evicted_bytes": self.writer.evicted_bytes, "cut_short": cut_short,
        }
        if cut_short is None:   # a stop's last rows (Recorder._last_rows) came to it with the rest
            for table, rows in self._outstanding_rows():
                incident.add(table, rows)
        incident.finish(meta)

    def _incident_done(self, incident: Incident) -> None:
        """From the incident's thread, once written and analysed."""
        if incident.failure:
            self._say(f"warning: incident {incident.name}: {incident.failure}", always=True)
        else:
            self._say(f"incident {incident.name} written and {incident.analysis}", always=True)
        try:
            removed = prune(self.opts.output, self.opts.max_disk, keep=incident.name)
        except OSError as exc:
            removed = []
            self._say(f"warning: --max-disk: cannot prune {self.opts.output}: {exc}", always=True)
        if removed:
            self._say(f"--max-disk {self.opts.max_disk / 2**20:g} MiB: removed {', '.join(removed)}", always=True)
        self.incident = None

    # ---- SIGHUP ----
    def _reload(self) -> None:
        self.reload_requested = False
        self.decoder.registry.refresh_mounts()
        devs = traced_devs(self.file_filter, mount_tables())
        added = 0
        if devs is not None:
            known = self.loaded.bpf[b"traced_devs"]
            for dev in devs:
                key = ctypes.c_uint64(dev)
                if known.get(key) is None:
                    known[key] = ctypes.c_uint8(1)
                    added += 1
        self.arming.rearm_all()
        self._say(f"SIGHUP: mounts read again ({'every device' if devs is None else f'{added} device(s) added'}), "
                  f"triggers re-armed", always=True)


class _Drained:
    """What a stateless stream's build reads of its drain (probes.Stream), as it was then."""

    def __init__(self, clients, now_ns: int):
        self.clients, self._now_ns = clients, now_ns

    def now_ns(self) -> int:
        return self._now_ns


def watch(opts: WatchOptions, argv: list[str]) -> int:
    return Watcher(opts, argv).run()
