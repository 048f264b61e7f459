"""`slotscope record --no-bpf`: a recording for those who cannot load BPF, from what an ordinary
user may read, sampled every interval: /proc/self/mountstats of every NFS mount (ms_ops,
ms_xprt), and for each process of the job its threads' state, wait channel, syscall and file
(thread_samples), its I/O counters (proc_io) and its identity and rank (procs); NIC counters
and the kernel log as the BPF recording has them. Chosen by --no-bpf, or by `record` itself
where the BPF probes cannot run (said in one line), unless --bpf insists on them.

A sampling thread reads on its own clock. A /proc read that hangs (a task holding a lock that
the read needs, stuck on the NFS server) would stop it: the recording's loop watches it, gives
it up after READ_STUCK s and starts another, which writes the stuck thread's rows with read_ok
false until the old one's read returns. Nothing here stats or opens a file on an NFS mount.
"""
from __future__ import annotations

import os
import queue
import resource
import select
import threading
import time

import pyarrow as pa

from slotscope.capture.tables import schema

from .files import FileFilter
from .mounts import MountTable
from .mountstats_sampler import MountstatsSampler
from .probes import SyscallProbes
from .proc_sampler import JobProcesses, ThreadSampler
from .recording import RecordError, RecordOptions, Recording, _filter_warnings, _monotonic_ns, empty

NO_BPF = "--no-bpf"
READ_STUCK = 0.5        # s a sample may take before its thread is given up as stuck in a /proc read
MOUNTS_EVERY = 5.0      # s between re-reads of the mount table, for --fs
SAMPLED_TABLES = ("ms_ops", "ms_xprt", "thread_samples", "proc_io")


def sampled_reason(opts: RecordOptions) -> str | None:
    """Why this recording samples instead of loading BPF probes; None: it loads them."""
    if opts.bpf == "off":
        return NO_BPF
    if opts.bpf == "on":
        return None
    return SyscallProbes().can_run()


class PathFilter:
    """Which files the thread samples may name: all, or those --path and --fs select (the
    filesystem from the mount table, never from the file: a stat could hang on NFS)."""

    def __init__(self, file_filter: FileFilter):
        self.file_filter = file_filter
        self._mounts, self._read_at = None, 0.0

    def __call__(self, path: str) -> bool:
        if not path.startswith("/"):        # pipe:[N], socket:[N], anon_inode:...
            return self.file_filter.fstypes is None and not self.file_filter.prefixes
        fstype = None
        if self.file_filter.fstypes is not None:
            if time.monotonic() - self._read_at > MOUNTS_EVERY:
                self._mounts, self._read_at = MountTable.read(), time.monotonic()
            mount = self._mounts.find(path)
            fstype = mount.fstype if mount else None
        return self.file_filter.matches(path, fstype)


class SamplingThread:
    """Samples every `interval` s on its own clock, mountstats then the job's threads; each
    sample goes to `out` whole. An interval whose time has passed while a sample was still
    reading is not sampled late: it is counted (`late`)."""

    def __init__(self, interval: float, job: JobProcesses, keep_path, skip: set[int], wake=lambda: None):
        self.interval = interval
        self.wake = wake        # the recorder's loop: a process joined or exec'd, read who it is now
        self.mountstats = MountstatsSampler()
        self.threads = ThreadSampler(job, keep_path, skip)
        self.skip = skip
        self.out: queue.Queue[tuple] = queue.Queue()
        self.busy_since: float | None = None     # when the sample being taken began
        self.abandoned = False
        self.stuck: tuple[int, int] | None = None    # (tgid, tid) it was reading when given up
        self.late = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slotscope-sampling")
        self._thread.start()

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            self.busy_since = time.monotonic()
            ts = _monotonic_ns()
            try:
                sample = (ts, *self.mountstats.sample(ts), *self.threads.sample(ts))
            except Exception:  # noqa: BLE001 (a sample failing must not stop the recording)
                sample = None
            self.busy_since = None
            if self.abandoned:
                break
            if sample is not None:
                self.out.put(sample)
                if sample[5] or sample[7]:      # joined, exec'd: a short-lived one is gone by the next look
                    self.wake()
            due += self.interval
            now = time.monotonic()
            if due < now:
                missed = int((now - due) / self.interval) + 1
                self.late += missed
                due += missed * self.interval
            self._stop.wait(due - now)
        if self.stuck:          # its read came back: the thread may be read again
            self.skip.discard(self.stuck[1])
        self.mountstats.close()
        self.threads.close()

    def stop(self) -> None:
        self._stop.set()
        if not self.abandoned:
            self._thread.join(timeout=READ_STUCK * 2)


