"""A deterministic model of a checkpoint save on NFS, written as a real capture.

save(path, ...) simulates `ranks` processes (pid 1000+rank, RANK in their identity) that
each create one file on an NFSv3/TCP mount of 10.0.0.1 and write it, and writes what the
agent would have recorded (meta.json with clock pairs, mount and sunrpc sysctls; syscall,
procs, rpc, nfs_io, slots, netdev, kmsg, loss, and blocked snapshots) with the real
CaptureWriter. It returns a manifest (per-rank pid, bytes, start/end and write-phase
times in UTC ns; RPC counts, timeouts, kernel lines) from which tests compute what the
analyzer should find independently of the capture.

The model (times are ns since the capture started, on the host's CLOCK_MONOTONIC):
- Every RPC takes one of `slots` transport slots, FIFO (xprt_backlog), and holds it while
  its request crosses the link (one FIFO wire shared by all RPCs, at link_bps or 10 Gb/s
  when the NIC reports no speed; beyond a 4 MiB socket buffer a request waits on
  xprt_sending) and for one round trip (`rtt_ms`; a COMMIT's: `commit_ms`). backlog, rtt
  and execute are what rpc_stats_latency reports.
- mode "osync": each write() sends one FILE_SYNC WRITE of its bytes and returns when it
  ends. "buffered": write() copies at 4 GB/s; close() flushes the file in `wsize` UNSTABLE
  WRITEs sent by a flusher kworker (charged to the rank only through the file's inode)
  and one COMMIT, and returns after the COMMIT. "fsync": the same flush in fsync(), in the
  rank's own context, then a quick close(). One shared wire means a flush waits behind
  every other rank's dirty data (head-of-line), so a buffered rank is never a lone straggler.
- `metadata_ops_per_rank` newfstatat calls first (a LOOKUP or GETATTR each); the
  openat(O_CREAT) sends a CREATE.
- freeze=(t0_s, t1_s), seconds since the save began: an RPC in flight at any moment of
  the freeze is answered one service time after it ends, timing out and retransmitted
  every `timeo_ds`/10 s until then. The kernel logs "not responding" at the first major
  timeout (timeo x (retrans+1) after a transmission; its linear TCP back-off simplified)
  and "OK" at the first reply after one.
- nconnect: the transport's `slots` are per connection, so nconnect connections hold
  slots x nconnect (one pool: the kernel's round robin over connections is not modelled).
  session_slots makes the mount NFSv4.1: an RPC takes one of that many session slots,
  shared by every connection, and the transport's slots do not limit (the kernel lifts
  them for v4.1 transports, VM-RIG.md); its wait is session sleep, not slot wait.
- server_threads=k: the server answers with k threads, each busy `server_ms` per RPC
  (FIFO), so the round trip grows with the number in flight once more than k are; the
  rest of rtt_ms is the network. link_bps caps the wire (the netdev speed says it).
- cpu_us: the rank computes that long before each write() (the client's own time).
- mode "local_copy": each rank writes its file to a local disk of local_mbps MB/s shared
  by all ranks (not traced: not NFS) and is free; a copier (pid 3000+rank, the rank's
  identity) then writes it to NFS through the page cache (close: flush and COMMIT).
- nfs_probes=False: a kernel without the sunrpc/NFS tracepoints (no rpc, nfs_io, slots);
  sysctls=False: no sunrpc sysctls in meta.json (the slot limit unknown).
- hung_rank: that rank's last RPC is never answered (outstanding at stop, as the agent
  writes those: complete=0, age_ns); its last syscall is killed after `hung_s` (-EINTR),
  or with hung_returns=False is still blocked when recording stops `hung_s` after it began.
"""
from __future__ import annotations

import heapq
import itertools
import uuid
from collections import deque

import numpy as np
import pyarrow as pa

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import KMSG, LOSS, NETDEV, NFS_IO, PROCS, RPC, SLOTS, SYSCALL, TABLES, schema

US, MS, S = 1_000, 1_000_000, 1_000_000_000
SERVER, PORT, DEV, CLIENT_ID, KWORKER = "10.0.0.1", 2049, 30, 3, 60
START_NS = 1_700_000_000 * S          # 2023-11-14T22:13:20Z
HEADER = 200                          # bytes of RPC header on the wire, each way
SNDBUF = 4 << 20                      # the socket's send buffer: a request waits on xprt_sending beyond it
O_SYNC, O_CREAT_TRUNC_WRONLY = 0o4010000, 0o1101


class Rpc:
    __slots__ = ("proc", "owner", "count", "stable", "fileid", "offset", "lost", "waiter", "begin",
                 "reserved", "first_tx", "wire_end", "reply", "end", "timeouts")

    def __init__(self, proc, owner, count=0, stable=0, fileid=0, offset=0, lost=False):
        self.proc, self.owner, self.count, self.stable = proc, owner, count, stable
        self.fileid, self.offset, self.lost, self.waiter = fileid, offset, lost, None
        self.reserved = self.first_tx = self.wire_end = self.reply = self.end = 0
        self.timeouts = 0


