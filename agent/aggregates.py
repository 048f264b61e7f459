"""`slotscope watch`'s in-kernel aggregates: the AGGREGATE blocks of bpf/sunrpc.c and
bpf/syscalls.c, their compile flags, and the sweep that reads them once a drain.

The kernel keeps, cumulatively:
- per server (an index user space gives each RPC client's server in agg_server_of, from
  debugfs: ClientNames), the slots in use and the tasks waiting for one, summed over the
  server's clients, their integrals over time and the time with a task waiting ("full"), with
  when the current full period began;
- per (RPC client, procedure), histograms of slot wait, round trip and execute of every
  complete RPC, in the metrics' buckets with their sums;
- per (syscall, device), the calls on traced fds that make rows (writes, close, fsyncs,
  ftruncate), timed, with the bytes written; per process the same calls' bytes and time; the
  longest such call returned since the last sweep. Which fd is a traced file is decided here:
  the kernel holds a call on an fd not yet decided in agg_pending (per fd, generation and
  syscall) until a sweep decides it (from the decoder's fd table), folds it and marks the fd,
  whose later calls the kernel adds up itself.

A sweep (read_maps, then Aggregator.sweep) turns the maps into what was added since the last
sweep (a Sweep, plain data) for the metrics and the triggers: one read of each map per drain,
whatever the events. The calls that name a path (open, stat, rename...) are not aggregated:
only their rows tell whether the path is traced, and the metrics take them from the rows.
"""
from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass, field

from slotscope.capture.syscalls import OP_NAME, OP_NUMBER, WRITE_SYSCALLS

from .decode import FD_OPS
from .layouts import RPC_EVENT
from .metrics import BOUNDS_NS

AGG_SERVERS = 256           # servers one watch tells apart (bpf agg_servers)
PENDING_GIVE_UP_NS = 30_000_000_000     # an fd still undecided this long is never named: its calls go
SPANS = ("slot_wait", "rtt", "execute")


def bucket_tree(lo: int = 0, hi: int = len(BOUNDS_NS)):
    """Which histogram bucket a value (ns) goes in, as a binary search: a bucket number, or (bound,
    the tree for values <= bound, the tree for the rest). The metrics put a value in the first
    bucket whose bound it does not exceed; for an integer ns v, v <= bound exactly when v <=
    floor(bound). A search, not a sum of comparisons: each comparison is a branch to the
    verifier, which followed the sum's 2^18 paths past its limit (6.1: E2BIG)."""
    if lo == hi:
        return lo
    mid = (lo + hi) // 2
    return math.floor(BOUNDS_NS[mid]), bucket_tree(lo, mid), bucket_tree(mid + 1, hi)


def _c(tree) -> str:
    return str(tree) if isinstance(tree, int) else f"((ns)<={tree[0]}ULL?{_c(tree[1])}:{_c(tree[2])})"


def cflags() -> list[str]:
    """The -D flags of the AGGREGATE blocks."""
    ops = lambda names: "||".join(f"(op)=={OP_NUMBER[n]}" for n in names)
    return ["-DAGGREGATE", f"-DAGG_SERVERS={AGG_SERVERS}", f"-DAGG_NBUCKETS={len(BOUNDS_NS) + 1}",
            f"-DAGG_PROCNAME={RPC_EVENT.dtype['procname'].itemsize}",
            f"-DAGG_BUCKET(ns)={_c(bucket_tree())}",
            f"-DAGG_FD_OP(op)=({ops(FD_OPS)})", f"-DAGG_WRITE_OP(op)=({ops(WRITE_SYSCALLS)})"]


