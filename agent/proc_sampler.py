"""The sampled mode's view of the job's processes, from /proc, every interval: per thread its
state, wait channel, current syscall and the file of its fd argument (thread_samples), per
process its I/O counters (proc_io).

The files read here (stat, wchan, syscall, io, the fd links) do not take the target's mmap
lock, unlike cmdline and environ (read by identity.py's workers with a timeout); they are kept
open and re-read with pread from 0, which regenerates them (a third of the cost of opening).
A kept fd names its task, not a pid number: once the task exits it reads ESRCH, even if the
number is reused, and the sampler lets the task go.
"""
from __future__ import annotations

import os
import platform

from slotscope.capture.syscalls import DIRFD_FIRST, FD_FIRST, IDLE_SYSCALLS, SYSCALL_NUMBERS

# /proc/PID/stat after the ")" that ends comm: the fields from the third (state) on.
STAT_STATE, STAT_PPID, STAT_THREADS = 0, 1, 17
NAMES = {nr: name for name, nr in SYSCALL_NUMBERS.get(platform.machine(), {}).items()}
AT_FDCWD = -100
_FILE_FIRST = frozenset(FD_FIRST + DIRFD_FIRST)
KTHREADD = 2            # the parent of every kernel thread
# ns between looks at /proc for processes that joined the job or left it: a listing of /proc took
# 0.6 ms here (cold), half of a sample of 64 ranks.
SCAN_EVERY_NS = 500_000_000
IO_IDLE_EVERY = 10      # samples between reads of the I/O counters of a process whose threads all wait idle
IO_COLUMNS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")


def parse_stat(text: str) -> list[str]:
    """The fields of /proc/PID/stat after comm (which may hold spaces and parentheses)."""
    return text[text.rindex(")") + 2:].split()


def stat_comm(text: str) -> str:
    return text[text.index("(") + 1:text.rindex(")")]


def parse_syscall(text: str) -> tuple[str | None, int | None]:
    """(name, fd) of /proc/PID/task/TID/syscall: "NR arg0 .. arg5 sp pc" in a syscall (fd: its
    first argument, for the calls that take a file or a directory first; None otherwise), "-1 sp pc"
    blocked outside one (a page fault), "running" on a CPU: (None, None); an unknown number: "nr N"."""
    nr, _, rest = text.partition(" ")
    if not nr.isdigit() or not rest:
        return None, None
    name = NAMES.get(int(nr)) or f"nr {nr}"
    if name in _FILE_FIRST:
        fd = int(rest.partition(" ")[0], 16) & 0xFFFFFFFF     # an int in a 64-bit register: its low half, signed
        return name, fd - (1 << 32) if fd >= 1 << 31 else fd
    return name, None


def parse_io(text: str) -> dict[str, int]:
    """/proc/PID/io: "rchar: N" lines, in the order of IO_COLUMNS."""
    words = text.split()
    return dict(zip(IO_COLUMNS, map(int, words[1:2 * len(IO_COLUMNS):2]))) if words[:1] == ["rchar:"] else {}


class _File:
    """A /proc file kept open, read again from its start."""
    __slots__ = ("fd",)

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    @classmethod
    def permitted(cls, path: str) -> "_File | None":
        """None where the kernel refuses it (io of another user's process, syscall of a process
        that is not a descendant under Yama's ptrace_scope 1): the rest is still read."""
        try:
            return cls(path)
        except PermissionError:
            return None

    def read(self) -> str:
        return os.pread(self.fd, 4096, 0).decode("utf-8", "replace")

    def close(self) -> None:
        os.close(self.fd)


class _Thread:
    __slots__ = ("stat", "wchan", "syscall")

    def __init__(self, base: str):
        self.stat = _File(f"{base}/stat")
        self.wchan = _File(f"{base}/wchan")
        self.syscall = _File.permitted(f"{base}/syscall")

    def close(self) -> None:
        for f in (self.stat, self.wchan, self.syscall):
            if f is not None:
                f.close()


