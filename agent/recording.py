"""What every `slotscope record` does, whatever it records from (BPF probes, or /proc and
mountstats sampled): the options, the capture opened on a safe path, the traced command held
and stopped, the signals (Ctrl-C, SIGTERM, SIGUSR1 for the next capture), --duration, the
processes' identities, the agent's own rows and the stop record. recorder.py (BPF) and
sampled.py fill in where the rows come from.
"""
from __future__ import annotations

import os
import resource
import signal
import sys
import time
from dataclasses import dataclass, field

import pyarrow as pa

from slotscope.capture import losses
from slotscope.capture.tables import AGENT, LOSS, PROCS
from slotscope.capture.writer import CaptureWriteError, CaptureWriter

from .files import FileFilter
from .identity import READ_TIMEOUT, Identities
from .memory import give_back
from .meta import clock_pair, nfs_mountstats, start_meta
from .mounts import NFS_TYPES, MountTable
from .samplers import KmsgReader, NetdevSampler, SamplerThread

STATS_EVERY = 1.0       # s between identity and loss rows (and the BPF agent's blocked-call snapshots)
AGENT_EVERY = 5.0       # s between the agent's own rows: reading every program's run time
                        # costs ~3 ms (20x that under emulation), most of an idle agent's CPU
STATUS_EVERY = 5.0
NUMBER = "{n}"          # in -o: the number of the capture, for a recording of several (SIGUSR1)
COMMAND_GRACE = 5.0     # s a traced command has to end after SIGTERM (or Ctrl-C) before SIGKILL
QUIT = "q"              # the stop reason when the TUI watching the recording quits (record --tui)
DURATION = "duration reached"
# BPF: "auto" loads the probes where they can run and samples /proc otherwise (saying why);
# "on" (--bpf) fails when they cannot; "off" (--no-bpf) samples.
BPF_MODES = ("auto", "on", "off")


class RecordError(Exception):
    """A failure to report in one line, exit status 1."""


@dataclass
class RecordOptions:
    output: str
    duration: float | None = None
    paths: list[str] = field(default_factory=list)
    fs: str | None = None           # "nfs" (default without --path), a type, or "any"
    pids: list[int] = field(default_factory=list)
    cgroup: str | None = None
    command: list[str] = field(default_factory=list)
    force: bool = False
    group_readable: bool = False
    status: bool = True
    max_size: int | None = None     # bytes per capture; None: half the free space at its start
    quit_signal: int | None = None  # a signal that means the user quit (record --tui's q): stop reason QUIT
    bpf: str = "auto"               # one of BPF_MODES
    interval: float = 0.1           # s between samples, when sampling
    bpf_stats: bool = False         # the programs' run time (probes.Loaded.measure_programs): the machine's

    def file_filter(self) -> FileFilter:
        fs = self.fs or ("any" if self.paths else "nfs")
        fstypes = None if fs == "any" else (NFS_TYPES if fs == "nfs" else frozenset({fs}))
        return FileFilter(tuple(os.path.normpath(os.path.abspath(p)) for p in self.paths), fstypes)


def _monotonic_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _existing_part(path: str) -> str:
    """The longest leading part of an absolute path that exists (an output is made later)."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _refuse_traced_output(output: str, file_filter: FileFilter) -> None:
    """Never write the capture onto an NFS mount being traced: it would trace itself
    and could hang on the very server it diagnoses."""
    target = os.path.abspath(output)
    mount = MountTable.read().find(os.path.realpath(_existing_part(target)))
    if mount and mount.is_nfs and file_filter.matches(target + "/meta.json", mount.fstype):
        raise RecordError(f"{output} is on the NFS mount {mount.mountpoint} that is being traced; "
                          f"write the capture to a local disk")


def _half_the_free_space(path: str) -> int:
    """--max-size's default: half what the output's filesystem has free at the capture's start."""
    st = os.statvfs(_existing_part(os.path.abspath(path)))
    return st.f_bavail * st.f_frsize // 2


