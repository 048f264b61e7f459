"""The rank table of `slotscope top` as of the time cursor: its rows from analyze() as of the
cursor (rank_rows), or from a RankIndex, which answers a cursor move with the same rows for a
fraction of the cost.

A RankIndex is built once per generation of the captures' data (everything read so far) and
holds their rows as arrays. As of a cursor, the rows of a table are those whose time column is
at or before it (timeline.CaptureAt.read); each of a process's figures is a sum, count, minimum
or maximum over such rows, so a move is a handful of vector operations over all rows (no Arrow
call, no grouping), and Python work (the entry dicts) only for the ranks whose figures changed:
their other rows are the objects of the previous move. Which process each WRITE RPC is charged
to can change as the cursor moves (its writer's call may not have returned yet, see
attribution.py): the index knows from the whole capture when each RPC's charge is settled, and
works out the few unsettled ones at every move.

The rows are exactly rank_rows() of analyze() as of the cursor (tests/unit/test_rank_index.py
compares them at every cursor of real captures). What the index does not model it declines
(Unsupported: two captures of one host, rows without times or latency), and the caller
analyses every move in full.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.meta import start_ns
from slotscope.capture.syscalls import WRITE_SYSCALLS

from .attribution import WRITER_SYSCALLS, attributed_rpcs, kernel_dev
from .in_progress import BLOCKED_SHOWN_NS, SNAPSHOT_FRESH_NS, BlockedCall, BlockedNow
from .job import Job
from .rank_extras import RECENT_NS, RankExtras, SlowCall
from .ranks import add_calls, charge, finish_entry, new_entry, rank_key

BIG = np.iinfo(np.int64).max
SMALL = np.iinfo(np.int64).min
AT_STOP_NS = 2_000_000_000        # ranks.blocked_calls: a snapshot this close to the stop is "at stop"


@dataclass(frozen=True)
class RankRow:
    """A rank of the analysis, as is, with what the rank table shows beside it."""
    key: tuple                       # rank_key(entry): the rank's identity from one refresh to the next
    entry: dict                      # its entry in analysis["ranks"]
    extras: RankExtras
    blocked_now: BlockedNow | None


def rank_rows(ranks: list[dict], extras: dict[tuple, RankExtras], blocked: dict[tuple, BlockedNow]) -> list[RankRow]:
    """analyze()'s rank entries, in their order, with their rank_extras() and blocked_now()."""
    rows = []
    for entry in ranks:
        key = rank_key(entry)
        rows.append(RankRow(key, entry, extras.get(key, RankExtras()), blocked.get(key)))
    return rows


class Unsupported(Exception):
    """The captures hold what the index does not model; analyse every move in full."""


def _ints(col, what: str) -> np.ndarray:
    """A column without nulls as int64 (u64 values past 2**63 wrap: they are only compared)."""
    if col.null_count:
        raise Unsupported(f"{what} with nulls")
    return pc.cast(col, pa.int64(), safe=False).to_numpy()


def _filled(col, fill: int = 0) -> np.ndarray:
    return pc.fill_null(pc.cast(col, pa.int64(), safe=False), fill).to_numpy()


def _valid(col) -> np.ndarray:
    return pc.is_valid(col).to_numpy(zero_copy_only=False)


def _stacked(job: Job, table: str, columns: list[str]) -> tuple[pa.Table, np.ndarray] | None:
    """A table's columns from every capture, and each row's capture index."""
    parts, caps = [], []
    for i, cap in enumerate(job.captures):
        t = cap.read(table)
        if t is not None and t.num_rows:
            if not set(columns) <= set(t.column_names):
                raise Unsupported(f"{table} without {sorted(set(columns) - set(t.column_names))}")
            parts.append(t.select(columns))
            caps.append(np.full(t.num_rows, i, np.int64))
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="permissive"), np.concatenate(caps)


def _codes(col) -> tuple[np.ndarray, list]:
    """(codes, names) of a string or dictionary column: the names in first-seen order."""
    if col.null_count:
        raise Unsupported("syscall names with nulls")
    enc = pc.dictionary_encode(pc.cast(col, pa.string())).combine_chunks()
    return enc.indices.to_numpy().astype(np.int64), enc.dictionary.to_pylist()


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): the rows sorted by key (stably), and where each key's run starts."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    return order, np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if ordered.size else np.empty(0, np.int64)


