"""Turn batches of raw events into `syscall` rows, in bulk.

The write family, the bulk of any storm, is matched to files with vectorised
lookups. Only the calls that change the fd table or name a path (open, close,
dup, rename, stat, ...) are handled one by one; they are few.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import (BOOKKEEPING_SYSCALLS, DUP_SYSCALLS, FLUSH_SYSCALLS, NFS_CALLS, OP_NAME,
                                        OP_NUMBER, OPEN_SYSCALLS, OPS, STAT_SYSCALLS, WRITE_SYSCALLS)
from slotscope.capture.tables import BLOCKED, SYSCALL

from .files import AT_FDCWD, UNKNOWN, FdTable, FileRegistry
from .identity import Identities
from .layouts import CLONE_THREAD, PROC_EXEC, PROC_EXIT, PROC_NEWTASK

AT_EMPTY_PATH = 0x1000
O_CLOEXEC = 0o2000000
F_DUPFD_CLOEXEC = 1030
CLOSE_RANGE_CLOEXEC = 1 << 2
FD_OPS = WRITE_SYSCALLS + FLUSH_SYSCALLS + ("ftruncate",)   # calls on an fd that make rows


def _op_set(names) -> np.ndarray:
    """Whether each op number (index) is one of `names`: one lookup per row, where np.isin
    sorted the batch (a storm's million rows a second go through three of these)."""
    table = np.zeros(max(OP_NUMBER.values()) + 1, bool)
    table[[OP_NUMBER[o] for o in names]] = True
    return table


_IS_FD_OP = _op_set(FD_OPS)
_IS_WRITE = _op_set(WRITE_SYSCALLS)
_IS_BOOKKEEPING = _op_set(BOOKKEEPING_SYSCALLS)
_SYSCALL_TYPE = SYSCALL.field("syscall").type
_OP_DICT = pa.array(("?",) + OPS, pa.string())   # index = op number
# NFS_CALL_* bit sets -> "fsync+flush" (index = the bits; 0 -> null)
_NFS_CALL_NAMES = pa.array([None] + ["+".join(n for i, n in enumerate(NFS_CALLS) if bits >> i & 1)
                                     for bits in range(1, 1 << len(NFS_CALLS))], pa.string())


class Decoder:
    def __init__(self, registry: FileRegistry, identities: Identities, ignore_fd=None, nfs_calls: bool = False):
        self.registry = registry
        self.nfs_calls = nfs_calls   # the nfs group times NFS calls inside syscalls
        self.fds = FdTable()
        self.identities = identities
        self.ignore_fd = ignore_fd or (lambda tgid, fd, gen: None)
        self._paths: dict[tuple[int, int, int], str] = {}
        self._envs: dict[int, tuple[int, dict[str, str]]] = {}   # tgid -> (its execve, rank variables)
        self._exits: list[int] = []        # exited in earlier batches; their fds still wanted
        self._new_exits: list[int] = []    # exited in this batch
        self.unnamed = 0   # rows dropped because their fd could not be named
        self.seen: set[int] = set()   # tgids with rows: their blocked path calls are worth showing

    # ---- process events ----
    def _proc_event(self, ev: tuple) -> None:
        ts, clone_flags, tid, tgid, _ptid, kind = ev
        if kind == PROC_NEWTASK and not clone_flags & CLONE_THREAD:
            self.fds.fork(tgid, tid, ts)
            self.identities.note_fork(tgid, tid)
            if tgid in self.registry.cwd:
                self.registry.cwd[tid] = self.registry.cwd[tgid]
        elif kind == PROC_EXEC:
            self.fds.close_fds(tgid, ts, only_cloexec=True)
        elif kind == PROC_EXIT:
            self._new_exits.append(tid)
            self._envs.pop(tid, None)

    # ---- rank variables, read at execve ----
    def _take_envs(self, envs: np.ndarray | None) -> None:
        """Each tgid's variables of its latest execve (a failed one's are replaced by the next)."""
        for ts, tgid, _pad, name, value in envs.tolist() if envs is not None and envs.size else ():
            if self._envs.get(tgid, (ts, None))[0] != ts:
                del self._envs[tgid]
            self._envs.setdefault(tgid, (ts, {}))[1][_c_str(name)] = _c_str(value)

    def _exec_env(self, tgid: int, exec_ts: int) -> dict[str, str] | None:
        ts, env = self._envs.pop(tgid, (None, None))
        return env if ts is not None and ts <= exec_ts else None

    # ---- paths ----
    def _take_paths(self, paths: np.ndarray) -> None:
        for ts, tid, _len, slot, _pad, raw in paths.tolist() if paths.size else ():
            self._paths[(tid, ts, slot)] = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")

    def _path(self, tid: int, ts: int, slot: int) -> str | None:
        return self._paths.pop((tid, ts, slot), None)

    def _absolute(self, tgid: int, dirfd: int, path: str | None, t: int) -> str | None:
        if path is None:
            return None
        if path.startswith("/"):
            return _normal(path)
        if dirfd == AT_FDCWD:
            base = self.registry.cwd_of(tgid)
        else:
            at = self.fds.at(FdTable.key(tgid, dirfd), t)
            info = self.registry.info(at[1]) if at else None
            base = info.path if info else None
        return _normal(os.path.join(base, path)) if base else None

    # ---- the one-by-one calls ----
    def _structural(self, ev: np.ndarray, idx: np.ndarray, procs: np.ndarray, fids: np.ndarray,
                    path2: dict) -> None:
        """Fd-table changes and process events, applied in time order (a fork copies the
        fds its parent had at that moment)."""
        times = np.concatenate([ev["ts_exit"][idx], procs["ts"]])
        order = np.argsort(times, kind="stable").tolist()
        proc_list = procs.tolist()
        idx = idx.tolist()
        # The fields as lists first: numpy's per-element access (~1 µs a field) was most of this loop.
        fields = ("op", "tid", "tgid", "ts_enter", "ts_exit", "ret", "fd", "fd2", "flags", "npaths")
        calls = list(zip(*(ev[name][idx].tolist() for name in fields)))
        for j in order:
            if j >= len(idx):
                self._proc_event(proc_list[j - len(idx)])
                continue
            i = idx[j]
            op, tid, tgid, t0, t1, ret, fd, fd2, flags, npaths = calls[j]
            op = OP_NAME[op]
            if op == "close":
                at = self.fds.at(FdTable.key(tgid, fd), t0)
                fids[i] = at[1] if at else self.registry.from_proc(tgid, fd)
                if ret == 0:
                    self.fds.set(FdTable.key(tgid, fd), t1, UNKNOWN)
            elif op in DUP_SYSCALLS:
                if ret >= 0:
                    at = self.fds.at(FdTable.key(tgid, fd), t0)
                    cloexec = (op == "dup3" and flags & O_CLOEXEC) or (op == "fcntl" and flags == F_DUPFD_CLOEXEC)
                    self.fds.set(FdTable.key(tgid, ret), t1, at[1] if at else UNKNOWN, bool(cloexec))
            elif op == "close_range":
                if ret == 0:
                    self.fds.close_fds(tgid, t1, fd & 0xFFFFFFFF, fd2 & 0xFFFFFFFF,
                                       mark_cloexec=bool(flags & CLOSE_RANGE_CLOEXEC))
            elif op == "fchdir":
                at = self.fds.at(FdTable.key(tgid, fd), t0)
                info = self.registry.info(at[1]) if at else None
                if ret == 0 and info:
                    self.registry.cwd[tgid] = info.path
            else:  # a path-taking call
                p = self._path(tid, t0, 0)
                if op in STAT_SYSCALLS and p == "" and flags & AT_EMPTY_PATH:
                    at = self.fds.at(FdTable.key(tgid, fd), t0)
                    fids[i] = at[1] if at else UNKNOWN
                    continue
                full = self._absolute(tgid, fd, p, t0)
                if op == "chdir":
                    if ret == 0 and full:
                        self.registry.cwd[tgid] = full
                    continue
                if full is None:
                    continue
                fids[i] = self.registry.file_id(tgid, full)
                if npaths > 1:
                    second = self._absolute(tgid, fd2, self._path(tid, t0, 1), t0)
                    path2[i] = second
                    if second and fids[i] < 0:
                        fids[i] = self.registry.file_id(tgid, second)  # renamed onto a traced path
                if op in OPEN_SYSCALLS and ret >= 0:
                    self.fds.set(FdTable.key(tgid, ret), t1, fids[i], bool(flags & O_CLOEXEC))
                    self.registry.learn_ino(fids[i], tgid, ret)
                    if fids[i] < 0:
                        self._ignore(tgid, ret, t1)

    def _ignore(self, tgid: int, fd: int, gen: int | None) -> None:
        if self.fds.skip(FdTable.key(tgid, fd), gen or 0):
            self.ignore_fd(tgid, fd, gen)

    # ---- a whole batch ----
    def feed(self, sys: np.ndarray, paths: np.ndarray, procs: np.ndarray,
             envs: np.ndarray | None = None, caught_up: bool = True) -> pa.Table | None:
        """One batch's rows. `caught_up`: the batch holds every syscall committed before its
        process events were read. A process's fds are forgotten only after such a batch that
        follows the one with its exit: its last calls were committed before the exit was seen,
        yet may have been read in the next batch, or later if that one stopped short."""
        rows = self._decode(sys, paths, procs, envs)
        if caught_up:
            for tgid in self._exits:
                self.fds.drop_process(tgid)
                self.registry.forget(tgid)
                self.identities.exited(tgid)
                self.seen.discard(tgid)
            self._exits = []
        self._exits += self._new_exits
        self._new_exits = []
        return rows

    def _decode(self, sys: np.ndarray, paths: np.ndarray, procs: np.ndarray,
                envs: np.ndarray | None) -> pa.Table | None:
        # Identity reads first, before the decoding below: a short-lived rank process
        # must still be alive (with its environment) when a worker reads /proc.
        self._take_envs(envs)
        for ev in procs[procs["kind"] == PROC_EXEC].tolist() if procs.size else ():
            self.identities.exec_(ev[3], ev[0], self._exec_env(ev[3], ev[0]))
        self._take_paths(paths)
        if sys.size == 0:
            self._structural(sys, np.empty(0, np.int64), procs, None, {})
            return None
        self.fds.keep_batch(int(sys["ts_enter"].min()))
        n = sys.size
        fids = np.full(n, UNKNOWN, np.int64)
        path2: dict[int, str | None] = {}   # row -> second path (renames)
        ops = sys["op"]
        fd_op = np.take(_IS_FD_OP, ops)   # take: twice as fast as indexing
        fd_rows = fd_op & (ops != OP_NUMBER["close"])
        structural = np.flatnonzero(~fd_rows)
        self._structural(sys, structural, procs, fids, path2)

        rows = np.flatnonzero(fd_rows)
        if rows.size:
            sel = slice(None) if rows.size == n else rows   # a storm's batch: every row, nothing to gather
            keys = (sys["tgid"][sel].astype(np.uint64) << np.uint64(32)) | \
                (sys["fd"][sel].astype(np.uint32).astype(np.uint64))
            found, since = self.fds.lookup(keys.astype(np.int64), sys["ts_enter"][sel],
                                           lambda k: self.registry.from_proc(k >> 32, k & 0xFFFFFFFF))
            fids[sel] = found
            self._ignore_unmatched(sys, rows, found, since)

        keep = self._kept(ops, fd_op, fids)
        self._drop_stale_paths()
        kept = np.flatnonzero(keep)
        if not kept.size:
            return None
        if kept.size == n:      # a storm's batch: nothing to drop
            kept = None
        return self._table(sys, kept, fids, self._second_paths(path2, n, kept))

    @staticmethod
    def _second_paths(path2: dict[int, str | None], n: int, kept: np.ndarray | None) -> pa.Array:
        """The path2 column of the kept rows: a rename's second path, else null. Set by the few
        renames alone: a list of every row's cost ~100 ns a row, in each batch with a rename."""
        rows = n if kept is None else kept.size
        if not path2:
            return pa.nulls(rows, pa.string())
        at = np.fromiter(path2, np.int64, len(path2))
        if kept is not None:    # row numbers among the kept rows; renames dropped go
            pos = np.searchsorted(kept, at)
            found = (pos < kept.size) & (kept[np.minimum(pos, kept.size - 1)] == at)
            at, values = pos[found], [v for v, ok in zip(path2.values(), found.tolist()) if ok]
        else:
            values = list(path2.values())
        which = np.full(rows, -1, np.int64)       # -1: null
        which[at] = np.arange(at.size)
        return pa.array(values, pa.string()).take(pa.array(which, mask=which < 0))

    def _ignore_unmatched(self, sys, rows, found, since) -> None:
        for j in np.flatnonzero(found < UNKNOWN).tolist():   # named, and not a file of ours
            gen = int(since[j]) or None
            self._ignore(int(sys["tgid"][rows[j]]), int(sys["fd"][rows[j]]), gen)

    def _kept(self, ops, fd_op, fids) -> np.ndarray:
        self.unnamed += int(np.count_nonzero((fids == UNKNOWN) & fd_op))
        return (fids >= 0) & ~np.take(_IS_BOOKKEEPING, ops)

    def _drop_stale_paths(self) -> None:
        # Paths whose syscall record was lost (ring full) would pile up.
        if len(self._paths) > 100_000:
            self._paths.clear()

    def _table(self, sys: np.ndarray, kept: np.ndarray | None, fids: np.ndarray, path2: pa.Array) -> pa.Table:
        """The rows `kept` (None: all) of a batch. Each field is gathered on its own: a copy of
        the kept records first, then of their fields, copied every byte twice."""
        def field(name):    # contiguous: Arrow copied a strided field 3.5 times slower
            return np.ascontiguousarray(sys[name]) if kept is None else sys[name][kept]
        tgids, ts_enter, ts_exit = field("tgid"), field("ts_enter"), field("ts_exit")
        for tgid in pc.unique(pa.array(tgids)).to_pylist():   # a hash: np.unique sorts
            self.identities.want(tgid, int(ts_exit[0]))
            self.seen.add(tgid)
        ops, ret, nfs_calls = field("op"), field("ret"), field("nfs_calls")
        rows = len(ops)
        is_write = np.take(_IS_WRITE, ops)
        files = self.registry.columns(fids if kept is None else fids[kept])
        cols = {
            "ts_enter": ts_enter, "ts_exit": ts_exit,
            "latency_ns": ts_exit - ts_enter,
            "tid": field("tid"), "tgid": tgids,
            "syscall": pa.DictionaryArray.from_arrays(pa.array(ops.astype(np.int8)), _OP_DICT),
            "fd": field("fd"), "ret": ret,
            "bytes": pa.array(np.where(is_write & (ret > 0), ret, 0), pa.int64(),
                              mask=~is_write),
            "requested": field("count"), "offset": field("offset"),
            "errno": np.where(ret < 0, -ret, 0).astype(np.int32),
            "flags": field("flags"), "iov_partial": field("partial").astype(bool),
            "path": files["path"], "path2": path2,
            "dev": files["dev"], "ino": files["ino"], "fstype": files["fstype"],
            "nfs_ns": (pa.array(field("nfs_ns").astype(np.int64)) if self.nfs_calls
                       else pa.nulls(rows, pa.int64())),
            "nfs_calls": (pc.take(_NFS_CALL_NAMES, pa.array(nfs_calls.astype(np.int32))) if nfs_calls.any()
                          else pa.nulls(rows, pa.string())),
        }
        arrays = [c if isinstance(c, pa.Array) else pa.array(c, SYSCALL.field(name).type)
                  for name, c in cols.items()]
        return pa.Table.from_arrays(arrays, schema=SYSCALL)

    def blocked(self, tids: np.ndarray, calls: np.ndarray, now_ns: int, min_age_ns: int) -> pa.Table | None:
        """`blocked` rows: the traced syscalls in progress for at least min_age_ns. An fd call
        counts when its fd names a traced file; a path call (its path is read only at exit)
        when its process already has rows."""
        rows = []
        old = (calls["skip"] == 0) & (now_ns - calls["ts_enter"] >= min_age_ns)
        for tid, call in zip(tids[old].tolist(), calls[old]):
            tgid, op, fd, t = int(call["tgid"]), int(call["op"]), int(call["fd"]), int(call["ts_enter"])
            info = None
            if _IS_FD_OP[op]:
                found = self.fds.at(FdTable.key(tgid, fd), t)
                if found is None or found[1] < 0:
                    continue
                info = self.registry.info(found[1])
            elif tgid not in self.seen:
                continue
            rows.append({"ts": now_ns, "tid": tid, "tgid": tgid, "syscall": OP_NAME.get(op, "?"),
                         "ts_enter": t, "fd": fd, "path": info and info.path, "dev": info and info.dev,
                         "ino": info and info.ino})
        return pa.Table.from_pylist(rows, schema=BLOCKED) if rows else None


def _normal(path: str) -> str:
    """An absolute path normalised as the kernel reads it: POSIX leaves a leading "//" to the
    system and normpath keeps it, Linux reads it as "/" (pyenv opens "//.python-version")."""
    path = os.path.normpath(path)
    return path[1:] if path.startswith("//") else path


def _c_str(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