class SampledRecorder(Recording):
    """A recording sampled from /proc and mountstats (see the module's doc)."""

    def __init__(self, opts: RecordOptions, argv: list[str], reason: str):
        super().__init__(opts, argv)
        self.reason = reason
        self.WAIT = max(opts.interval, 1.0)     # s between writes and looks at the sampler (a wake costs)
        self._late_seen = self._timed_out = self._timed_out_seen = 0

    def _check_options(self) -> None:
        opts = self.opts
        if self.reason != NO_BPF:
            self._say(f"BPF cannot be used here ({self.reason}); recording without it, sampling /proc and "
                      f"mountstats every {opts.interval:g} s (--bpf: BPF or nothing)", always=True)
        if opts.cgroup:
            raise RecordError("--cgroup: a sampled recording (no BPF) follows processes, not cgroups: "
                              "select them with --pid or -- COMMAND")
        if not opts.paths and not opts.fs:      # a sample names the file a thread waits on, wherever it is
            self.file_filter = FileFilter((), None)

    def _attach(self) -> None:
        # Three files kept open per thread of the job: a few thousand for 64 ranks of 20 threads,
        # past an ordinary user's soft limit (1024); a thread whose files cannot open is not sampled.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.job = JobProcesses(self.tgids)
        self.skip: set[int] = set()
        self.sampling = SamplingThread(self.opts.interval, self.job, PathFilter(self.file_filter), self.skip,
                                       self._wake_loop)
        self.samples = self._late_before = 0

    def _wake_loop(self) -> None:
        """From the sampling thread: drain now, not at the next WAIT (a process that joined is
        read while it lives; in the VM rig a 1 s save's ranks were gone a second after the look
        that found them, and went without rank)."""
        try:
            os.write(self._wake_w, b"s")
        except (AttributeError, BlockingIOError):   # no loop yet (it drains at its start), or woken already
            pass

    def _probes_meta(self) -> dict:
        return {"attached": {}, "skipped": {}}

    def _own_meta(self) -> dict:
        return {"sampled": {"interval_ns": round(self.opts.interval * 1e9), "reason": self.reason}}

    def _capture_started(self) -> None:
        now = _monotonic_ns()
        for tgid in sorted(self.job.members):   # the job's processes already known, in this capture too
            self.identities.want(tgid, now)
        self.samples = 0
        self._late_seen, self._timed_out_seen = self.sampling.late, self._timed_out
        self._late_start, self._timed_out_start = self._late_seen, self._timed_out_seen

    def _warnings(self) -> list[str]:
        return _filter_warnings(self.opts, None)

    def _wait(self, seconds: float) -> None:
        select.select([self._wake_r], [], [], max(seconds, 0))
        empty(self._wake_r)

    def _recording_what(self) -> str:
        return f"sampling /proc and mountstats every {self.opts.interval:g} s"

    def _drain(self) -> None:
        self._watch()
        rows = {name: [] for name in SAMPLED_TABLES}
        while True:
            try:
                ts, ms_ops, ms_xprt, threads, ios, joined, gone, execd = self.sampling.out.get_nowait()
            except queue.Empty:
                break
            self.samples += 1
            for tgid in joined:
                self.identities.want(tgid, ts)
            for tgid in execd:
                self.identities.exec_(tgid, ts)
            for tgid in gone:
                self.identities.exited(tgid)
            for name, got in zip(SAMPLED_TABLES, (ms_ops, ms_xprt, threads, ios)):
                rows[name] += got
        for name, got in rows.items():
            if got:
                self.writer.append(name, pa.Table.from_pylist(got, schema=schema(name)))
                self.rows += len(got)
        self._tick()

    def _watch(self) -> None:
        """Give up a sample stuck in a /proc read: its thread is skipped (rows with read_ok false)
        by a new sampling thread until the read returns."""
        sampling = self.sampling
        since = sampling.busy_since
        if since is None or time.monotonic() - since < READ_STUCK:
            return
        stuck = sampling.stuck = sampling.threads.reading
        sampling.abandoned = True
        self._late_before += sampling.late
        self._timed_out += 1
        if stuck:
            self.skip.add(stuck[1])
        self.sampling = SamplingThread(self.opts.interval, self.job, sampling.threads.keep_path, self.skip,
                                       self._wake_loop)
        self._say(f"a /proc read of {'thread %d of process %d' % stuck[::-1] if stuck else 'the job'} "
                  f"did not answer within {READ_STUCK:g} s: sampling goes on without it", always=True)

    def _late(self) -> int:
        return self._late_before + self.sampling.late

    def _new_losses(self) -> dict[str, int]:
        late, timed_out = self._late(), self._timed_out
        new = {"samples_late": late - self._late_seen, "reads_timed_out": timed_out - self._timed_out_seen}
        self._late_seen, self._timed_out_seen = late, timed_out
        return new

    def _detach(self) -> None:
        self.sampling.stop()

    def _events(self) -> int:
        return self.samples

    @staticmethod
    def _bpf_runtime() -> dict[str, int | None]:
        return {"bpf_run_ns": None, "bpf_run_cnt": None}

    def _lost(self) -> dict[str, int]:
        return {"samples_late": self._late() - self._late_start,
                "reads_timed_out": self._timed_out - self._timed_out_start}

    def _totals(self) -> dict:
        return {"samples": self.samples, "rows": self.rows, "lost": self._lost()}

    def _totals_line(self) -> str:
        return (f"{self.samples} samples, {self.rows} rows, {sum(self._lost().values())} late, "
                f"capture in {self.output}")

    def _status_text(self, elapsed: float) -> str:
        return f"{len(self.job.members)} processes sampled, {self._late()} late"