@dataclass
class Raw:
    """What one sweep read from the kernel's maps, as plain data (cumulative, as the kernel
    keeps them)."""
    clients: list[int] = field(default_factory=list)     # RPC clients whose counts changed unmapped
    servers: dict[int, tuple] = field(default_factory=dict)   # index -> (in_use, backlog, in_use_acc,
                                                              #   backlog_acc, full_ns, full_since)
    rpcs: dict[tuple[int, str], dict] = field(default_factory=dict)   # (client, procedure) -> span ->
                                                                      #   (bucket counts, sum ns)
    calls: dict[tuple[int, int], tuple] = field(default_factory=dict)   # (dev, op) -> (counts, sum ns, written)
    pending: dict[tuple[int, int, int, int], tuple] = field(default_factory=dict)   # (tgid, fd, gen, op) ->
                                # ((counts, sum ns, written), (its longest call's ns, ts_enter, tid))
    processes: dict[int, tuple[int, int]] = field(default_factory=dict)   # tgid -> (written, blocked ns)
    longest: tuple | None = None        # (ns, ts_enter, tid, tgid, fd, gen, op): the longest call on a marked fd
                                        # since the last sweep


@dataclass
class Sweep:
    """What the kernel added since the last sweep, labelled as the metrics label it."""
    rpcs: dict[tuple[str, str], dict] = field(default_factory=dict)   # (server, procedure) -> span ->
                                                                      #   (bucket counts, sum ns)
    transports: dict[str, dict] = field(default_factory=dict)   # server -> {in_use_ns, backlog_ns, full_ns}
    full_since: dict[str, int] = field(default_factory=dict)    # server -> when its table became full (now full)
    calls: dict[tuple[str, str], tuple] = field(default_factory=dict)   # (syscall, mount) -> (counts, sum ns,
                                                                        #   written)
    processes: dict[int, tuple[int, int]] = field(default_factory=dict)   # tgid -> (written, blocked ns)
    longest: dict | None = None     # the longest traced call returned: ns, tgid, tid, syscall, fd, ts_enter, path


@dataclass
class Writes:
    """What a sweep tells the kernel."""
    clients: dict[int, int] = field(default_factory=dict)           # RPC client -> server index
    marks: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)   # (tgid, fd) -> (gen, dev)
    forget: list[tuple[int, int, int, int]] = field(default_factory=list)          # agg_pending keys


def _minus(now: tuple, was: tuple | None) -> tuple:
    """A map value's growth: its counts and sums, element by element (an entry the kernel
    dropped and began again, an LRU's, counts from zero)."""
    if was is None:
        return now
    grown = [[a - b for a, b in zip(x, y)] if isinstance(x, list) else x - y for x, y in zip(now, was)]
    if any(v < 0 for g in grown for v in (g if isinstance(g, list) else [g])):
        return now
    return tuple(grown)


def _add(into: dict, key, value: tuple) -> None:
    was = into.get(key)
    into[key] = value if was is None else tuple(
        [a + b for a, b in zip(x, y)] if isinstance(x, list) else x + y for x, y in zip(was, value))