def _filter_warnings(opts: RecordOptions, devs: frozenset[int] | None) -> list[str]:
    """Filters that, as things stand, match nothing: said, not refused (the path or the
    filesystem may appear while recording). `devs`: the devices that may hold a matching file."""
    warnings = [f"--path {p}: does not exist (yet); files created under it will be recorded"
                for p in opts.paths if not os.path.exists(p)]
    if opts.fs and opts.fs not in ("any", "nfs"):
        with open("/proc/filesystems") as f:
            known = {line.split()[-1] for line in f if line.strip()}
        if opts.fs not in known:
            warnings.append(f"--fs {opts.fs}: the kernel knows no such filesystem type (/proc/filesystems); "
                            f"nothing will be recorded unless one is mounted")
            return warnings
    if devs is not None and not devs:     # no mount of the filtered types (under the --path prefixes)
        fs = "NFS" if (opts.fs or "nfs") == "nfs" else opts.fs
        under = f" under {', '.join(opts.paths)}" if opts.paths else ""
        warnings.append(f"no {fs} mount{under} on this machine: nothing can match the filter unless one is "
                        f"mounted while recording; widen it with --path DIR (the files under DIR) or --fs any "
                        f"(files on any filesystem)")
    return warnings


class HeldCommand:
    """The traced command, forked but held before exec until the probes are attached,
    so it is traced from its first instruction. (subprocess.Popen waits for the exec,
    so it cannot hold the child.)"""

    def __init__(self, command: list[str], own_group: bool):
        import shutil
        if shutil.which(command[0]) is None:
            why = ("not an executable file" if os.sep in command[0] and os.path.exists(command[0])
                   else "command not found")
            raise RecordError(f"cannot run {command[0]}: {why}")
        r, self._go = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: wait for the go, then become the command
            try:
                os.close(self._go)
                if os.read(r, 1) != b"x":   # the agent died before tracing began: do not run untraced
                    os._exit(127)
                os.execvp(command[0], command)
            except OSError as exc:
                print(f"slotscope: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
            os._exit(127)
        os.close(r)
        # In a process group of its own, the command and its children can be stopped together
        # without the recorder; as the terminal's job it stays in the recorder's (Ctrl-C, Ctrl-Z
        # and the terminal's input reach it as a command run by the shell). Set here, before the
        # release: the child cannot have exec'd yet.
        self.own_group = own_group
        if own_group:
            os.setpgid(self.pid, self.pid)
        self.returncode: int | None = None

    def release(self) -> None:
        os.write(self._go, b"x")
        os.close(self._go)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def signal(self, sig: int) -> None:
        """To its process group when it has one of its own (its children too), else to it."""
        try:
            (os.killpg if self.own_group else os.kill)(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


class Recording:
    """open() the source of rows and the first capture, loop() until a stop, finish() the
    capture whatever happened; run() is the three. With {n} in the output path, SIGUSR1 ends
    the capture and starts the next (numbered from 1) with the source still open: a new
    capture as if a new agent had started.

    A subclass says where rows come from: _attach() (before the command is released), _drain()
    (write what arrived, then _tick()), _wait(), _detach(), and what its capture's meta and
    totals hold."""

    def __init__(self, opts: RecordOptions, argv: list[str]):
        self.opts = opts
        self.argv = argv
        self.number = 1                        # of the capture being written
        self.stop_reason: str | None = None
        self.next_requested = False
        self.stopped: dict | None = None       # the clock pair at the stop, before the source closes
        self._last_stats = self._last_status = self._last_agent = time.monotonic()

    now_ns = staticmethod(_monotonic_ns)

    def path(self, number: int) -> str:
        return self.opts.output.replace(NUMBER, str(number))

    @property
    def output(self) -> str:
        """The directory of the capture being written."""
        return self.path(self.number)

    def _stop_signals(self) -> tuple[int, ...]:
        return (signal.SIGINT, signal.SIGTERM) + ((self.opts.quit_signal,) if self.opts.quit_signal else ())

    def _on_signal(self, signum, _frame):
        if self.stop_reason is None:          # the first reason stands (a second Ctrl-C, a quit after it)
            self.stop_reason = QUIT if signum == self.opts.quit_signal else signal.Signals(signum).name

    def _on_next(self, _signum, _frame):
        self.next_requested = True

    def run(self) -> int:
        self.open()
        failure = None
        try:
            self.loop()
        except CaptureWriteError as exc:
            failure = str(exc)
        finally:
            failure = self.finish(failure)
        if failure:
            raise RecordError(failure)
        exit_code = 0
        proc = self.proc
        if proc is not None and proc.returncode is not None:
            exit_code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        self._say(f"stopped ({self.stop_reason}): {self._totals_line()}")
        return exit_code

    def open(self) -> None:
        """Check the options, hold the traced command, create the capture, open the source and
        set up what the loop needs; a failure is a RecordError and leaves nothing running."""
        opts = self.opts
        self.file_filter = opts.file_filter()
        self._check_options()
        for pid in opts.pids:
            if not os.path.exists(f"/proc/{pid}"):
                raise RecordError(f"--pid {pid}: no such process")
        writer = self._create_writer(1)     # before the slow part: a bad -o fails at once

        self.proc = proc = HeldCommand(opts.command, own_group=not _terminal_job()) if opts.command else None
        self.tgids = list(opts.pids) + ([proc.pid] if proc else [])
        try:
            self._attach()
        except Exception as exc:
            if proc:
                proc.kill()
            writer.close()
            if isinstance(exc, RecordError):
                raise
            raise RecordError(f"loading the syscall probes failed: {exc}") from None
        # A signal ends the loop's wait at once: Ctrl-C, SIGTERM, SIGUSR1 (the next capture)
        # and (SIGCHLD) the end of the traced command. Python writes each to the pipe, which
        # the wait polls.
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_on(self._wake_r)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in self._stop_signals():
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_next)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        try:
            self._start_capture(writer)
        except CaptureWriteError as exc:
            self._restore_signals()
            self._detach()
            if proc:
                proc.kill()
            writer.close()
            raise RecordError(str(exc)) from None
        # once nothing can fail: a refusal stays one line
        for warning in self._warnings():
            self._say(f"warning: {warning}", always=True)

    def _wake_on(self, fd: int) -> None:
        """The source's wait (_wait) ends when fd, the signals' pipe, has something."""

    def _own_meta(self) -> dict:
        """What the subclass adds to meta.json."""
        return {}

    def _every_second(self) -> None:
        """What the subclass writes every STATS_EVERY s."""

    def _warm_up(self) -> None:
        """What must run before the traced command is released, lest it slow what is recorded."""

    def _capture_ending(self) -> None:
        """What the subclass adds to the meta of a capture that ends."""

    def _create_writer(self, number: int) -> CaptureWriter:
        path = self.path(number)
        _refuse_traced_output(path, self.file_filter)
        try:
            writer = CaptureWriter(path, self.opts.force, self.opts.group_readable,
                                   self.opts.max_size or _half_the_free_space(path))
        except CaptureWriteError as exc:
            raise RecordError(str(exc)) from None
        if writer.replaced:
            self._say(f"--force: replaced the earlier capture in {path} ({writer.replaced} files)")
        return writer

    def _start_capture(self, writer: CaptureWriter) -> None:
        """Everything one capture holds from its start: its meta, the processes learnt afresh,
        its own counts; then the subclass's (_capture_started)."""
        opts, file_filter = self.opts, self.file_filter
        self.writer = writer
        self.meta = meta = start_meta(self.argv, {
            "paths": list(file_filter.prefixes),
            "fs": sorted(file_filter.fstypes) if file_filter.fstypes else "any",
            "pids": opts.pids, "cgroup": opts.cgroup, "command": bool(opts.command),
        }, self._probes_meta())
        meta.update(self._own_meta())
        writer.write_meta(meta)
        self.identities = Identities()
        self.samplers = SamplerThread(self._start_samplers(meta["probes"]))
        self.rows = self._dropped_seen = 0
        self._last_status = time.monotonic()    # the first status line 5 s into the capture, not after the load
        self._capture_started()

    def loop(self) -> None:
        """Release the traced command and record until a stop: a signal, the command's end or
        --duration; then the last rows, taken while the source is still open."""
        opts, proc = self.opts, self.proc
        deadline = time.monotonic() + opts.duration if opts.duration else None
        self._warm_up()
        self._drain()
        if proc is not None:
            proc.release()
        self._say_recording()
        while self.stop_reason is None:
            self._drain()
            if proc is not None and proc.poll() is not None:
                self.stop_reason = "command exited"
            elif deadline and time.monotonic() >= deadline:
                self.stop_reason = DURATION
            elif self.next_requested:
                self._next_capture()
            else:
                self._wait(min(self.WAIT, deadline - time.monotonic()) if deadline else self.WAIT)
        self._end_command()
        self._last_rows()

    def _end_command(self) -> None:
        """A stop before the traced command's end (Ctrl-C, SIGTERM, q, --duration) ends it too,
        recorded to its end: SIGTERM to its process group, SIGKILL after COMMAND_GRACE s. Left
        running, it would go on unrecorded, reparented away from the user who started it."""
        proc = self.proc
        if proc is None:
            return
        if self.stop_reason == "SIGINT" and not proc.own_group:
            self._drain_until_exit(COMMAND_GRACE)      # the terminal's Ctrl-C reached it too
        if proc.poll() is not None:
            return
        target = f"{'its process group' if proc.own_group else 'it'} (pid {proc.pid})"
        proc.signal(signal.SIGTERM)
        if self._drain_until_exit(COMMAND_GRACE) is not None:
            said = f"stopped the traced command: SIGTERM to {target}"
        else:
            proc.signal(signal.SIGKILL)
            said = (f"stopped the traced command: SIGKILL to {target}, {COMMAND_GRACE:g} s after SIGTERM did not end it"
                    if self._drain_until_exit(COMMAND_GRACE) is not None else
                    f"could not stop the traced command (pid {proc.pid}): it outlived SIGTERM and SIGKILL, "
                    f"{COMMAND_GRACE:g} s each (blocked in the kernel, on a hung NFS server?)")
        self._say(said, always=True)

    def _drain_until_exit(self, seconds: float) -> int | None:
        """Record while the traced command ends, for at most `seconds`: -> its status, None if it runs on."""
        end = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < end:
            self._drain()
            self._wait(min(self.WAIT, max(end - time.monotonic(), 0)))
        return self.proc.returncode

    def _say_recording(self) -> None:
        proc = self.proc
        self._say(f"recording to {self.output} ({self._recording_what()}"
                  f"{', command pid %d' % proc.pid if proc else ''}); "
                  f"{'SIGUSR1 for the next capture, ' if NUMBER in self.opts.output else ''}Ctrl-C to stop")

    def _next_capture(self) -> None:
        """End this capture as a stop would, and start the next. Its directory is created
        first: when it cannot be, this capture goes on and the message says why."""
        self.next_requested = False
        if NUMBER not in self.opts.output:
            self._say(f"SIGUSR1 ignored: -o has no {NUMBER} to number a next capture", always=True)
            return
        try:
            writer = self._create_writer(self.number + 1)
        except RecordError as exc:
            self._say(f"no next capture: {exc}; still recording to {self.output}", always=True)
            return
        self._last_rows()
        self._capture_ending()
        failure = self._close_capture("SIGUSR1")
        if failure:
            writer.close()
            raise CaptureWriteError(failure)
        self._say(f"capture {self.number} ended (SIGUSR1): {self._totals_line()}")
        self.number += 1
        self.stopped = None
        self._start_capture(writer)
        self._say_recording()

    def _last_rows(self) -> None:
        """The rows that end a capture, taken while the source is open."""
        self._drain()   # what arrived before the stop
        self._write_agent(time.monotonic())    # the totals, however short the capture
        self.stopped = clock_pair()            # closing the source (detaching probes) can take seconds
        self.meta["mountstats_stop"] = nfs_mountstats()

    def finish(self, failure: str | None) -> str | None:
        """Close the source, restore the signals, write the last rows and the stop record, close
        the capture; after a write failure, only what can still be said. -> the failure, if any."""
        self._restore_signals()
        self._capture_ending()
        self._detach()
        return self._close_capture(failure or self.stop_reason, failure)

    def _restore_signals(self) -> None:
        for sig in (*self._stop_signals(), signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _close_capture(self, reason: str | None, failure: str | None = None) -> str | None:
        """The capture's last rows that need no source, its stop record; close it."""
        writer, meta = self.writer, self.meta
        for name, rows in self.samplers.stop():
            if failure is None:
                writer.append(name, rows)
        try:
            if failure is None:
                self._flush_identities(final=True)
            self.identities.reader.stop()
            meta["stop"] = self.stopped or clock_pair()
            meta["stop_reason"] = reason
            meta["totals"] = {**self._totals(), "max_size": writer.max_bytes, "rows_over_max_size": writer.dropped}
            writer.write_meta(meta)
        except CaptureWriteError as exc:
            failure = failure or str(exc)
        writer.close()
        return failure

    @staticmethod
    def _start_samplers(probes: dict) -> dict:
        """NIC counters and the kernel log: optional, each skipped with its reason."""
        samplers = {}
        for name, make in (("netdev", NetdevSampler), ("kmsg", KmsgReader)):
            try:
                samplers[name] = make()
                probes["attached"][name] = True
            except Exception as exc:  # no netlink, no /dev/kmsg: record without them
                probes["skipped"][name] = f"{type(exc).__name__}: {exc}"
        return samplers

    def _tick(self) -> None:
        """After the rows of a drain: the samplers' rows, and what is due by the clock."""
        for name, rows in self.samplers.drain():
            self.writer.append(name, rows)
        now = time.monotonic()
        if now - self._last_stats >= STATS_EVERY:
            self._flush_identities()
            self._every_second()
            self._write_loss(now)
        if now - self._last_agent >= AGENT_EVERY:
            self._write_agent(now)
        self.writer.tick()
        if self.opts.status and now - self._last_status >= STATUS_EVERY:
            self._say(f"{self._status_text(now - self._last_status)}, {self.rows} rows, "
                      f"{self.writer.size_bytes() / 2**20:.1f} MiB")
            self._last_status = now

    def _flush_identities(self, final: bool = False) -> None:
        idents = self.identities.collect(_monotonic_ns())
        if final:  # the last reads are on their way; the watchdog bounds the wait
            end = time.monotonic() + READ_TIMEOUT + 0.5
            while self.identities.busy() and time.monotonic() < end:
                time.sleep(0.02)
                idents += self.identities.collect(_monotonic_ns())
        if not idents:
            return
        self.writer.append("procs", pa.Table.from_pylist([{
            "ts": i.first_seen, "tgid": i.tgid, "ppid": i.ppid, "comm": i.comm, "cmdline": i.cmdline,
            "cgroup": i.cgroup, "rank": i.rank, "local_rank": i.local_rank, "world_size": i.world_size,
            "rank_env": list(i.env.items()), "rank_source": i.rank_source,
            "inherited_from": i.inherited_from, "complete": i.complete,
        } for i in idents], schema=PROCS))

    def _write_loss(self, now: float) -> None:
        ts = _monotonic_ns()
        interval = int((now - self._last_stats) * 1e9)
        self._last_stats = now
        rows = [{"ts": ts, "interval_ns": interval, "probe": losses.LOSS_COUNTERS[name].probe,
                 "counter": name, "lost": lost} for name, lost in self._new_losses().items() if lost]
        dropped = sum(self.writer.dropped.values())
        if dropped > self._dropped_seen:
            if not self._dropped_seen:
                self._say(f"the capture reached its size limit ({self.writer.max_bytes / 2**20:.0f} MiB, --max-size): "
                          f"rows from now on are counted as lost, not written", always=True)
            rows.append({"ts": ts, "interval_ns": interval, "probe": losses.LOSS_COUNTERS[losses.MAX_SIZE_ROWS].probe,
                         "counter": losses.MAX_SIZE_ROWS,
                         "lost": dropped - self._dropped_seen})
            self._dropped_seen = dropped
        if rows:
            self.writer.append("loss", pa.Table.from_pylist(rows, schema=LOSS))

    def _write_agent(self, now: float) -> None:
        self._last_agent = now
        give_back()     # what a burst of events left: the row says what the agent holds
        ts = _monotonic_ns()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        self.writer.append("agent", pa.Table.from_pylist([{
            "ts": ts, "cpu_user_ns": int(ru.ru_utime * 1e9), "cpu_sys_ns": int(ru.ru_stime * 1e9),
            "rss_bytes": rss, "events": self._events(), "rows": self.rows,
            "capture_bytes": self.writer.size_bytes(), **self._bpf_runtime(),
        }], schema=AGENT))

    def _say(self, text: str, always: bool = False) -> None:
        if self.opts.status or always or text.startswith("recording"):
            print(f"slotscope: {text}", file=sys.stderr, flush=True)


def _terminal_job() -> bool:
    """Whether this process is the foreground job of the terminal on its stdin."""
    try:
        return os.tcgetpgrp(0) == os.getpgrp()
    except OSError:                 # stdin is no terminal (or none)
        return False


def empty(fd: int) -> None:
    """Read a non-blocking pipe dry."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