class _Process:
    __slots__ = ("io", "threads", "nthreads", "comm", "idle_samples")

    def __init__(self, tgid: int):
        self.io = _File.permitted(f"/proc/{tgid}/io")
        self.threads: dict[int, _Thread] = {}
        self.nthreads = -1          # as the main thread's stat says; its task list is read again when it changes
        self.comm: str | None = None    # a change is an exec: its command line and environment are new
        self.idle_samples = IO_IDLE_EVERY   # since its I/O counters were read: read at once

    def close(self) -> None:
        if self.io is not None:
            self.io.close()
        for t in self.threads.values():
            t.close()


class JobProcesses:
    """Which processes are the job: `roots` and their descendants (a process is judged once, when
    first seen, by its parent then), or with no roots every process of this user but the agent
    (another user's process is looked at again at each scan: it may become this user's)."""

    def __init__(self, roots: list[int]):
        self.roots = set(roots)
        self.members: set[int] = set()
        self.others: set[int] = set()
        self.uid = os.getuid()

    def update(self) -> tuple[list[int], list[int]]:
        """Look at /proc: -> (processes that joined the job, processes of the job that are gone)."""
        pids = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        pids.discard(os.getpid())
        gone = sorted(self.members - pids)
        self.members &= pids
        self.others &= pids
        ppid = {}
        for pid in pids - self.members - self.others:
            try:
                if not self.roots and os.stat(f"/proc/{pid}").st_uid != self.uid:
                    continue    # not ours, yet: su, sudo -u and setpriv exec a user's program in a root's process
                with open(f"/proc/{pid}/stat", "rb") as f:
                    parent = int(parse_stat(f.read().decode("utf-8", "replace"))[STAT_PPID])
                if not self.roots and KTHREADD in (pid, parent):     # root's own: not its kernel threads
                    self.others.add(pid)
                    continue
                ppid[pid] = parent
            except (OSError, ValueError, IndexError):
                continue        # gone already
        before = set(self.members)
        for pid in sorted(ppid):
            self._judge(pid, ppid)
        return sorted(self.members - before), gone

    def _judge(self, pid: int, ppid: dict[int, int]) -> None:
        """Place pid and its unjudged ancestors among the members or the others."""
        chain = []
        while pid not in self.members and pid not in self.others and pid not in self.roots:
            if pid not in ppid or pid in chain:     # its parent exited unseen, or is another user's
                break
            chain.append(pid)
            pid = ppid[pid]
        member = not self.roots or pid in self.members or pid in self.roots
        if pid in self.roots and pid in ppid:
            chain.append(pid)
        (self.members if member else self.others).update(chain)