class Aggregator:
    """Turns each Raw into a Sweep and the Writes it needs. server_of(client) -> its server (None
    unknown); decide(tgid, fd, gen) -> (dev, mount, path) of the traced file the fd held at
    generation gen, False when it held an untraced one, None while that is not known yet."""

    def __init__(self, server_of, decide):
        self.server_of, self.decide = server_of, decide
        self.index: dict[str, int] = {}         # server -> its index in agg_servers
        self.mapped: dict[int, str] = {}        # RPC client -> its server
        self.mounts: dict[int, str] = {}        # dev -> its mount point, for the labels
        self._seen: dict = {}                   # (map, key) -> its last value
        self._reported: dict[str, dict] = {}    # server -> the integrals reported so far (ns)
        self._pending: dict[tuple, list] = {}   # agg_pending key -> [first seen ns, decided in sweep n]
        self.sweeps = 0

    def clients(self, ids) -> dict[int, int]:
        """Server indexes for the clients not mapped yet (to write in agg_server_of); a server past
        AGG_SERVERS is left out."""
        new = {}
        for cid in ids:
            if cid in self.mapped:
                continue
            server = self.server_of(cid) or "?"
            if server not in self.index and len(self.index) < AGG_SERVERS:
                self.index[server] = len(self.index)
            if server in self.index:
                self.mapped[cid] = server
                new[cid] = self.index[server]
        return new

    def sweep(self, raw: Raw, now_ns: int) -> tuple[Sweep, Writes]:
        self.sweeps += 1
        out, writes = Sweep(), Writes(clients=self.clients(raw.clients))
        self._rpcs(raw, out)
        self._transports(raw, now_ns, out)
        for (dev, op), value in raw.calls.items():
            _add(out.calls, (OP_NAME.get(op, "?"), self.mounts.get(dev, "?")),
                 _minus(value, self._seen.get(("calls", dev, op))))
            self._seen["calls", dev, op] = value
        for tgid, value in raw.processes.items():
            _add(out.processes, tgid, _minus(value, self._seen.get(("process", tgid))))
            self._seen["process", tgid] = value
        for tgid in {k[1] for k in self._seen if k[0] == "process"} - raw.processes.keys():
            del self._seen["process", tgid]         # evicted (the LRU) or exited
        if raw.longest:
            ns, ts_enter, tid, tgid, fd, gen, op = raw.longest
            decided = self.decide(tgid, fd, gen)
            out.longest = {"ns": ns, "tgid": tgid, "tid": tid, "syscall": OP_NAME.get(op, "?"), "fd": fd,
                           "ts_enter": ts_enter, "path": decided[2] if decided else None}
        self._fold_pending(raw, now_ns, out, writes)
        return out, writes

    def _rpcs(self, raw: Raw, out: Sweep) -> None:
        for (cid, proc), spans in raw.rpcs.items():
            server = self.mapped.get(cid) or self.server_of(cid) or "?"
            was = self._seen.get(("rpc", cid, proc))
            self._seen["rpc", cid, proc] = spans
            into = out.rpcs.setdefault((server, proc), {})
            for span in SPANS:
                _add(into, span, _minus(spans[span], was and was[span]))

    def _transports(self, raw: Raw, now_ns: int, out: Sweep) -> None:
        """Each server's integrals at now_ns (acc + count * now), reported as growth: never less
        than what was reported (a read between a count's change and its integral's overstates
        by the µs between them)."""
        names = {i: s for s, i in self.index.items()}
        for idx, (in_use, backlog, in_use_acc, backlog_acc, full_ns, full_since) in raw.servers.items():
            server = names.get(idx)
            if server is None:
                continue
            now = {"in_use_ns": in_use_acc + in_use * now_ns, "backlog_ns": backlog_acc + backlog * now_ns,
                   "full_ns": full_ns + (now_ns - full_since if full_since else 0)}
            reported = self._reported.setdefault(server, dict.fromkeys(now, 0))
            out.transports[server] = {k: max(0, v - reported[k]) for k, v in now.items()}
            for k, v in now.items():
                reported[k] = max(reported[k], v)
            if full_since:
                out.full_since[server] = full_since

    def _fold_pending(self, raw: Raw, now_ns: int, out: Sweep, writes: Writes) -> None:
        """Calls on fds the kernel did not know: folded once their fd is decided (traced: into
        its (syscall, mount) and process, and the fd marked; not traced: dropped). An entry is
        forgotten, in the kernel too, a sweep after its fd was marked: a call that looked for
        the mark just before it was made has added itself by then."""
        for key, value in raw.pending.items():
            tgid, fd, gen, op = key
            state = self._pending.setdefault(key, [now_ns, None])
            decided = self.decide(tgid, fd, gen)
            if decided is None:
                if now_ns - state[0] > PENDING_GIVE_UP_NS:
                    writes.forget.append(key)
                    self._forget(key)
                continue
            if decided is False:
                writes.forget.append(key)
                self._forget(key)
                continue
            dev, mount, path = decided
            self.mounts.setdefault(dev, mount)
            sums, (longest, ts_enter, tid) = value
            was = self._seen.get(("pending", key))
            self._seen["pending", key] = value
            counts, sum_ns, written = _minus(sums, was and was[0])
            _add(out.calls, (OP_NAME.get(op, "?"), mount), (counts, sum_ns, written))
            _add(out.processes, tgid, (written, sum_ns))
            if longest > (was[1][0] if was else 0) and longest > (out.longest or {}).get("ns", 0):
                out.longest = {"ns": longest, "tgid": tgid, "tid": tid, "syscall": OP_NAME.get(op, "?"), "fd": fd,
                               "ts_enter": ts_enter, "path": path}
            writes.marks[tgid, fd] = (gen, dev)
            if state[1] is None:
                state[1] = self.sweeps
            elif state[1] < self.sweeps:
                writes.forget.append(key)
                self._forget(key)
        for key in [k for k in self._pending if k not in raw.pending]:
            self._forget(key)

    def _forget(self, key) -> None:
        self._pending.pop(key, None)
        self._seen.pop(("pending", key), None)


