"""Which file each syscall touched: the per-process fd table, kept from the event stream.

The kernel side reports fds and path strings only. Here they become files
(path, dev, inode, filesystem type): opens, dups and closes update a table of
(tgid, fd) -> file with the time each mapping began, so a write is matched to
the file its fd held when the write started, from the first write after the
open. Fds opened before recording began come from a scan of /proc/PID/fd.

Only /proc/PID/{fd,fdinfo,cwd,ns,mountinfo} are read here: none of them
touches the file itself, so none can hang on an unresponsive NFS server, and
none takes the locks a process in D state may hold.
"""
from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .layouts import Distinct
from .mounts import NFS_TYPES, MountTable

AT_FDCWD = -100
UNKNOWN = -1           # file id of an fd we could not name
NOT_A_FILE = -2        # file id of an fd that names no file (a pipe, socket, anon inode): skipped as other files are
HISTORY_NS = 5_000_000_000   # an fd's older mappings kept this long, for writes that started before a close
# Filesystems whose stat() answers from local state: safe to call from the drain.
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "zfs", "overlay"})


@dataclass(slots=True)     # up to FileRegistry.OTHER_MAX of them: no __dict__ each
class FileInfo:
    path: str
    dev: int | None
    ino: int | None
    fstype: str | None


@dataclass
class FileFilter:
    """By default files on NFS mounts; --path prefixes and --fs narrow or widen it."""
    prefixes: tuple[str, ...] = ()
    fstypes: frozenset[str] | None = NFS_TYPES   # None: any filesystem

    def matches(self, path: str, fstype: str | None) -> bool:
        if self.fstypes is not None and fstype not in self.fstypes:
            return False
        if self.prefixes:
            return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.prefixes)
        return True


def traced_devs(file_filter: FileFilter, tables: list[MountTable]) -> frozenset[int] | None:
    """The devices (st_dev) that may hold a file the filter matches, in these mount tables:
    those of the filtered filesystem types, narrowed to the mounts at, above or below a --path
    prefix. None when any device may (--fs any without --path). The kernel drops the stats
    of other devices (bpf/syscalls.c FILTER_DEVS)."""
    if file_filter.fstypes is None and not file_filter.prefixes:
        return None

    def related(point: str) -> bool:
        return any(p == point or p.startswith(point.rstrip("/") + "/") or point.startswith(p.rstrip("/") + "/")
                   for p in file_filter.prefixes)

    return frozenset(m.dev for table in tables for m in table.by_point.values()
                     if (file_filter.fstypes is None or m.fstype in file_filter.fstypes)
                     and (not file_filter.prefixes or related(m.mountpoint)))


def mount_tables() -> list[MountTable]:
    """The mount table of every mount namespace a process is in (a container's NFS mount is
    in its own), read once each."""
    tables, seen = [MountTable.read()], {os.readlink("/proc/self/ns/mnt")}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ns = os.readlink(f"/proc/{entry.name}/ns/mnt")
                if ns not in seen:
                    seen.add(ns)
                    tables.append(MountTable.read(entry.name))
            except OSError:     # gone, or a kernel thread
                continue
    return tables


STATX_INO = 0x100
AT_STATX_DONT_SYNC = 0x4000
AT_SYMLINK_NOFOLLOW = 0x100
STATX_TIMEOUT = 0.2   # s; a path walk on a frozen NFS server can still block