class ThreadSampler:
    """One sample of every thread of the job, rows as the THREAD_SAMPLES and PROC_IO schemas
    want them. `keep_path`: which files the rows may name. `skip`: threads not to read (a read of them hangs in another sampler): they get a
    row with read_ok false. `reading`: the thread being read, for the watchdog that decides to
    give this sampler up."""

    def __init__(self, job: JobProcesses, keep_path=lambda path: True, skip: set[int] | None = None):
        self.job = job
        self.keep_path = keep_path      # path -> whether the rows may name it (record's --path, --fs)
        self.procs: dict[int, _Process] = {}
        self.skip = skip if skip is not None else set()
        self.reading: tuple[int, int] | None = None
        self._scan_at = 0

    def sample(self, ts: int) -> tuple[list[dict], list[dict], list[int], list[int], list[int]]:
        """-> (thread rows, io rows, processes that joined, processes gone, processes that exec'd)."""
        joined, gone = [], []
        if ts >= self._scan_at:     # listing /proc costs more than reading the job's files
            joined, gone = self.job.update()
            self._scan_at = ts + SCAN_EVERY_NS
        for tgid in gone:
            self._forget(tgid)
        threads, ios, self.execd = [], [], []
        for tgid in sorted(self.job.members):
            proc = self.procs.get(tgid)
            try:
                if proc is None:
                    proc = self.procs[tgid] = _Process(tgid)
                first = len(threads)
                self._threads(tgid, proc, ts, threads)
                io = self._io(tgid, proc) if self._io_due(proc, threads[first:]) else {}
            except (OSError, ValueError, IndexError, KeyError):   # gone between the listing and the reads
                self._forget(tgid)
                continue
            if io:
                io["ts"], io["tgid"] = ts, tgid
                ios.append(io)
        self.reading = None
        return threads, ios, joined, gone, self.execd

    def _io_due(self, proc: _Process, rows: list[dict]) -> bool:
        """Whether to read the process's I/O counters now: every sample while one of its threads
        does something (runs, or waits in a syscall that is not idle), at least every IO_IDLE_EVERY
        samples otherwise (what it did between two samples shows in the next one either way):
        a third of the reads fewer when ranks wait."""
        proc.idle_samples += 1
        if proc.idle_samples >= IO_IDLE_EVERY or any(r["state"] != "S" or r.get("syscall") not in IDLE_SYSCALLS
                                                      for r in rows if r["read_ok"]):
            proc.idle_samples = 0
            return True
        return False

    @staticmethod
    def _io(tgid: int, proc: _Process) -> dict[str, int]:
        """Its I/O counters. Refused when first seen, they are asked for again: a process that
        su, sudo -u or setpriv start is root's until it execs the user's program (the VM rig's
        ranks, seen mid-way, had their bytes counted as none)."""
        if proc.io is None:
            proc.io = _File.permitted(f"/proc/{tgid}/io")
        return parse_io(proc.io.read()) if proc.io else {}

    def _threads(self, tgid: int, proc: _Process, ts: int, rows: list[dict]) -> None:
        if tgid not in proc.threads:            # new, or its main thread's files went (then it is gone)
            self._list_tasks(tgid, proc)
        main_text = proc.threads[tgid].stat.read()
        main_stat = parse_stat(main_text)
        comm = stat_comm(main_text)
        if proc.comm is not None and comm != proc.comm:
            self.execd.append(tgid)
        proc.comm = comm
        nthreads = int(main_stat[STAT_THREADS])
        if nthreads != proc.nthreads:
            self._list_tasks(tgid, proc)
            proc.nthreads = nthreads
        for tid, thread in list(proc.threads.items()):
            if tid in self.skip:
                rows.append({"ts": ts, "tgid": tgid, "tid": tid, "read_ok": False})
                continue
            self.reading = (tgid, tid)
            try:
                stat = main_stat if tid == tgid else parse_stat(thread.stat.read())
                rows.append(self._thread(tgid, tid, thread, stat[STAT_STATE], ts))
            except (OSError, ValueError, IndexError):       # the thread ended
                proc.threads.pop(tid).close()
                proc.nthreads = -1

    def _list_tasks(self, tgid: int, proc: _Process) -> None:
        tids = {int(name) for name in os.listdir(f"/proc/{tgid}/task")}
        for tid in set(proc.threads) - tids:
            proc.threads.pop(tid).close()
        for tid in sorted(tids - set(proc.threads)):
            try:
                proc.threads[tid] = _Thread(f"/proc/{tgid}/task/{tid}")
            except OSError:
                continue

    def _thread(self, tgid: int, tid: int, thread: _Thread, state: str, ts: int) -> dict:
        row = {"ts": ts, "tgid": tgid, "tid": tid, "state": state, "read_ok": True}
        if state == "R":            # on a CPU: nothing to wait in
            return row
        name, fd = parse_syscall(thread.syscall.read()) if thread.syscall else (None, None)
        row["syscall"], row["fd"] = name, fd
        if name not in IDLE_SYSCALLS:
            wchan = thread.wchan.read().strip()
            row["wchan"] = wchan if wchan and wchan != "0" else None
        if fd is not None:
            link = f"/proc/{tgid}/cwd" if name in DIRFD_FIRST and fd == AT_FDCWD else f"/proc/{tgid}/fd/{fd}"
            try:
                path = os.readlink(link)    # the kernel's name of the open file: no server asked
            except OSError:
                path = None                 # closed meanwhile (close() frees the fd before it flushes)
            row["path"] = path if path and self.keep_path(path) else None
        return row

    def _forget(self, tgid: int) -> None:
        proc = self.procs.pop(tgid, None)
        if proc is not None:
            proc.close()

    def close(self) -> None:
        for tgid in list(self.procs):
            self._forget(tgid)