# ---- the kernel's maps ----

def _hist(h) -> tuple[list[int], int]:
    return list(h.count), int(h.sum_ns)


def read_maps(bpf, groups: list[str], processes: bool, servers: int) -> Raw:
    """One read of every aggregate map of the probe groups loaded: of agg_servers, the first
    `servers` entries (those given out: a walk of all AGG_SERVERS took 512 syscalls a sweep);
    the per-process map only when `processes` are wanted (it holds up to 16,384 of them: the
    longest to read)."""
    raw = Raw()
    if "sunrpc" in groups:
        raw.clients = [k.value for k in bpf[b"agg_unmapped"]]
        table = bpf[b"agg_servers"]
        for i in range(servers):
            v = table[ctypes.c_int(i)]
            if v.in_use or v.backlog or v.in_use_acc or v.backlog_acc or v.full_ns or v.full_since:
                raw.servers[i] = (v.in_use, v.backlog, v.in_use_acc, v.backlog_acc, v.full_ns, v.full_since)
        for k, v in bpf[b"agg_rpcs"].items():
            raw.rpcs[k.client_id, k.procname.decode("utf-8", "replace")] = {
                span: _hist(getattr(v, span)) for span in SPANS}
    if "syscalls" in groups:
        for k, v in bpf[b"agg_calls"].items():
            raw.calls[k.dev, k.op] = (list(v.count), v.sum_ns, v.written)
        for k, v in bpf[b"agg_pending"].items():
            raw.pending[k.tgid, k.fd, k.gen, k.op] = ((list(v.count), v.sum_ns, v.written),
                                                      (v.longest_ns, v.longest_enter, v.longest_tid))
        for k, v in bpf[b"agg_processes"].items() if processes else ():
            raw.processes[k.value] = (v.written, v.blocked_ns)
        longest, zero = bpf[b"agg_longest"], ctypes.c_int(0)
        best = max(longest[zero], key=lambda v: v.latency_ns)
        if best.latency_ns > 0:
            raw.longest = (best.latency_ns, best.ts_enter, best.tid, best.tgid, best.fd, best.gen, best.op)
            del longest[zero]       # zeroed on every CPU: the next interval's longest
    return raw


def write_maps(bpf, writes: Writes) -> None:
    if writes.clients:
        server_of = bpf[b"agg_server_of"]
        for cid, idx in writes.clients.items():
            value = server_of.Leaf()
            value.server = idx
            try:
                server_of[ctypes.c_uint32(cid)] = value
            except Exception:   # full (4096 clients): the client's counts go unsummed
                pass
    if writes.marks:
        marks = bpf[b"agg_fds"]
        for (tgid, fd), (gen, dev) in writes.marks.items():
            value = marks.Leaf()
            value.gen, value.dev = gen, dev
            marks[ctypes.c_uint64((tgid << 32) | (fd & 0xFFFFFFFF))] = value
    if writes.forget:
        pending = bpf[b"agg_pending"]
        for tgid, fd, gen, op in writes.forget:
            key = pending.Key()
            key.gen, key.tgid, key.fd, key.op = gen, tgid, fd, op
            try:
                del pending[key]
            except KeyError:
                pass


def monotonic_ns() -> int:
    """The clock of bpf_ktime_get_ns (CLOCK_MONOTONIC), which the integrals' times are on."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)