def _statx_ino(path: str) -> int | None:
    """The inode from the client's cached attributes: statx(AT_STATX_DONT_SYNC, STATX_INO)
    neither asks the NFS server nor flushes dirty pages (a plain stat() of a dirty NFS file does)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    if libc.statx(AT_FDCWD, path.encode(), AT_STATX_DONT_SYNC | AT_SYMLINK_NOFOLLOW, STATX_INO, buf) != 0:
        return None
    return int.from_bytes(buf.raw[32:40], "little")   # struct statx: stx_ino at offset 32


def _cached_ino(path: str, fstype: str | None) -> int | None:
    """Local filesystems answer stat() at once; any other gets statx without sync, in a
    thread we stop waiting for, so the drain never blocks on a server."""
    if fstype in LOCAL_FS:
        try:
            return os.lstat(path).st_ino
        except OSError:
            return None
    import threading
    result = []
    t = threading.Thread(target=lambda: result.append(_statx_ino(path)), daemon=True)
    t.start()
    t.join(STATX_TIMEOUT)
    return result[0] if result else None


def _fdinfo(tgid: int, fd: int) -> dict[str, str]:
    try:
        with open(f"/proc/{tgid}/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
            return dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except OSError:
        return {}


class FileRegistry:
    """Files by id, and the mount tables and cwds needed to name them.

    Files the filter matches get ids >= 0 and are kept for the whole recording
    (they are the capture's files). Every other file a process opens gets an id
    <= -2 in a bounded cache: enough to skip its fd and to resolve paths relative
    to an open directory, without growing with every file the machine opens."""

    OTHER_MAX = 65536

    def __init__(self, file_filter: FileFilter):
        self.filter = file_filter
        self.files: list[FileInfo] = []
        self._other: dict[int, tuple[tuple[str, str], FileInfo]] = {}
        self._next_other = NOT_A_FILE - 1
        self._ids: dict[tuple[str, str], int] = {}
        self._mounts: dict[str, MountTable] = {}
        self._ns: dict[int, str] = {}
        self.cwd: dict[int, str] = {}

    def _namespace(self, tgid: int) -> str:
        ns = self._ns.get(tgid)
        if ns is None:
            try:
                ns = os.readlink(f"/proc/{tgid}/ns/mnt")
            except OSError:
                ns = os.readlink("/proc/self/ns/mnt")
            self._ns[tgid] = ns
        return ns

    def mounts(self, tgid: int) -> MountTable:
        ns = self._namespace(tgid)
        table = self._mounts.get(ns)
        if table is None:
            try:
                table = MountTable.read(tgid)
            except OSError:
                table = MountTable.read()
            self._mounts[ns] = table
        return table

    def refresh_mounts(self) -> None:
        """Mounts come and go (an NFS mount made after recording began)."""
        self._mounts.clear()

    def forget(self, tgid: int) -> None:
        self._ns.pop(tgid, None)
        self.cwd.pop(tgid, None)

    def file_id(self, tgid: int, path: str, ino: int | None = None) -> int:
        ns = self._namespace(tgid)
        key = (ns, path)
        fid = self._ids.get(key)
        if fid is not None:
            if ino is not None and fid >= 0:
                self.files[fid].ino = ino
            return fid
        mount = self.mounts(tgid).find(path)
        fstype = mount.fstype if mount else None
        info = FileInfo(path, mount.dev if mount else None, ino, fstype)
        if self.filter.matches(path, fstype):
            self.files.append(info)
            fid = len(self.files) - 1
        else:
            if len(self._other) >= self.OTHER_MAX:  # forget the older half
                for old in list(self._other)[: self.OTHER_MAX // 2]:
                    self._ids.pop(self._other.pop(old)[0], None)
            fid = self._next_other
            self._next_other -= 1
            self._other[fid] = (key, info)
        self._ids[key] = fid
        return fid

    def info(self, fid: int) -> FileInfo | None:
        if fid >= 0:
            return self.files[fid]
        entry = self._other.get(fid)
        return entry[1] if entry else None

    def from_proc(self, tgid: int, fd: int) -> int:
        """Name an fd from /proc: for fds opened before recording began, or made by a call not
        traced (socket(), pipe(), accept()...)."""
        try:
            target = os.readlink(f"/proc/{tgid}/fd/{fd}")
        except OSError:
            return UNKNOWN
        if not target.startswith("/"):
            return NOT_A_FILE   # pipe:[..], socket:[..], anon_inode:...
        ino = _fdinfo(tgid, fd).get("ino")
        return self.file_id(tgid, target, int(ino) if ino and ino.strip().isdigit() else None)

    def learn_ino(self, fid: int, tgid: int, fd: int) -> None:
        """Fill an opened file's inode: from fdinfo if the fd is still open, else, on a
        local filesystem, from stat(). Never stat a network filesystem: it can hang on
        the server, and on NFS a stat of a dirty file flushes it (we would cause I/O)."""
        if fid < 0:
            return  # not a file of the capture
        info = self.files[fid]
        if info.ino is not None:
            return
        ino = self._fd_ino(tgid, fd, info.path)
        if ino is not None:
            info.ino = ino
        else:
            # Through the process's root; if it is gone, directly when it shared our mounts.
            same_ns = self._namespace(tgid) == os.readlink("/proc/self/ns/mnt")
            for path in (f"/proc/{tgid}/root{info.path}",) + ((info.path,) if same_ns else ()):
                ino = _cached_ino(path, info.fstype)
                if ino is not None:
                    info.ino = ino
                    return

    @staticmethod
    def _fd_ino(tgid: int, fd: int, path: str) -> int | None:
        """The inode behind an fd, if the fd still holds `path` (checked before and after:
        the fd may have been closed and reused since the event)."""
        link = f"/proc/{tgid}/fd/{fd}"
        try:
            if os.readlink(link) != path:
                return None
            ino = _fdinfo(tgid, fd).get("ino", "").strip()
            if not ino.isdigit() or os.readlink(link) != path:
                return None
        except OSError:
            return None
        return int(ino)

    def cwd_of(self, tgid: int) -> str | None:
        cwd = self.cwd.get(tgid)
        if cwd is None:
            try:
                cwd = self.cwd[tgid] = os.readlink(f"/proc/{tgid}/cwd")
            except OSError:
                return None
        return cwd

    def columns(self, fids: np.ndarray) -> dict[str, pa.Array]:
        """path, dev, ino, fstype for an array of file ids (UNKNOWN -> nulls)."""
        distinct = Distinct(fids)

        def column(attr, kind):
            return distinct.map(lambda fid: getattr(self.files[fid], attr) if fid >= 0 else None, kind)
        return {attr: column(attr, kind) for attr, kind in (("path", pa.string()), ("dev", pa.uint64()),
                                                             ("ino", pa.uint64()), ("fstype", pa.string()))}


class FdTable:
    """(tgid, fd) -> [(since_ns, file id)], oldest first. since 0 = open before recording."""

    def __init__(self):
        # A deque: an fd opened and closed 50,000 times a second keeps 250,000 entries of
        # history, and a list's pop(0) made each set() cost 9 µs instead of 0.6.
        self.history: dict[int, deque[tuple[int, int]]] = {}
        self._keys_of: dict[int, set[int]] = {}   # tgid -> its keys, for fork and exit
        self.cloexec: set[int] = set()              # keys whose current fd closes at exec
        self._skipped: dict[int, int] = {}          # key -> newest generation the kernel skips (0: from before)
        # Mappings in force at or after this are kept: the batch being decoded applies its fd
        # changes before it looks its calls up, and a drain that waited seconds for a CPU holds
        # a file's writes and its fd's reuse seconds later (keep_batch).
        self._keep_from = 1 << 62   # no batch yet: the history alone decides

    def keep_batch(self, earliest: int) -> None:
        """The batch about to be decoded has calls from `earliest` on."""
        self._keep_from = earliest - HISTORY_NS

    @staticmethod
    def key(tgid: int, fd: int) -> int:
        return (tgid << 32) | (fd & 0xFFFFFFFF)

    def set(self, key: int, since: int, fid: int, cloexec: bool = False) -> None:
        if cloexec:
            self.cloexec.add(key)
        else:
            self.cloexec.discard(key)
        hist = self.history.get(key)
        if hist is None:
            hist = self.history[key] = deque()
            self._keys_of.setdefault(key >> 32, set()).add(key)
        hist.append((since, fid))
        cutoff = min(since - HISTORY_NS, self._keep_from)
        while len(hist) > 1 and hist[1][0] < cutoff:
            hist.popleft()

    def at(self, key: int, t: int) -> tuple[int, int] | None:
        """(since, file id) of the mapping in force at time t, or None if unknown."""
        hist = self.history.get(key)
        if not hist:
            return None
        for since, fid in reversed(hist):
            if since <= t:
                return since, fid
        return None

    def lookup(self, keys: np.ndarray, times: np.ndarray, resolve) -> tuple[np.ndarray, np.ndarray]:
        """File ids and mapping start times for many (key, time) pairs at once.
        resolve(key) is called once for a key with no history (an fd from before recording)."""
        distinct = Distinct(keys)    # a hash: np.unique sorted the batch
        uniq, inverse = distinct.values, distinct.indices
        # Keys of one mapping (nearly all) are looked up together, in one pass over the rows:
        # a pass per key made a batch of a busy host's many fds cost keys x rows.
        first = np.zeros(len(uniq), np.int64)
        only = np.full(len(uniq), UNKNOWN, np.int64)
        several = []
        earliest = int(times.min()) if times.size else 0
        latest = None       # each key's latest call, for fds closed before the batch's end
        for i, key in enumerate(uniq):
            hist = self.history.get(key)
            if hist is None:
                self.set(key, 0, resolve(key))
                hist = self.history[key]
            elif hist[-1][1] == UNKNOWN:
                if latest is None:
                    latest = np.full(len(uniq), np.iinfo(np.int64).min, np.int64)
                    np.maximum.at(latest, inverse, times)
                if latest[i] > hist[-1][0] and (fid := resolve(key)) != UNKNOWN:
                    # Called after its close: made again by a call not traced (socket(), pipe()...),
                    # named from the close on, which is the generation the kernel gave it.
                    hist[-1] = (hist[-1][0], fid)
            # An fd whose newest mapping is older than the batch (a storm's, though its number
            # had other files before) is one mapping for every row: no search over its rows.
            if len(hist) == 1 or hist[-1][0] <= earliest:
                first[i], only[i] = hist[-1]
            else:
                several.append((i, hist))
        starts = first[inverse]
        ok = times >= starts     # a write from before the only mapping: unknown
        fids = np.where(ok, only[inverse], UNKNOWN)
        since = np.where(ok, starts, 0)
        for i, hist in several:
            rows = np.flatnonzero(inverse == i)
            starts = np.array([h[0] for h in hist], np.int64)
            pos = np.searchsorted(starts, times[rows], side="right") - 1
            ok = pos >= 0
            vals = np.array([h[1] for h in hist], np.int64)
            fids[rows] = np.where(ok, vals[np.maximum(pos, 0)], UNKNOWN)
            since[rows] = np.where(ok, starts[np.maximum(pos, 0)], 0)
        return fids, since

    def fork(self, parent: int, child: int, t: int) -> None:
        """A new process starts with its parent's fds."""
        for key in list(self._keys_of.get(parent, ())):
            fid = self.history[key][-1][1]
            if fid != UNKNOWN:
                self.set((child << 32) | (key & 0xFFFFFFFF), t, fid, key in self.cloexec)

    def close_fds(self, tgid: int, t: int, lo: int = 0, hi: int = 0xFFFFFFFF, only_cloexec: bool = False,
                  mark_cloexec: bool = False) -> None:
        """Fds closed without a close() of their own: close_range(), or O_CLOEXEC ones at exec."""
        for key in list(self._keys_of.get(tgid, ())):
            if not lo <= (key & 0xFFFFFFFF) <= hi or self.history[key][-1][1] == UNKNOWN:
                continue
            if mark_cloexec:
                self.cloexec.add(key)
            elif not only_cloexec or key in self.cloexec:
                self.set(key, t, UNKNOWN)

    def skip(self, key: int, gen: int) -> bool:
        """Note that the kernel is told to skip generation `gen` of an fd (0: opened before
        recording began). False when it was told already, of this one or a newer one (a late
        event of an older one must not take the mark off the fd's current file). Kept per fd
        and forgotten with the process: one per open of an untraced file was kept for the
        whole recording, 450,000 after 3 minutes on a busy host."""
        if self._skipped.get(key, -1) >= gen:
            return False
        self._skipped[key] = gen
        return True

    def drop_process(self, tgid: int) -> None:
        for key in self._keys_of.pop(tgid, ()):
            del self.history[key]
            self.cloexec.discard(key)
            self._skipped.pop(key, None)

    def scan_proc(self, registry: FileRegistry, tgids: list[int] | None = None) -> int:
        """Seed the table with every open fd of the given processes (default: all)."""
        count = 0
        for tgid in tgids if tgids is not None else _all_tgids():
            try:
                fds = os.listdir(f"/proc/{tgid}/fd")
            except OSError:
                continue
            for name in fds:
                fd = int(name)
                key = self.key(tgid, fd)
                if key not in self.history:
                    self.set(key, 0, registry.from_proc(tgid, fd))
                    count += 1
        return count


def _all_tgids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]