class RankIndex:
    """rank_rows() of analyze() as of any cursor (ns since the captures' starts), from arrays
    built once from `job` (the whole data); `at(cursor)` is the job as of a cursor (JobSource.at),
    asked for the processes' identities when the procs rows seen change."""

    def __init__(self, job: Job, at):
        self.at = at
        caps = job.captures
        self.hosts = [c.meta.get("host", "?") for c in caps]
        if len(set(self.hosts)) < len(self.hosts):
            raise Unsupported("several captures of one host")
        self.offsets = [job.utc_offset_ns(h) for h in self.hosts]
        self.starts = np.array([start_ns(c.meta) for c in caps], np.int64)
        stops = [(c.meta.get("stop") or {}).get("monotonic_ns") for c in caps]
        self.at_stop = [(s or 1 << 62) - AT_STOP_NS for s in stops]
        sc = _stacked(job, "syscall", ["tgid", "tid", "syscall", "latency_ns", "bytes", "ts_enter", "ts_exit",
                                       "path", "dev", "ino"])
        blocked = _stacked(job, "blocked", ["ts", "tid", "tgid", "syscall", "ts_enter", "path"])
        rpc = attributed_rpcs(job)
        procs = _stacked(job, "procs", ["ts"])
        if sc is None:
            raise Unsupported("no syscall rows")        # nothing to rank: the full analysis is quick
        self.procs_rel = np.sort(_ints(procs[0]["ts"], "procs") - self.starts[procs[1]]) if procs else np.empty(0)
        # processes: (capture, tgid), one capture per host; numbered once for every table
        keys = [sc[1] << 32 | _ints(sc[0]["tgid"], "syscall tgid")]
        if blocked:
            keys.append(blocked[1] << 32 | _ints(blocked[0]["tgid"], "blocked tgid"))
        if rpc is not None:
            rpc_cap = np.array([self.hosts.index(h) for h in pc.unique(rpc["host"]).to_pylist()])
            rpc_cap = rpc_cap[pc.index_in(rpc["host"], pc.unique(rpc["host"])).to_numpy()]
            got = _valid(rpc["attributed_tgid"])
            keys.append(rpc_cap[got] << 32 | _filled(rpc["attributed_tgid"])[got])
        self.pkeys = np.unique(np.concatenate(keys))
        self.p_cap, self.p_tgid = (self.pkeys >> 32).tolist(), (self.pkeys & 0xFFFFFFFF).tolist()
        self._syscalls(sc)
        self._blocked(blocked)
        self._rpcs(rpc, rpc_cap if rpc is not None else None)
        self.epoch = -1
        self.rows_of: dict[int, RankRow] = {}           # rank number -> its row
        self.order: list[int] = []
        self.rpc_seen = None
        self.charged = None

    def pid(self, caps: np.ndarray, tgids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.pkeys, caps << 32 | tgids)

    # ---- built once ----

    def _syscalls(self, sc) -> None:
        t, cap = sc
        self.cap = cap
        self.tid = _ints(t["tid"], "syscall tid")
        self.lat = _ints(t["latency_ns"], "syscall latency")
        self.enter = _ints(t["ts_enter"], "syscall ts_enter")
        self.exit = _ints(t["ts_exit"], "syscall ts_exit")
        self.rel_enter, self.rel_exit = self.enter - self.starts[cap], self.exit - self.starts[cap]
        self.bytes_ok, self.nbytes = _valid(t["bytes"]), _filled(t["bytes"])
        self.path = t["path"].to_numpy(zero_copy_only=False)
        self.code, self.names = _codes(t["syscall"])
        self.P = self.pid(cap, _ints(t["tgid"], "syscall tgid"))
        # groups: (process, syscall), as per_process() groups its rows
        n = max(len(self.names), 1)
        gkeys, self.G = np.unique(self.P * n + self.code, return_inverse=True)
        self.gP, self.gname = gkeys // n, [self.names[c] for c in gkeys % n]
        self.g_write = np.array([name in WRITE_SYSCALLS for name in self.gname], bool)
        self.g_order, self.g_starts = _segments(self.G)
        self.groups_of = _lists(self.gP, len(self.pkeys))
        self.p_order = np.argsort(self.P, kind="stable")          # each process's rows (its p99)
        ids = np.arange(len(self.pkeys))
        self.p_lo = np.searchsorted(self.P[self.p_order], ids, "left")
        self.p_hi = np.searchsorted(self.P[self.p_order], ids, "right")
        self.by_exit = np.argsort(self.rel_exit, kind="stable")   # the recent window
        self.rel_exit_sorted = self.rel_exit[self.by_exit]
        self.g_cnt = None
        # the calls that make a process a file's writer (attribution.writers)
        writer = np.isin(self.code, [i for i, name in enumerate(self.names) if name in WRITER_SYSCALLS])
        writer &= _valid(t["dev"]) & _valid(t["ino"])
        w = self.writer_rows = np.flatnonzero(writer)
        self.first_write = np.full(len(self.pkeys), BIG, np.int64)     # its first writer call's return
        np.minimum.at(self.first_write, self.P[w], self.rel_exit[w])
        # its file as the RPC rows name it: (capture, the kernel's dev_t, inode)
        self.w_file = np.stack([cap[w], _ints(kernel_dev(pc.cast(t["dev"], pa.uint64()).take(w)), "dev"),
                                _ints(t["ino"].take(w), "ino")], axis=1) if w.size else np.empty((0, 3), np.int64)

    def _blocked(self, blocked) -> None:
        """The agent's snapshots of blocked calls: ranks.blocked_calls groups them per call."""
        if blocked is None:
            self.b_rel, self.B, self.bP = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
            self.b_order = self.b_starts = self.snap_order = np.empty(0, np.int64)
            self.b_cnt = None
            return
        t, cap = blocked
        ts, self.b_tid = _ints(t["ts"], "blocked ts"), _ints(t["tid"], "blocked tid")
        self.b_enter, self.b_cap = _ints(t["ts_enter"], "blocked ts_enter"), cap
        self.b_ts, self.b_rel = ts, ts - self.starts[cap]
        code, self.b_names = _codes(t["syscall"])
        self.b_path = t["path"].to_numpy(zero_copy_only=False)
        given = np.array([p is not None for p in self.b_path], bool)
        self.b_paths = np.unique(self.b_path[given]) if given.any() else np.empty(0, object)
        self.b_path_code = np.full(len(ts), -1, np.int64)
        self.b_path_code[given] = np.searchsorted(self.b_paths, self.b_path[given])
        tgid = _ints(t["tgid"], "blocked tgid")
        keys = np.stack([cap, self.b_tid, tgid, self.b_enter, code], axis=1)
        ukeys, self.B = np.unique(keys, axis=0, return_inverse=True)
        self.B = self.B.ravel()
        self.bP = self.pid(ukeys[:, 0], ukeys[:, 2])
        self.bkeys = ukeys
        self.b_enter_of = ukeys[:, 3].tolist()
        self.b_order, self.b_starts = _segments(self.B)
        self.blocked_of = _lists(self.bP, len(self.pkeys))
        self.b_cnt = None
        # the snapshots in time order per capture (the latest one at the cursor)
        self.snap_order = np.lexsort((np.arange(len(ts)), self.b_rel, cap))
        self.snap_caps, self.snap_first = np.unique(cap[self.snap_order], return_index=True)
        self.snap_end = np.r_[self.snap_first[1:], len(ts)]

    def _rpcs(self, rpc: pa.Table | None, cap: np.ndarray | None) -> None:
        """The WRITE RPCs charged to ranks (attributed_writes), each with its process over the
        whole data and from when on that holds (`settle`); before, it is worked out per move."""
        self.any_rpc_at = BIG
        self.w_rel = np.empty(0, np.int64)
        self.settle_rows = self.open_rows = self.w_settle = np.empty(0, np.int64)
        self.settle_starts = None
        if rpc is None:
            return
        rel_end = _ints(rpc["ts_end"], "rpc ts_end") - self.starts[cap]
        self.any_rpc_at = int(rel_end.min())
        w = np.flatnonzero(pc.fill_null(pc.equal(rpc["procname"], "WRITE"), False).to_numpy(zero_copy_only=False))
        how = rpc["attribution"].combine_chunks()
        method = np.array(how.dictionary.to_pylist(), object)[how.indices.to_numpy()[w]]
        got = _valid(rpc["attributed_tgid"])[w]
        target = np.full(w.size, -1, np.int64)
        target[got] = self.pid(cap[w][got], _filled(rpc["attributed_tgid"])[w][got])
        self.w_rel = rel_end[w]
        self.w_io_ok, self.w_io = _valid(rpc["io_count"])[w], _filled(rpc["io_count"])[w]
        self.w_slot = _filled(rpc["slot_wait_ns"])[w]
        settle = self.w_rel.copy()
        # direct: once the owner has a writer call in (its first one returned)
        owner = _filled(rpc["owner_tgid"], -1)[w]
        known = (owner >= 0) & np.isin(cap[w] << 32 | owner, self.pkeys)
        self.w_owner = np.where(known, self.pid(cap[w], owner), -1)
        direct = (method == "direct") & known
        settle[direct] = np.maximum(settle[direct], self.first_write[self.w_owner[direct]])
        # inode: the last writer of its file when it began, once that writer's call returned
        self.w_last = np.full(w.size, -1, np.int64)         # the writer call looked at first, when unsettled
        if {"fileid", "io_dev"} <= set(rpc.column_names) and self.writer_rows.size:
            fileid, dev = _filled(rpc["fileid"])[w], _filled(rpc["io_dev"])[w]
            begin = _ints(rpc["ts_begin"].take(w), "rpc ts_begin")
            files, ids = np.unique(np.concatenate([self.w_file, np.stack([cap[w], dev, fileid], axis=1)]), axis=0,
                                   return_inverse=True)
            ids = ids.ravel()
            cand_file, rpc_file = ids[:len(self.writer_rows)], ids[len(self.writer_rows):]
            enter = self.enter[self.writer_rows]
            times = np.unique(enter)
            span = times.size + 1
            ckey = cand_file * span + np.searchsorted(times, enter)
            corder = np.argsort(ckey, kind="stable")
            self.c_key, self.c_rows = ckey[corder], self.writer_rows[corder]
            self.c_file, self.c_span = cand_file[corder], span
            # the last writer call on the file entered at or before the RPC began
            last = np.searchsorted(self.c_key, rpc_file * span + np.searchsorted(times, begin, "right")) - 1
            ok = (fileid != 0) & (last >= 0)
            ok[ok] = self.c_file[last[ok]] == rpc_file[ok]
            self.w_last[ok] = last[ok]
            # over the whole data that call's entry (and any of the same entry) is the one found
            _, run_start = np.unique(self.c_key, return_index=True)
            run_max = np.maximum.reduceat(self.rel_exit[self.c_rows], run_start)
            run_of = np.repeat(np.arange(run_start.size), np.diff(np.r_[run_start, self.c_key.size]))
            inode = (method == "inode") & ok
            settle[inode] = np.maximum(settle[inode], run_max[run_of[self.w_last[inode]]])
        self.w_method = method
        self.w_settle = settle
        # settled charges, grouped per process
        charged = np.flatnonzero(target >= 0)
        if charged.size:
            order, self.settle_starts = _segments(target[charged])
            self.settle_rows = charged[order]
            self.settle_p = target[self.settle_rows][self.settle_starts]
        # the RPCs whose charge may differ before `settle`
        self.open_rows = np.flatnonzero(settle > self.w_rel)

    # ---- as of a cursor ----

    def _identify(self, cursor: int) -> None:
        """The processes' identities (job.identities() as of the cursor) -> rank numbers."""
        ident = self.at(cursor).identities()
        known = {}
        if ident is not None:
            for h, tgid, rank, comm in zip(ident["host"].to_pylist(), ident["tgid"].to_pylist(),
                                           ident["rank"].to_pylist(), ident["comm"].to_pylist()):
                known[(h, tgid)] = (rank, comm)
        numbers: dict[tuple, int] = {}
        self.comm, self.rank_of = [], np.zeros(len(self.pkeys), np.int64)
        for p, (c, tgid) in enumerate(zip(self.p_cap, self.p_tgid)):
            host = self.hosts[c]
            rank, comm = known.get((host, tgid), (None, None))
            self.comm.append(comm)
            self.rank_of[p] = numbers.setdefault((host, rank, tgid if rank is None else None), len(numbers))
        self.keys = list(numbers)
        self.members = _lists(self.rank_of, len(self.keys))
        self.rows_of, self.order = {}, []
        self.slow = np.full(len(self.keys), -1, np.int64)
        self.blocked_now: dict[int, BlockedNow] = {}

    def rows(self, cursor: int) -> list[RankRow]:
        """rank_rows() of analyze() as of `cursor` (ns since the captures' starts)."""
        t = int(cursor)
        epoch = int(np.searchsorted(self.procs_rel, t, "right"))
        dirty_all = epoch != self.epoch
        if dirty_all:
            self.epoch = epoch
            self._identify(t)
        changed = np.unique(np.concatenate([self._calls(t), self._snapshots(t), self._charges(t)]))
        entries = set(self.rank_of[changed].tolist())
        recent, blocked = self._recent(t), self._blocked_now(t)
        rpc_seen = t >= self.any_rpc_at
        if dirty_all or rpc_seen != self.rpc_seen:
            self.rpc_seen = rpc_seen
            entries = set(range(len(self.keys)))
        resort = False
        for k in entries:                    # their figures changed: built again
            row = self._row(k, t, rpc_seen)
            old = self.rows_of.pop(k, None)
            if row is not None:
                self.rows_of[k] = row
            if old is None or row is None or old.entry["pids"] != row.entry["pids"]:
                resort = True
        for k in (recent | blocked) - entries:      # only what is recent or in progress changed
            old = self.rows_of.get(k)
            if old is not None:
                extras = replace(old.extras, slowest_recent=self._slow(k)) if k in recent else old.extras
                self.rows_of[k] = replace(old, extras=extras, blocked_now=self.blocked_now.get(k))
        if resort:
            self.order = sorted(self.rows_of, key=lambda k: _order(self.rows_of[k].entry))
        return [self.rows_of[k] for k in self.order]

    def _calls(self, t: int) -> np.ndarray:
        """Each (process, syscall)'s visible calls: per_process()'s figures. -> changed processes."""
        if not self.G.size:
            self.g_cnt = np.empty(0, np.int64)
            return np.empty(0, np.int64)
        seen = self.rel_exit[self.g_order] <= t
        cnt = np.add.reduceat(seen, self.g_starts, dtype=np.int64)
        if self.g_cnt is not None and np.array_equal(cnt, self.g_cnt):
            return np.empty(0, np.int64)
        o, s = self.g_order, self.g_starts
        before = self.g_cnt
        self.g_cnt = cnt
        self.g_sum = np.add.reduceat(np.where(seen, self.lat[o], 0), s)
        self.g_max = np.maximum.reduceat(np.where(seen, self.lat[o], SMALL), s)
        self.g_bytes = np.add.reduceat(np.where(seen & self.bytes_ok[o], self.nbytes[o], 0), s)
        self.g_bytes_ok = np.add.reduceat(seen & self.bytes_ok[o], s, dtype=np.int64) > 0
        self.g_enter = np.minimum.reduceat(np.where(seen, self.enter[o], BIG), s)
        self.g_exit = np.maximum.reduceat(np.where(seen, self.exit[o], SMALL), s)
        # as lists: the entries are built in Python, a numpy scalar per figure costs more than the figure
        self.g = [a.tolist() for a in (self.g_cnt, self.g_sum, self.g_max, self.g_bytes, self.g_bytes_ok,
                                       self.g_enter, self.g_exit)]
        return self.gP if before is None else self.gP[cnt != before]

    def _snapshots(self, t: int) -> np.ndarray:
        """Each blocked call's snapshots up to the cursor (ranks.blocked_calls). -> changed processes."""
        if not self.B.size:
            return np.empty(0, np.int64)
        o, s = self.b_order, self.b_starts
        seen = self.b_rel[o] <= t
        cnt = np.add.reduceat(seen, s, dtype=np.int64)
        if self.b_cnt is not None and np.array_equal(cnt, self.b_cnt):
            return np.empty(0, np.int64)
        before = self.b_cnt
        self.b_cnt = cnt
        self.b_last = np.maximum.reduceat(np.where(seen, self.b_ts[o], SMALL), s)
        self.b_pmax = np.maximum.reduceat(np.where(seen, self.b_path_code[o], -1), s)
        self.b = [cnt.tolist(), self.b_last.tolist()]
        return self.bP if before is None else self.bP[cnt != before]

    def _charges(self, t: int) -> np.ndarray:
        """WRITE RPCs charged to each process (ranks._charge_rpcs). -> changed processes."""
        n = len(self.pkeys)
        cnt, nbytes, slot = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
        if self.settle_starts is not None:
            rows = self.settle_rows
            on = self.w_settle[rows] <= t
            ok = on & self.w_io_ok[rows]
            cnt[self.settle_p] = np.add.reduceat(ok, self.settle_starts, dtype=np.int64)
            nbytes[self.settle_p] = np.add.reduceat(np.where(ok, self.w_io[rows], 0), self.settle_starts)
            slot[self.settle_p] = np.add.reduceat(np.where(on, self.w_slot[rows], 0), self.settle_starts)
        o = self.open_rows
        for r in o[(self.w_rel[o] <= t) & (self.w_settle[o] > t)].tolist():
            p = self._charged_now(r, t)
            if p >= 0:
                cnt[p] += int(self.w_io_ok[r])
                nbytes[p] += int(self.w_io[r]) if self.w_io_ok[r] else 0
                slot[p] += int(self.w_slot[r])
        state = np.stack([cnt, nbytes, slot])
        before, self.charged = self.charged, state
        self.charged_lists = state.tolist()
        if before is None:
            return np.arange(n)
        return np.flatnonzero((state != before).any(axis=0))

    def _charged_now(self, r: int, t: int) -> int:
        """The process an unsettled WRITE RPC is charged to as of t (attribution._attribute with
        the calls returned by then: not by pointer, which is settled at the RPC's end): its owner
        once that wrote, else the last writer of its file whose call had returned; -1: none."""
        owner = self.w_owner[r]
        if owner >= 0 and self.first_write[owner] <= t:
            return int(owner)
        i = self.w_last[r]
        while i >= 0 and self.c_file[i] == self.c_file[self.w_last[r]]:
            row = self.c_rows[i]
            if self.rel_exit[row] <= t:
                return int(self.P[row])
            i -= 1
        return -1

    def _recent(self, t: int) -> set[int]:
        """Each rank's slowest call that returned in the RECENT_NS before the cursor (rank_extras).
        -> ranks whose changed."""
        lo, hi = np.searchsorted(self.rel_exit_sorted, [t - RECENT_NS, t], "right")
        w = self.by_exit[lo:hi]
        slow = np.full(len(self.keys), -1, np.int64)
        if w.size:
            k = self.rank_of[self.P[w]]
            order = np.lexsort((w, -self.lat[w], k))
            k = k[order]
            first = order[np.r_[True, k[1:] != k[:-1]]]
            slow[self.rank_of[self.P[w[first]]]] = w[first]
        changed = set(np.flatnonzero(slow != self.slow).tolist())
        self.slow = slow
        return changed

    def _blocked_now(self, t: int) -> set[int]:
        """in_progress() and blocked_now() as of the cursor. -> ranks whose changed."""
        parts = []          # (age, capture, snapshot 0 / trace 1, row, tid, syscall, path, ts_enter, process)
        if self.B.size:
            for c, a, b in zip(self.snap_caps.tolist(), self.snap_first.tolist(), self.snap_end.tolist()):
                rows = self.snap_order[a:b]
                n = int(np.searchsorted(self.b_rel[rows], t, "right"))
                if not n or self.b_rel[rows[n - 1]] < t - SNAPSHOT_FRESH_NS:
                    continue
                latest = self.b_ts[rows[n - 1]]
                first = int(np.searchsorted(self.b_rel[rows], self.b_rel[rows[n - 1]], "left"))
                for i in rows[first:n].tolist():
                    parts.append((int(latest - self.b_enter[i]), c, 0, i, int(self.b_tid[i]),
                                  self.b_names[self.bkeys[self.B[i], 4]], self.b_path[i], int(self.b_enter[i]),
                                  int(self.bP[self.B[i]])))
        going = np.flatnonzero((self.rel_enter <= t - BLOCKED_SHOWN_NS) & (self.rel_exit > t))
        for i in going.tolist():
            parts.append((int(t - self.rel_enter[i]), int(self.cap[i]), 1, i, int(self.tid[i]),
                          self.names[self.code[i]], self.path[i], int(self.enter[i]), int(self.P[i])))
        parts = [p for p in parts if p[0] >= BLOCKED_SHOWN_NS]
        parts.sort(key=lambda p: (-p[0], p[1], p[2], p[3]))       # in_progress: the longest age first
        seen, per = set(), {}
        for age, c, part, _, tid, name, path, enter, p in parts:
            if (c, tid, enter) in seen:                           # one row per call
                continue
            seen.add((c, tid, enter))
            per.setdefault(int(self.rank_of[p]), []).append(
                BlockedCall(tid, name, path, age, "snapshot" if part == 0 else "trace"))
        now = {}
        for k, calls in per.items():
            calls.sort(key=lambda b: (-b.age_ns, b.tid))
            now[k] = BlockedNow(calls[0], len(calls))
        changed = {k for k in now.keys() | self.blocked_now.keys() if now.get(k) != self.blocked_now.get(k)}
        self.blocked_now = now
        return changed

    def _row(self, k: int, t: int, rpc_seen: bool) -> RankRow | None:
        """Rank k's row as of t, from the figures of its processes; None: it has no row yet."""
        host, rank, _ = self.keys[k]
        cnt, total, longest, nbytes, has_bytes, enter, leave = self.g
        snaps, last = self.b if self.B.size else ([], [])
        r, comms, calls, at_stop = None, set(), [], None
        for p in self.members[k]:
            groups = [g for g in self.groups_of[p] if cnt[g]]
            stuck = [b for b in self.blocked_of[p] if snaps[b]] if self.B.size else []
            if not groups and not stuck:
                continue
            offset = self.offsets[self.p_cap[p]]
            start = min([enter[g] for g in groups] + [self.b_enter_of[b] for b in stuck]) + offset
            end = max([leave[g] for g in groups] + [last[b] for b in stuck]) + offset
            if r is None:
                r = new_entry(rank, host, start, end)
            r["pids"].append(self.p_tgid[p])
            if self.comm[p]:
                comms.add(self.comm[p])
            r["save_start_ns"], r["save_end_ns"] = min(r["save_start_ns"], start), max(r["save_end_ns"], end)
            for b in stuck:
                if last[b] >= self.at_stop[self.p_cap[p]]:
                    at_stop = (b, p)
            calls += groups
        if r is None:
            return None
        if at_stop is not None:
            b, p = at_stop
            path = self.b_pmax[b]
            r["blocked_at_stop"] = {"syscall": self.b_names[self.bkeys[b, 4]],
                                    "path": None if path < 0 else self.b_paths[path], "pid": self.p_tgid[p],
                                    "seconds": (last[b] - self.b_enter_of[b]) / 1e9}
        for g in calls:
            add_calls(r, self.gname[g], cnt[g], total[g], longest[g], nbytes[g] if has_bytes[g] else None)
        finish_entry(r, comms)
        if rpc_seen:
            rpcs, io, slot = self.charged_lists
            mine = self.members[k]
            charge(r, sum(rpcs[p] for p in mine), sum(io[p] for p in mine), sum(slot[p] for p in mine))
        return RankRow(rank_key(r), r, self._extras(k, calls, t), self.blocked_now.get(k))

    def _extras(self, k: int, groups: list[int], t: int) -> RankExtras:
        """rank_extras() of rank k as of t."""
        cnt, _, longest, nbytes, has_bytes, _, _ = self.g
        n = sum(cnt[g] for g in groups)
        if not n:
            return RankExtras()
        pick = int(math.ceil(0.99 * (n - 1)))       # numpy's percentile "higher", as _p99_per_group
        if pick == n - 1:
            p99 = max(longest[g] for g in groups)
        else:
            rows = np.concatenate([self.p_order[self.p_lo[p]:self.p_hi[p]] for p in self.members[k]])
            p99 = int(np.partition(self.lat[rows[self.rel_exit[rows] <= t]], pick)[pick])
        writes = [g for g in groups if self.g_write[g]]
        calls = sum(cnt[g] for g in writes)
        written = sum(nbytes[g] for g in writes if has_bytes[g])
        return RankExtras(p99, calls, written / calls if calls else None, self._slow(k))

    def _slow(self, k: int) -> SlowCall | None:
        s = int(self.slow[k])
        if s < 0:
            return None
        return SlowCall(self.names[self.code[s]], int(self.lat[s]), int(self.rel_exit[s]), self.path[s])


def _lists(owner: np.ndarray, n: int) -> list[list[int]]:
    """For each of n owners, the indices that `owner` maps to it."""
    out: list[list[int]] = [[] for _ in range(n)]
    for i, o in enumerate(owner.tolist()):
        out[o].append(i)
    return out


def _order(entry: dict) -> tuple:
    """rank_table()'s order of its entries."""
    return (entry["rank"] is None, entry["rank"] or 0, entry["host"], entry["pids"])