class Sim:
    """The event loop. Processes are generators that yield a sleep (ns), ("submit", rpcs) or
    ("wait", rpcs, cpu_before, cpu_after) and are sent the time they resume at."""

    def __init__(self, slots, rtt, commit, wire_bps, freeze, timeo, threads=None, server=0):
        self.heap, self.seq, self.rpcs = [], itertools.count(), []
        self.free, self.backlog, self.link_free = slots, deque(), 0
        self.rtt, self.commit, self.wire_bps, self.freeze, self.timeo = rtt, commit, wire_bps, freeze, timeo
        # the server's threads, as the times each is free again (arrivals come in grant order:
        # the wire is FIFO, so a reply can be computed when its slot is granted)
        self.threads, self.server = [0] * threads if threads else None, server

    def at(self, t, fn, *args):
        heapq.heappush(self.heap, (t, next(self.seq), fn, args))

    def run(self):
        while self.heap:
            t, _, fn, args = heapq.heappop(self.heap)
            fn(t, *args)

    def step(self, t, proc, first=False):
        try:
            cmd = next(proc) if first else proc.send(t)
        except StopIteration:
            return
        if isinstance(cmd, int):
            return self.at(t + cmd, self.step, proc)
        kind, rpcs, before, after = (*cmd, 0, 0)[:4]
        waiter = [len(rpcs), proc, after] if kind == "wait" and rpcs else None
        for r in rpcs:
            r.waiter = waiter
            self.arrive(t + before, r)
        if waiter is None:
            self.at(t, self.step, proc)

    def arrive(self, t, r):
        r.begin = t
        self.rpcs.append(r)
        if self.free and not self.backlog:
            self.grant(t + 1 * US, r)
        else:
            self.backlog.append(r)

    def grant(self, t, r):
        self.free -= 1
        r.reserved = t = max(t, r.begin + 1 * US)
        wire_start = max(t + 4 * US, self.link_free)
        self.link_free = r.wire_end = wire_start + (r.count + HEADER) * 8 * S // self.wire_bps
        # into the socket once what is queued ahead of it fits in the send buffer
        r.first_tx = max(t + 4 * US, wire_start - SNDBUF * 8 * S // self.wire_bps)
        service = self.commit if r.proc == "COMMIT" else self.rtt
        r.reply = r.wire_end + service
        if self.threads is not None:      # queued at the server for a free thread
            arrive = r.wire_end + (service - self.server) // 2
            start = max(arrive, heapq.heappop(self.threads))
            heapq.heappush(self.threads, start + self.server)
            r.reply = start + self.server + (service - self.server) // 2
        if self.freeze and r.first_tx < self.freeze[1] and r.reply > self.freeze[0]:
            r.reply = max(r.reply, self.freeze[1] + service)
            r.timeouts = (r.reply - r.first_tx - 1) // self.timeo
        if not r.lost:
            r.end = r.reply + 8 * US
            self.at(r.end, self.done, r)

    def done(self, t, r):
        self.free += 1
        if self.backlog:
            self.grant(t + 3 * US, self.backlog.popleft())
        w = r.waiter
        if w:
            w[0] -= 1
            if w[0] == 0:
                self.step(t + w[2], w[1])


def _rank(p, m, rows):
    """One rank's save; appends its syscall rows (enter, exit, tgid, name, fd, ret, flags, path, ino)."""
    now = yield p["delay"]
    pid = p["pid"]
    if m["mode"] == "local_copy":     # the local write (untraced), then the copier's buffered copy
        now = yield p["bytes"] * S // m["local_share_Bps"]
        p["blocking_end"], pid = now, p["copier"]
    for i in range(m["meta_ops"]):
        t0 = now
        now = yield ("wait", [Rpc("GETATTR" if i % 2 else "LOOKUP", pid)])
        rows.append((t0, now, pid, "newfstatat", -100, 0, 0, "/mnt/ckpt/step100", None))
    t0 = now
    now = yield ("wait", [Rpc("CREATE", pid)])
    flags = O_CREAT_TRUNC_WRONLY | (O_SYNC if m["mode"] == "osync" else 0)
    rows.append((t0, now, pid, "openat", -100, 3, flags, p["file"], p["ino"]))
    offsets = range(0, p["bytes"], m["write_bytes"])
    for off in offsets:
        if m["cpu_ns"]:
            now = yield m["cpu_ns"]
        t0, size = now, min(m["write_bytes"], p["bytes"] - off)
        if m["mode"] == "osync":
            rpc = Rpc("WRITE", pid, size, 2, p["ino"], off, lost=p["hung"] and off == offsets[-1])
            if rpc.lost:
                yield ("submit", [rpc], 15 * US)
                return (yield from _hang(m, rows, (t0, None, pid, "write", 3, -4, 0, p["file"], p["ino"])))
            now = yield ("wait", [rpc], 15 * US, 5 * US)       # the syscall's own CPU before and after
        else:
            now = yield 2 * US + size // 4
        rows.append((t0, now, pid, "write", 3, size, 0, p["file"], p["ino"]))
    for call in (["fsync", "close"] if m["mode"] == "fsync" else ["close"]):
        t0 = now
        if call == "fsync" or m["mode"] in ("buffered", "local_copy"):
            owner = KWORKER if call == "close" else pid
            now = yield ("wait", [Rpc("WRITE", owner, min(m["wsize"], p["bytes"] - o), 0, p["ino"], o)
                                  for o in range(0, p["bytes"], m["wsize"])])
            commit = Rpc("COMMIT", pid, 0, 0, p["ino"], 0, lost=p["hung"])
            if commit.lost:
                yield ("submit", [commit])
                return (yield from _hang(m, rows, (t0, None, pid, call, 3, -4, 0, p["file"], p["ino"])))
            now = yield ("wait", [commit])
        else:
            now = yield 20 * US
        rows.append((t0, now, pid, call, 3, 0, 0, p["file"], p["ino"]))


def _hang(m, rows, call):
    """The hung call: killed (-EINTR) after hung_s, or still blocked when recording stops."""
    if not m["hung_returns"]:
        m["open"].append(call)
        return
    now = yield m["hung_ns"]
    rows.append((call[0], now, *call[2:]))


def save(path, *, host="node-a", ranks=8, first_rank=0, world_size=None, file_bytes=512 * 1024,
         write_bytes=4096, mode="osync", slots=4, rtt_ms=20.0, commit_ms=None, link_bps=10e9,
         wsize=1 << 20, mono_start_ns=5_000 * S, realtime_start_ns=START_NS, lead_s=1.0, stagger_ms=0.2,
         freeze=None, timeo_ds=600, retrans=2, slow_rank=None, metadata_ops_per_rank=0, hung_rank=None,
         hung_s=60.0, hung_returns=True, lost_events=0, netdev=True, nconnect=1, session_slots=None,
         server_threads=None, server_ms=None, cpu_us=0, local_mbps=None, nfs_probes=True, sysctls=True,
         sampled_s=None, started_late=False) -> dict:
    """Simulate the save, write its capture at `path` and return the manifest (times in UTC ns).

    Ranks first_rank.. first_rank+ranks-1 enter the save `lead_s` after the capture starts,
    `stagger_ms` apart, each writing `file_bytes` (slow_rank=(rank, factor): that rank writes
    factor times as much; a factor below 1 makes it lighter). link_bps=None: the NIC reports
    no speed (the wire still runs at 10 Gb/s); netdev=False: no NIC counters at all.
    sampled_s: the capture `record --no-bpf` would write, sampling every sampled_s seconds
    (mountstats counters per interval and thread samples instead of traced RPCs and syscalls);
    the manifest's "mountstats" then holds the copies of /proc/self/mountstats it read;
    started_late: each rank's process is first sampled after its first write (it started after
    the agent), its first /proc/PID/io already counting bytes."""
    assert mode in ("osync", "buffered", "fsync", "local_copy")
    assert (mode == "local_copy") == (local_mbps is not None)
    lead, rtt = int(lead_s * S), int(rtt_ms * MS)
    frozen = freeze and (lead + int(freeze[0] * S), lead + int(freeze[1] * S))
    commit = int((rtt_ms if commit_ms is None else commit_ms) * MS)
    limit = slots * nconnect if session_slots is None else session_slots
    session_bound = session_slots is not None
    sim = Sim(limit, rtt, commit, int(link_bps or 10e9), frozen, timeo_ds * S // 10, server_threads,
              int((server_ms if server_ms is not None else rtt_ms) * MS))
    model = {"mode": mode, "write_bytes": write_bytes, "wsize": wsize, "meta_ops": metadata_ops_per_rank,
             "hung_ns": int(hung_s * S), "hung_returns": hung_returns, "open": [], "cpu_ns": int(cpu_us * US),
             "local_share_Bps": int(local_mbps * 1e6 / ranks) if local_mbps else None}
    people, rows = [], []
    for i, rank in enumerate(range(first_rank, first_rank + ranks)):
        factor = slow_rank[1] if slow_rank and slow_rank[0] == rank else 1
        people.append({"rank": rank, "pid": 1000 + rank, "bytes": int(file_bytes * factor), "ino": 128000 + rank,
                       "delay": lead + int(i * stagger_ms * MS), "file": f"/mnt/ckpt/step100/rank{rank}.pt",
                       "hung": rank == hung_rank, "copier": 3000 + rank, "blocking_end": None})
        sim.at(0, sim.step, _rank(people[-1], model, rows), True)
    sim.run()

    rows.sort()
    stop = max([r[1] for r in rows] + [r.end for r in sim.rpcs] + [lead]) + S
    stop = max([stop] + [c[0] + model["hung_ns"] for c in model["open"]])      # stopped while it hangs
    cols = {n: _col(sim.rpcs, n) for n in ("begin", "reserved", "first_tx", "wire_end", "reply", "end", "timeouts",
                                           "count", "stable", "fileid", "offset", "owner")}
    cols["proc"] = np.array([r.proc for r in sim.rpcs], object)
    cols["done"] = ~_col(sim.rpcs, "lost", bool)
    # an unanswered RPC times out (and is sent again) every timeo until the stop
    cols["timeouts"] = np.where(cols["done"], cols["timeouts"], (stop - cols["first_tx"]) // sim.timeo)
    cols["last_tx"] = cols["first_tx"] + cols["timeouts"] * sim.timeo
    kmsg = _kmsg(cols, stop, sim.timeo * (retrans + 1))

    w = CaptureWriter(str(path))
    meta = _meta(host, mono_start_ns, realtime_start_ns, stop, slots, link_bps, wsize, timeo_ds, retrans,
                 lost_events, nconnect, session_slots, sampled_s)
    if not sysctls:
        del meta["sunrpc"]
    if not nfs_probes:
        meta["probes"]["attached"].update(nfs=False, sunrpc=False)
    w.write_meta(meta)
    texts = None
    if sampled_s:
        step = int(sampled_s * S)
        grid = np.arange(0, stop + step, step)
        texts = [(realtime_start_ns + int(g), _mountstats(cols, g, sim.timeo, wsize, timeo_ds, retrans)) for g in grid]
        w.append("ms_ops", _ms_table("ms_ops", texts, realtime_start_ns - mono_start_ns))
        w.append("ms_xprt", _ms_table("ms_xprt", texts, realtime_start_ns - mono_start_ns))
        w.append("thread_samples", _thread_samples(rows, model["open"], stop, cols, people, mode, grid[1:],
                                                   mono_start_ns))
        w.append("proc_io", _proc_io(rows, people, grid[1:], mono_start_ns, started_late))
    elif sim.rpcs and nfs_probes:
        w.append("rpc", _rpc(cols, stop, mono_start_ns, session_bound))
        w.append("nfs_io", _nfs_io(cols, mono_start_ns))
        w.append("slots", _slots(cols, mono_start_ns, session_bound))
    if rows and not sampled_s:
        w.append("syscall", _syscalls(rows, mono_start_ns))
    blocked = _blocked(rows, model["open"], stop, mono_start_ns) if "blocked" in TABLES and not sampled_s else None
    if blocked is not None:
        w.append("blocked", blocked)
    w.append("procs", _procs(people, first_rank, world_size or first_rank + ranks, mono_start_ns + lead // 2,
                             mode == "local_copy"))
    if netdev:
        w.append("netdev", _netdev(cols, stop, link_bps, mono_start_ns))
    if kmsg and not sampled_s:
        w.append("kmsg", pa.Table.from_pylist([{"ts": mono_start_ns + t, "level": 5, "message": text}
                                               for t, text in kmsg], schema=KMSG))
    if lost_events:
        w.append("loss", pa.Table.from_pylist([
            {"ts": mono_start_ns + lead + (i + 1) * S, "interval_ns": S, "probe": probe, "counter": counter,
             "lost": n} for i, (probe, counter, n) in enumerate([
                ("syscalls", "sys_ring_full", lost_events // 2),
                ("sunrpc", "rpc_ring_full", lost_events - lost_events // 2)])], schema=LOSS))
    w.close()
    return _manifest(path, host, mode, slots, rtt, write_bytes, realtime_start_ns, mono_start_ns, stop, rows,
                     model["open"], people, cols, frozen, kmsg, lost_events) | {"mountstats": texts}


def _col(rpcs, name, dtype=np.int64):
    return np.fromiter((getattr(r, name) for r in rpcs), dtype, len(rpcs))


def _manifest(path, host, mode, slots, rtt, write_bytes, real0, mono0, stop, rows, still, people, cols, frozen,
              kmsg, lost_events):
    per_pid = {}
    for t0, t1, pid, name, *_ in rows:
        e = per_pid.setdefault(pid, {"start": real0 + t0, "end": real0 + t1, "write_start": None, "write_end": None})
        e["end"] = max(e["end"], real0 + t1)
        if name == "write":
            e["write_start"] = e["write_start"] or real0 + t0
            e["write_end"] = real0 + t1
    procs = cols["proc"]
    return {
        "path": str(path), "host": host, "mode": mode, "slots": slots, "rtt_ns": rtt, "write_bytes": write_bytes,
        "utc_offset_ns": real0 - mono0, "start_utc_ns": real0, "stop_utc_ns": real0 + stop,
        "save_utc_ns": (real0 + rows[0][0], real0 + max(r[1] for r in rows)) if rows else None,
        "freeze_utc_ns": frozen and (real0 + frozen[0], real0 + frozen[1]),
        "kmsg": [(real0 + t, text) for t, text in kmsg],
        "rpcs": {p: int((procs == p).sum()) for p in sorted(set(procs.tolist()))},
        "timeouts": int(cols["timeouts"].sum()), "outstanding": int((~cols["done"]).sum()),
        "lost_events": lost_events,
        "ranks": [{"rank": p["rank"], "pid": p["pid"], "host": host, "bytes": p["bytes"], "ino": p["ino"],
                   "file": p["file"], "hung": p["hung"], **(per_pid.get(p["pid"]) or per_pid[p["copier"]]),
                   "blocking_end": p["blocking_end"] and real0 + p["blocking_end"],
                   "blocked_since": next((real0 + c[0] for c in still if c[2] == p["pid"]), None)}
                  for p in people],
    }


def _rpc(c, stop, mono0, session_bound=False):
    """The rpc table as the agent writes it; backlog/rtt/execute as rpc_stats_latency defines them.
    session_bound: the wait for a slot is for an NFSv4.1 session slot (session sleep)."""
    n, done = c["proc"].size, c["done"]

    def mono(a):
        return np.where(a > 0, a + mono0, 0)

    def us(a):
        return np.where(done, a // US, 0)

    waited = c["reserved"] - c["begin"] - 1 * US
    none = np.zeros_like(waited)
    # the wait for a transport slot, or on NFSv4.1 for a session slot (session sleep)
    slot_wait, session_wait = (none, waited) if session_bound else (waited, none)
    t = {"ts_begin": mono(c["begin"]), "ts_end": mono(np.where(done, c["end"], 0)),
         "ts_reserve_start": mono(c["begin"] + 1 * US), "ts_reserved": mono(c["reserved"]),
         "ts_transmit_start": mono(c["reserved"] + 2 * US), "ts_first_tx": mono(c["first_tx"]),
         "ts_last_tx": mono(c["last_tx"]), "backlog_us": us(c["last_tx"] - c["begin"]),
         "rtt_us": us(c["reply"] - c["last_tx"]), "execute_us": us(c["end"] - c["begin"]),
         "backlog_sleep_ns": slot_wait, "session_sleep_ns": session_wait,
         "sending_sleep_ns": np.maximum(c["first_tx"] - c["reserved"] - 4 * US, 0),
         "pending_sleep_ns": np.where(done, c["reply"], stop) - c["first_tx"],
         "fileid": c["fileid"], "io_offset": c["offset"], "io_count": c["count"], "io_stable": c["stable"],
         "io_dev": np.full(n, DEV), "task_id": np.arange(n) & 0xFFFF, "client_id": np.full(n, CLIENT_ID),
         "xid": 0x5A000000 + np.arange(n), "owner_tid": c["owner"], "owner_tgid": c["owner"],
         "status": np.where(done & (c["proc"] == "WRITE"), c["count"], 0), "version": np.full(n, 3),
         "attempts": done.astype(int), "transmits": 1 + c["timeouts"], "retransmits": c["timeouts"],
         "timeouts": c["timeouts"], "task_flags": np.full(n, 0x8001), "complete": done.astype(int),
         "procname": c["proc"], "progname": np.full(n, "nfs", object),
         "slot_wait_ns": slot_wait, "transmit_wait_ns": c["first_tx"] - c["reserved"] - 2 * US,
         "age_ns": np.where(done, 0, stop - c["begin"]), "server": np.full(n, f"{SERVER}:{PORT}", object)}
    for k in ("backlog", "rtt", "execute"):
        t[f"{k}_ns"] = t[f"{k}_us"] * 1000
    return _table(RPC, t)


def _syscalls(rows, mono0):
    a = [np.array(col, object if i in (3, 7, 8) else np.int64) for i, col in enumerate(zip(*rows))]
    enter, exit_, pid, name, fd, ret, flags, path, ino = a
    write, n = name == "write", len(rows)
    return _table(SYSCALL, {
        "ts_enter": enter + mono0, "ts_exit": exit_ + mono0, "latency_ns": exit_ - enter, "tid": pid, "tgid": pid,
        "syscall": name, "fd": fd, "ret": ret, "bytes": pa.array(np.maximum(ret, 0), mask=~write),
        "requested": np.where(write, np.abs(ret), 0), "offset": np.full(n, -1), "errno": np.where(ret < 0, -ret, 0),
        "flags": flags, "iov_partial": np.zeros(n, bool), "path": path, "path2": [None] * n,
        "dev": np.full(n, DEV), "ino": ino, "fstype": np.full(n, "nfs", object),
        "nfs_ns": pa.nulls(n, pa.int64()), "nfs_calls": pa.nulls(n, pa.string())})


def _blocked(rows, still, stop, mono0):
    """The agent's snapshots, every second and at stop, of the calls in progress for a second or more."""
    calls = [(r, range(-(-(r[0] + S) // S) * S, r[1], S)) for r in rows if r[1] - r[0] >= S]
    calls += [(c, [*range(-(-(c[0] + S) // S) * S, stop, S), stop]) for c in still]
    snaps = [{"ts": mono0 + t, "tid": r[2], "tgid": r[2], "syscall": r[3], "ts_enter": mono0 + r[0], "fd": r[4],
              "path": r[7], "dev": DEV, "ino": r[8]} for r, times in calls for t in times]
    return pa.Table.from_pylist(snaps, schema=schema("blocked")) if snaps else None


def _procs(people, first_rank, world, ts, copiers=False):
    def row(tgid, comm, rank=None, ppid=900):
        env = [] if rank is None else [("RANK", str(rank)), ("LOCAL_RANK", str(rank - first_rank)),
                                       ("WORLD_SIZE", str(world))]
        return {"ts": ts, "tgid": tgid, "ppid": ppid, "comm": comm,
                "cmdline": "python train.py --save /mnt/ckpt" if rank is not None else "", "cgroup": "0::/job",
                "rank": rank, "local_rank": None if rank is None else rank - first_rank,
                "world_size": None if rank is None else world, "rank_env": env,
                "rank_source": "none" if rank is None else "env", "inherited_from": None, "complete": True}
    return pa.Table.from_pylist([row(p["pid"], "python", p["rank"]) for p in people]
                                + [row(p["copier"], "cp", p["rank"], p["pid"]) for p in people if copiers]
                                + [row(KWORKER, "kworker/u16:2", ppid=2)], schema=PROCS)


def _table(schema, cols):
    """A table of `schema` from numpy arrays, lists or Arrow arrays (missing integer columns are 0)."""
    n = len(next(iter(cols.values())))
    arrays = []
    for f in schema:
        c = cols.get(f.name, np.zeros(n, np.int64))
        plain = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        arrays.append(c.cast(plain) if isinstance(c, pa.Array) else pa.array(c, plain))
    return pa.Table.from_arrays(arrays, names=schema.names).cast(schema)


def _nfs_io(c, mono0):
    """write/commit start and done events of the WRITE and COMMIT RPCs."""
    io = np.flatnonzero(np.isin(c["proc"], ["WRITE", "COMMIT"]))
    parts = []
    for phase, idx, t in (("start", io, c["begin"]), ("done", io[c["done"][io]], c["end"])):
        kind = np.where(c["proc"][idx] == "WRITE", f"write_{phase}", f"commit_{phase}")
        res = c["count"][idx] if phase == "done" else np.zeros(idx.size, np.int64)
        parts.append(_table(NFS_IO, {
            "ts": t[idx] + mono0, "fileid": c["fileid"][idx], "offset": c["offset"][idx], "stable": c["stable"][idx],
            "count": c["count"][idx], "res_count": res, "dev": np.full(idx.size, DEV), "status": res,
            "tid": c["owner"][idx], "tgid": c["owner"][idx], "verifier": np.full(idx.size, 0x1234), "kind": kind}))
    return pa.concat_tables(parts).sort_by("ts")


def _slots(c, mono0, session_bound=False):
    """One row per change of the client's occupancy: +1/-1 steps of in_use, backlog (session_wait
    when the session table is the limit), sending, pending."""
    done = c["done"]
    waited = c["reserved"] > c["begin"] + 1 * US
    queued = c["first_tx"] > c["reserved"] + 4 * US
    steps = [(c["reserved"], 1, 0, 0, 0), (c["end"][done], -1, 0, 0, 0),
             (c["begin"][waited] + 1 * US, 0, 1, 0, 0), (c["reserved"][waited], 0, -1, 0, 0),
             (c["reserved"][queued] + 2 * US, 0, 0, 1, 0), (c["first_tx"][queued], 0, 0, -1, 0),
             (c["first_tx"], 0, 0, 0, 1), (c["end"][done], 0, 0, 0, -1)]
    ts = np.concatenate([s[0] for s in steps])
    delta = np.concatenate([np.tile(np.array(s[1:]), (s[0].size, 1)) for s in steps])
    order = np.lexsort((delta.sum(axis=1), ts))          # at one instant, releases first
    level = np.cumsum(delta[order], axis=0)
    n = ts.size
    waiting = ("session_wait", "backlog") if session_bound else ("backlog", "session_wait")
    return _table(SLOTS, {"ts": ts[order] + mono0, "in_use": level[:, 0], waiting[0]: level[:, 1],
                          waiting[1]: np.zeros(n), "sending": level[:, 2], "pending": level[:, 3],
                          "client_id": np.full(n, CLIENT_ID), "server": np.full(n, f"{SERVER}:{PORT}", object)})


def _netdev(c, stop, link_bps, mono0):
    """eth0's counters every 0.2 s: requests counted when their last byte is on the wire, replies
    when they arrive."""
    ts = np.arange(0, stop + 1, 200 * MS)
    order = np.argsort(c["wire_end"], kind="stable")
    sent = np.concatenate(([0], np.cumsum(c["count"][order] + HEADER)))
    tx = 10**9 + sent[np.searchsorted(c["wire_end"][order], ts, "right")]
    rx = 2 * 10**9 + HEADER * np.searchsorted(np.sort(c["reply"][c["done"]]), ts, "right")
    n = ts.size
    return _table(NETDEV, {"ts": ts + mono0, "iface": np.full(n, "eth0", object),
                           "server": np.full(n, SERVER, object),
                           "speed_bps": pa.nulls(n, pa.int64()) if not link_bps else np.full(n, int(link_bps)),
                           "tx_bytes": tx, "rx_bytes": rx, "tx_packets": tx // 1448, "rx_packets": rx // 1448})


def _kmsg(c, stop, major_ns):
    """'not responding' at the first major timeout; 'OK' at the first reply after one."""
    answer = np.where(c["done"], c["reply"], stop)
    major = c["first_tx"] + major_ns
    hit = (c["timeouts"] > 0) & (major < answer)
    if not hit.any():
        return []
    out = [(int(major[hit].min()), f"nfs: server {SERVER} not responding, still trying")]
    if (hit & c["done"]).any():
        out.append((int(answer[hit & c["done"]].min()), f"nfs: server {SERVER} OK"))
    return out


def _meta(host, mono0, real0, stop, slots, link_bps, wsize, timeo, retrans, lost, nconnect=1, session=None,
          sampled_s=None):
    pair = lambda t: {"monotonic_ns": mono0 + t, "realtime_ns": real0 + t, "uncertainty_ns": 2000}  # noqa: E731
    vers = "3" if session is None else "4.1"
    opts = (f"rw,relatime,vers={vers},rsize={wsize},wsize={wsize},namlen=255,hard,proto=tcp,nconnect={nconnect},"
            f"timeo={timeo},"
            f"retrans={retrans},sec=sys,mountaddr={SERVER},mountvers=3,mountproto=udp,local_lock=none,addr={SERVER}")
    return {
        "format": "slotscope-capture", "schema_version": 1, "slotscope_version": "0.1.0", "host": host,
        "boot_id": str(uuid.uuid5(uuid.NAMESPACE_DNS, host)), "kernel": "6.1.0-synth-amd64",
        "command": "slotscope record -o /var/tmp/capture --fs nfs", "agent_pid": 500,
        "start": pair(0), "stop": pair(stop), "stop_reason": "SIGINT",
        "filters": {"cgroup": None, "command": False, "fs": ["nfs", "nfs4"], "paths": [], "pids": []},
        "nfs_mounts": [{"mountpoint": "/mnt/ckpt", "source": f"{SERVER}:/export",
                        "fstype": "nfs" if session is None else "nfs4", "dev": DEV,
                        "vers": vers, "proto": "tcp", "nconnect": str(nconnect), "wsize": str(wsize), "rsize": str(wsize),
                        "hard": True, "timeo": str(timeo), "retrans": str(retrans), "server": SERVER,
                        "options": opts}],
        "sunrpc": {"tcp_slot_table_entries": "2", "tcp_max_slot_table_entries": str(slots),
                   "udp_slot_table_entries": "16", "min_resvport": "665", "max_resvport": "1023",
                   "nfs_max_session_slots": str(session or 64)},
        "nics": [{"name": "lo", "speed_mbps": None},
                 {"name": "eth0", "speed_mbps": int(link_bps // 1e6) if link_bps else None}],
        "probes": {"attached": {"kmsg": True, "netdev": True, "nfs": True, "sunrpc": True,
                                "syscalls": ["write", "fsync", "close", "openat", "newfstatat"]}, "skipped": {}},
        "totals": {"lost": {"sys_ring_full": lost // 2, "rpc_ring_full": lost - lost // 2}},
    } | ({"sampled": {"interval_ns": int(sampled_s * S), "reason": "--no-bpf"},
          "probes": {"attached": {}, "skipped": {}}} if sampled_s else {})


# ---- the sampled mode: mountstats as the kernel counts it, and where each rank was ----------------

OPS = ("NULL", "GETATTR", "LOOKUP", "CREATE", "WRITE", "COMMIT")


def _mountstats(c, t, timeo, wsize, timeo_ds, retrans):
    """/proc/self/mountstats at time t: each RPC counted when it ends (rpc_count_iostats), each
    transmission when it is sent, and the transport's sums over sends (xprt_request_transmit)."""
    done = c["done"] & (c["end"] <= t)
    lines = []
    for op in OPS:
        m = done & (c["proc"] == op)
        per = lambda a: int((a[m] // MS).sum())          # noqa: E731  mountstats adds whole ms per RPC
        lines.append(f"\t{op:>12}: {m.sum()} {int((1 + c['timeouts'][m]).sum())} {int(c['timeouts'][m].sum())} "
                     f"{int((c['count'][m] + HEADER).sum())} {HEADER * m.sum()} {per(c['last_tx'] - c['begin'])} "
                     f"{per(c['reply'] - c['last_tx'])} {per(c['end'] - c['begin'])} 0")
    retries = range(int(c["timeouts"].max(initial=0)) + 1)
    sends = np.sort(np.concatenate([c["first_tx"][c["timeouts"] >= k] + k * timeo for k in retries]))
    sent = sends[sends <= t]
    replies = np.sort(c["reply"][c["done"]])
    waited = c["reserved"] > c["begin"] + 1 * US
    queued = c["first_tx"] > c["reserved"] + 4 * US

    def level(up, down, at):
        return np.searchsorted(np.sort(up), at, "right") - np.searchsorted(np.sort(down), at, "right")
    req_u = int((np.arange(1, sent.size + 1) - np.searchsorted(replies, sent, "right")).sum())
    bklog_u = int(level(c["begin"][waited] + 1 * US, c["reserved"][waited], sent).sum())
    sending_u = int(level(c["reserved"][queued] + 2 * US, c["first_tx"][queued], sent).sum())
    pending_u = int(level(c["first_tx"], c["end"][c["done"]], sent).sum())
    reserves = c["reserved"][c["reserved"] <= t]
    max_slots = int(level(c["reserved"], c["end"][c["done"]], reserves).max(initial=0))
    recvs = int(np.searchsorted(replies, t, "right"))
    opts = f"rw,vers=3,rsize={wsize},wsize={wsize},hard,proto=tcp,timeo={timeo_ds},retrans={retrans},sec=sys"
    return "\n".join([
        "device proc mounted on /proc with fstype proc",
        f"device {SERVER}:/export mounted on /mnt/ckpt with fstype nfs statvers=1.1", f"\topts:\t{opts}",
        f"\tage:\t{t // S}", "\tRPC iostats version: 1.1  p/v: 100003/3 (nfs)",
        f"\txprt:\ttcp 800 1 1 0 0 {sent.size} {recvs} 0 {req_u} {bklog_u} {max_slots} {sending_u} {pending_u}",
        "\tper-op statistics", *lines, ""])


def _ms_table(name, texts, utc_offset):
    """The sampler's rows of ms_ops or ms_xprt from consecutive mountstats copies."""
    from slotscope.analyzer.mountstats import mounts
    from slotscope.capture.mountstats import interval_rows
    rows = []
    for (t0, before), (t1, after) in zip(texts, texts[1:]):
        old, new = mounts(before), mounts(after)
        for point, (server, section) in new.items():
            ops, xprts = interval_rows(old[point][1], section, t1 - utc_offset, t1 - t0, point, server)
            rows += ops if name == "ms_ops" else xprts
    return pa.Table.from_pylist(rows, schema=schema(name))


def _proc_io(rows, people, grid, mono0, started_late):
    """Each rank's /proc/PID/io at each sample: the bytes of its writes returned by then as
    write_bytes (pages dirtied, or written through), the calls as syscw; with started_late, from
    the first sample after its first write."""
    out = []
    for p in people:
        writes = sorted((r[1], r[5]) for r in rows if r[2] == p["pid"] and r[3] == "write")
        ends = np.array([e for e, _ in writes], np.int64)
        total = np.cumsum([0] + [n for _, n in writes])
        for t in grid:
            if started_late and (not len(ends) or t < ends[0]):
                continue
            done = int(np.searchsorted(ends, t, "right"))
            out.append({"ts": mono0 + int(t), "tgid": p["pid"], "rchar": 0, "wchar": int(total[done]), "syscr": 0,
                        "syscw": done, "read_bytes": 0, "write_bytes": int(total[done])})
    return pa.Table.from_pylist(out, schema=schema("proc_io"))


def _thread_samples(rows, still, stop, c, people, mode, grid, mono0):
    """Where each rank was at each sample: in which syscall, on which file, waiting in what."""
    commit_at = {int(f): int(b) for f, b, p in zip(c["fileid"], c["begin"], c["proc"]) if p == "COMMIT"}
    calls = {}
    for r in [*rows, *((*call[:1], 1 << 62, *call[2:]) for call in still)]:     # still in it at every sample
        calls.setdefault(r[2], []).append(r)
    out = []
    for p in people:
        mine = sorted(calls.get(p["pid"], []))
        starts = np.array([r[0] for r in mine])
        for t in grid:
            i = int(np.searchsorted(starts, t, "right")) - 1
            row = {"ts": mono0 + int(t), "tgid": p["pid"], "tid": p["pid"], "state": "S", "wchan": "futex_wait_queue",
                   "syscall": "futex", "fd": -1, "path": None, "read_ok": True}
            if 0 <= i and t < mine[i][1]:
                _, _, _, name, fd, _, _, file, ino = mine[i]
                if name == "write" and mode != "osync":
                    wait = (None, "R")
                elif name == "write" or (name in ("fsync", "close") and t < commit_at.get(ino, stop)):
                    # an O_SYNC write, like fsync, waits on its pages' writeback (6.1 in the VM rig)
                    wait = ("folio_wait_bit_common", "D")
                else:
                    wait = ("rpc_wait_bit_killable", "D")
                row.update(wchan=wait[0], state=wait[1], syscall=name, fd=fd, path=file)
            elif 0 <= i < len(mine) - 1:
                row.update(state="R", wchan=None, syscall=None)
            out.append(row)
    return pa.Table.from_pylist(out, schema=schema("thread_samples"))
