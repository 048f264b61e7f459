"""What a change would buy: each save's predicted duration under more slots, session slots or
connections, larger or buffered writes, or a save to local disk copied to NFS afterwards.

The model is Little's law on what the capture measured, per transport (one per host):
- in flight n = min(the slot limit, what the ranks offer): a rank whose writes are
  synchronous has at most one WRITE in flight, and less while it computes between
  writes; a flush (buffered writes) offers every dirty page at once. The limit is the
  transport slots per connection x nconnect (NFSv3); on NFSv4.1+ the session slots, which
  every connection shares (nconnect adds none) while the kernel lifts the transports'
  own limit (VM-RIG.md).
- each WRITE holds its slot for h(n) = overhead + wire + server(n): the wire at the link's
  speed (netdev), the server's time per RPC fitted from the capture as a + b n against the
  number in flight when it was sent (it grows with load when the server, or a full link
  ahead of it, is the limit: then 1/b is the most WRITEs a second it takes, whatever the
  slots), the overhead what the hold measured beyond the round trip.
- throughput X = min(n x WRITE size / h(n), the link's speed).
A rank's save is its time outside its write and flush calls (its own computing and its
metadata calls, kept as measured, though these too waited for slots) plus the time in those
calls scaled by X before / X after (sync writes); a buffered save flushes the host's bytes at
X after and sends a COMMIT per file, as many at a time as there are slots. The model's throughput before the change is checked against the measured
one, and that calibration is one of the inputs the range is taken over; the other is the
server's fit (when the capture never had more in flight than now, its growth with load is
unknown, from none to all of its time). Each variant is then widened by RANGE_FLOOR for what
the model leaves out. Each prediction says what limits the save after the change; a save less
than LITTLE_GAIN faster is "little gain".
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import FLUSH_SYSCALLS, WRITE_SYSCALLS

from .units import byte_rate, number, plural, round_rate, size

S = 1e9
LOCAL_MBPS = 1000.0      # --local-then-copy's default local disk: 1 GB/s, a datacentre NVMe SSD's sustained write, conservatively
LITTLE_GAIN = 0.85       # predicted / measured at or above this: the change buys little
# Each variant's prediction is taken as this much either side: what the model leaves out, the
# client's CPU per call (it grows with the calls running at once: 0.19 ms a 4 KiB WRITE with 4
# in flight, 0.83 ms with 8, in the rig) and one save's spread from run to run. Sized on the
# rig's pairs (bench/README.md, whatif_pairs.py): the largest miss beyond the variants was 5.9%.
RANGE_FLOOR = 0.08
UNMODELLED = "client's CPU and the spread between runs, which the model leaves out"     # RANGE_FLOOR's name
MODEL = "littles_law"
# a time per RPC that grows with the RPCs in flight: the server, or a path slower than the NIC
# says (a shaper, a slower hop), which the capture cannot tell apart
SERVER = "server (or a path slower than the NIC): its time per RPC grows with the RPCs in flight"
PREDICTED = ("slot_saturation", "small_sync_writes")      # the findings whose fixes the model predicts
NO_CHANGE = "no change"
METADATA_QUEUE = "metadata calls' wait for each other"     # a range's input (_ranks: kept)


@dataclass(frozen=True)
class Change:
    slots: int | None = None            # transport slots per connection (sunrpc.tcp_max_slot_table_entries)
    session_slots: int | None = None    # NFSv4.1 session slots
    nconnect: int | None = None
    write_size: int | None = None       # bytes per write() (synchronous writes stay synchronous)
    buffered: bool = False              # write through the page cache, flush and COMMIT once per file
    local_then_copy: bool = False
    local_mbps: float = LOCAL_MBPS

    def text(self) -> str:
        parts = [f"{k}={v}" for k, v in (("slots", self.slots), ("session slots", self.session_slots),
                                           ("nconnect", self.nconnect)) if v is not None]
        if self.write_size:
            parts.append(f"write size {size(self.write_size)}")
        if self.buffered:
            parts.append("buffered writes")
        if self.local_then_copy:
            parts.append(f"local disk ({number(self.local_mbps)} MB/s) then copy")
        return ", ".join(parts) or NO_CHANGE


@dataclass
class Transport:
    """What the model needs of one host's transport, as measured (times in seconds)."""
    host: str
    server: str
    per_connection: int | None      # transport slots of each connection
    nconnect: int
    session: int | None             # NFSv4.1 session slots, None before 4.1
    wsize: int
    link_Bps: float | None          # the NIC's speed, bytes/s
    seen_Bps: float | None          # the most the link was seen carrying, bytes/s
    write_bytes: float              # mean WRITE
    sync: bool                      # the ranks' WRITEs are stable: each write() waits for its own
    bytes: int
    sending_s: float                # first WRITE's slot to last WRITE's end
    server_a: float                 # server time per RPC = a + b x in flight
    server_b: float
    server_b_se: float
    flight_seen: tuple[int, int]    # fewest and most in flight seen at a WRITE's transmission
    overhead: float                 # slot hold beyond the round trip
    commit_s: float                 # mean COMMIT round trip (a WRITE's when none was sent)
    commits: int                    # COMMITs sent
    ranks: list[dict] = field(default_factory=list)    # rank, offset_s, save_s, nfs_s, outside_s, writes, bytes

    @property
    def limit(self) -> int | None:
        return _limit(self.per_connection, self.nconnect, self.session)


def _limit(per_connection, nconnect, session) -> int | None:
    """The RPCs a mount can have in flight: its session slots on NFSv4.1+, else its transports' slots."""
    if session is not None:
        return session
    return None if per_connection is None else per_connection * nconnect


def measure(ctx) -> tuple[list[Transport], str | None]:
    """The model's inputs, per host (its transport carrying most WRITE bytes), from an
    analysis Context; or why there are none."""
    if ctx.rpc is None:
        return [], ("the capture has no RPC rows (a kernel log only, or a kernel without the sunrpc/NFS "
                    "tracepoints): the model needs each RPC's round trip and each WRITE's size")
    out, why = [], None
    by_host: dict[str, list] = {}
    for tr in ctx.transports:
        writes = ctx.rpcs_to(tr["host"], tr["server"], "WRITE")
        if writes is not None and writes.num_rows:
            by_host.setdefault(tr["host"], []).append((pc.sum(writes["io_count"]).as_py() or 0, tr, writes))
    if not by_host:
        return [], "no WRITE RPC in the capture: nothing was saved over NFS"
    savers: dict[str, list[dict]] = {}
    for r in ctx.savers():
        savers.setdefault(r["host"], []).append(r)
    t0 = min((r["save_start_ns"] for rs in savers.values() for r in rs), default=0)
    for host, options in sorted(by_host.items()):
        _, tr, writes = max(options, key=lambda o: o[0])
        t = _transport(ctx, tr, writes, savers.get(host, []), t0)
        if t.limit is None:
            why = (f"no slot limit seen toward {tr['server']} ({host}): meta.json has no sunrpc slot-table "
                   "sysctl and no transport counters were recorded, so what more slots change is unknown")
        out.append(t)
    return out, why


def _transport(ctx, tr: dict, writes, savers: list[dict], t0: int) -> Transport:
    """One transport's inputs; `savers`: the host's writing ranks, `t0`: the job's first call (UTC ns)."""
    mount = tr["mount"] or {}
    nconnect = int(mount.get("nconnect") or 1)
    session = tr["session_slots"]
    # the sysctl (or the kernel's own max_reqs) per connection; a limit of 65536 is none at all
    per = tr["max_slots"] // nconnect if tr["max_slots"] else None
    done = writes.filter(pc.and_(pc.equal(writes["complete"], 1), pc.greater(writes["ts_first_tx"], 0)))
    count = done["io_count"].to_numpy().astype(float)
    rtt = done["rtt_ns"].to_numpy() / S
    link = tr["link"] or {}
    link_Bps = link["speed_bps"] / 8 if link.get("speed_bps") else None
    wire = count / link_Bps if link_Bps else np.zeros_like(count)
    # WRITEs in flight at each WRITE's transmission (sent, not yet ended): what it shares the
    # server's disk and the path with. A COMMIT or a metadata call in flight carries no data:
    # counted, they put WRITEs that had the link to themselves (220 ms at 20 Mbit/s) beside
    # those that shared it (435 ms) at "2 in flight", and the slope came out 144 ms, not 210.
    every = ctx.rpcs_to(tr["host"], tr["server"])
    every = every.filter(pc.greater(every["ts_first_tx"], 0))
    sending = writes.filter(pc.greater(writes["ts_first_tx"], 0))
    sent = np.sort(sending["ts_first_tx"].to_numpy())
    ended = np.sort(np.where(sending["complete"].to_numpy() == 1, sending["ts_end"].to_numpy(),
                             np.iinfo(np.int64).max))
    t = done["ts_first_tx"].to_numpy()
    flight = (np.searchsorted(sent, t, "right") - np.searchsorted(ended, t, "right")).astype(float)
    server = np.maximum(rtt - wire, 0)
    a, b, se = _fit(flight, server)
    reserved = done["ts_reserved"].to_numpy()
    held = (done["ts_end"].to_numpy() - reserved)[reserved > 0] / S
    overhead = max(0.0, float(held.mean() - rtt[reserved > 0].mean())) if held.size else 0.0
    commits = ctx.rpcs_to(tr["host"], tr["server"], "COMMIT")
    committed = commits.num_rows if commits is not None else 0
    commit = pc.mean(commits["rtt_ns"]).as_py() / S if committed else float(rtt.mean())
    stable = done["io_stable"].to_numpy()
    first = pc.min(done["ts_reserved"]).as_py() or pc.min(done["ts_begin"]).as_py()
    transport = Transport(
        host=tr["host"], server=tr["server"], per_connection=per, nconnect=nconnect, session=session,
        wsize=int(mount.get("wsize") or 1 << 20), link_Bps=link_Bps,
        seen_Bps=link["peak_bps"] / 8 if link.get("peak_bps") else None,
        write_bytes=float(count.mean()), sync=bool((stable > 0).mean() >= 0.5), bytes=int(count.sum()),
        sending_s=max((pc.max(done["ts_end"]).as_py() - first) / S, 1e-9), server_a=a, server_b=b,
        server_b_se=se, flight_seen=(int(flight.min()), int(flight.max())), overhead=overhead, commit_s=commit,
        commits=committed)
    waits = _waits(every)
    for r in savers:
        nfs = sum(s["total_ns"] for k, s in r["syscalls"].items() if k in WRITE_SYSCALLS + FLUSH_SYSCALLS) / S
        write_wait, meta_wait = (sum(waits.get((p, w), 0) for p in r["pids"]) / S for w in (True, False))
        transport.ranks.append({"rank": r["rank"], "offset_s": (r["save_start_ns"] - t0) / S, "save_s": r["save_s"],
                                "nfs_s": nfs, "outside_s": max(0.0, r["save_s"] - r["blocked_ns"] / S),
                                "write_wait_s": write_wait, "meta_wait_s": meta_wait,
                                "writes": r["write_rpcs"] or 0, "bytes": r["bytes_written"]})
    return transport


def _waits(rpcs) -> dict[tuple[int, bool], int]:
    """ns each process waited for a slot (transport or session) in the RPCs it issued itself,
    keyed (tgid, whether WRITE or COMMIT): a metadata call queues in the same table as the writes."""
    t = rpcs.select(["owner_tgid", "procname"]).append_column(
        "wait", pc.add(pc.fill_null(rpcs["slot_wait_ns"], 0), pc.fill_null(rpcs["session_sleep_ns"], 0)))
    t = t.append_column("write", pc.is_in(t["procname"], pa.array(["WRITE", "COMMIT"])))
    g = t.group_by(["owner_tgid", "write"]).aggregate([("wait", "sum")])
    return {(tgid, w): n for tgid, w, n in zip(*(g[c].to_pylist() for c in ("owner_tgid", "write", "wait_sum")))}


def save_span(ranks: list[dict]) -> float | None:
    """A save's seconds as the model measures it: from the writing ranks' first call to their
    last return (rank_table entries)."""
    wrote = [r for r in ranks if r["bytes_written"]]
    return (max(r["save_end_ns"] for r in wrote) - min(r["save_start_ns"] for r in wrote)) / S if wrote else None


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """y = a + b x through the median y at each x, weighted by how often x was seen, and b's
    standard error from every point's residual; b = 0 (with an unknown error, inf) when x never
    varied. Medians, because a queue's time at n in flight is skewed low by the RPCs sent when
    the one ahead was partly through (a 512 KiB WRITE at 20 Mbit/s: 420 ms behind a whole one,
    315 ms behind half of one), whose share changes from run to run: the means at 2 in flight
    were 358 and 404 ms in two runs of one scenario, the medians 436 and 438."""
    if x.size < 3 or np.ptp(x) < 1:
        return float(y.mean()), 0.0, float("inf")
    levels, counts = np.unique(x, return_counts=True)
    medians = np.array([np.median(y[x == level]) for level in levels])
    b, a = np.polyfit(levels, medians, 1, w=np.sqrt(counts))
    resid = y - (a + b * x)
    se = float(np.sqrt((resid @ resid) / (x.size - 2) / ((x - x.mean()) @ (x - x.mean()))))
    return float(a), float(max(b, 0.0)), se


@dataclass
class Setting:
    """One evaluation of the model: a transport's configuration and write pattern."""
    limit: int
    write_bytes: float
    sync: bool
    session_bound: bool


def _throughput(tr: Transport, s: Setting, b: float, demand: float) -> tuple[float, str]:
    """(bytes/s, what limits it) under Setting s, with server slope b."""
    n = min(s.limit, demand)
    wire = s.write_bytes / tr.link_Bps if tr.link_Bps else 0.0
    a = tr.server_a + tr.server_b * tr.flight_seen[1] - b * tr.flight_seen[1]     # the fit holds where it was seen
    hold = tr.overhead + wire + max(a, 0.0) + b * n
    x = n * s.write_bytes / hold
    if tr.link_Bps and x >= tr.link_Bps:
        return tr.link_Bps, "link"
    if b * n > 0.5 * hold:
        # a time per RPC growing at the NIC's own speed (the most it tends to within 10%) is the link's
        return x, "link" if tr.link_Bps and b and s.write_bytes / b >= 0.9 * tr.link_Bps else SERVER
    if n < s.limit:     # ranks that offer less than half their number are busy between writes
        return x, ("client (the ranks are busy between writes)" if s.sync and demand < 0.5 * len(tr.ranks)
                   else "ranks (one write in flight each)")
    return x, "session slots" if s.session_bound else "transport slots"


def _demand(tr: Transport, s: Setting, write_s: float) -> float:
    """What the ranks offer in flight: with synchronous writes each one, less its time outside
    NFS between writes; a flush offers all its pages."""
    if not s.sync:
        return float("inf")
    return sum(write_s / (write_s + r["outside_s"] / max(r["writes"], 1)) for r in tr.ranks if r["writes"])


@dataclass
class Prediction:
    change: str
    host: str
    measured_s: float | None
    predicted_s: float | None = None
    range: tuple[float, float] | None = None
    limit: str | None = None
    little_gain: bool = False
    dominant: str | None = None         # the input whose uncertainty spans most of the range
    ranks: list[dict] = field(default_factory=list)
    copy_s: float | None = None         # local_then_copy: the copy to NFS after the blocking save
    copy_range: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)
    why: str | None = None              # cannot predict: why

    def as_json(self) -> dict:
        return {"change": self.change, "host": self.host, "model": MODEL,
                "status": "cannot_predict" if self.why else "predicted", "measured_s": _r(self.measured_s),
                "predicted_s": _r(self.predicted_s), "range": self.range and [_r(v) for v in self.range],
                "limit": self.limit, "little_gain": self.little_gain, "dominant": self.dominant,
                "copy_s": _r(self.copy_s), "copy_range": self.copy_range and [_r(v) for v in self.copy_range],
                "ranks": [{"rank": r["rank"], "measured_s": _r(r["save_s"]), "predicted_s": _r(r["predicted_s"]),
                           "copy_s": _r(r.get("copy_s"))} for r in self.ranks],
                "notes": self.notes, "why": self.why}


def line(p: dict) -> str:
    """A prediction (as_json) in one line: 'nconnect=8: save 23.6 s -> 3.3 s (3.1-3.6 s; limit:
    transport slots)'."""
    if p["why"]:
        return f"{p['change']}: cannot predict: {p['why']}"
    lo, hi = p["range"]
    save = f"save {p['save']}" if p.get("save") else "save"
    text = (f"{p['change']}: {save} {number(p['measured_s'], 's')} -> {number(p['predicted_s'], 's', like=hi)} "
            f"({number(lo, like=hi)}-{number(hi, 's')}, most of it from the {p['dominant']}; limit: {p['limit']}")
    if p["copy_s"] is not None:
        lo, hi = p["copy_range"]
        text += f"; then the copy to NFS {number(p['copy_s'], 's', like=hi)} ({number(lo, like=hi)}-{number(hi, 's')})"
    return text + ("; little gain)" if p["little_gain"] else ")")


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def predict(transports: list[Transport], why: str | None, change: Change) -> list[Prediction]:
    """Each host's save under `change`; the job's is the slowest host's."""
    if why or not transports:
        return [Prediction(change.text(), t.host, None, why=why) for t in transports] or \
            [Prediction(change.text(), "*", None, why=why)]
    return [_predict(t, change) for t in transports]


def _setting(tr: Transport, change: Change | None) -> Setting:
    c = change or Change()
    per = c.slots or tr.per_connection
    nconnect = c.nconnect or tr.nconnect
    session = c.session_slots or tr.session
    limit = _limit(per, nconnect, session)
    buffered = c.buffered or c.local_then_copy
    # a flush sends wsize WRITEs, fewer bytes for the end of a file (a rank's bytes: its file)
    per_rank = max(tr.bytes / max(len(tr.ranks), 1), 1.0)
    return Setting(limit, float(min(tr.wsize, per_rank) if buffered else min(c.write_size, tr.wsize) if c.write_size
                                else tr.write_bytes),
                   tr.sync and not buffered, session is not None)


def _predict(tr: Transport, change: Change) -> Prediction:
    measured = max((r["offset_s"] + r["save_s"] for r in tr.ranks), default=tr.sending_s)
    p = Prediction(change.text(), tr.host, measured)
    if p.change == NO_CHANGE:
        p.why = "no change given"
        return p
    if not any(r["writes"] for r in tr.ranks):
        p.why = (f"no traced write() of a rank on {tr.host} was charged a WRITE RPC: the model predicts a "
                 "save from the ranks' own time in NFS calls")
        return p
    before, after = _setting(tr, None), _setting(tr, change)
    write_s = tr.overhead + tr.server_a + tr.server_b * tr.flight_seen[1]      # a WRITE's hold, as seen
    calib_model = _throughput(tr, before, tr.server_b, _demand(tr, before, write_s))[0]
    calib = (tr.bytes / tr.sending_s) / calib_model if calib_model > 0 else 1.0   # measured / model, before
    # the server slope's low and high values: two standard errors either side; when the in flight
    # never varied, from no growth to all of the server's time being a queue
    if np.isfinite(tr.server_b_se):
        b_lo, b_hi = max(0.0, tr.server_b - 2 * tr.server_b_se), tr.server_b + 2 * tr.server_b_se
    else:
        b_lo, b_hi = 0.0, (tr.server_a + tr.server_b * tr.flight_seen[1]) / max(tr.flight_seen[1], 1)
    server, calibration = "server time per RPC vs in flight", "model calibration against the measured save"
    # (the input varied, server slope, calibration, metadata waits kept); the first is the nominal prediction
    variants = [(None, tr.server_b, calib, 0.5), (server, b_lo, calib, 0.5), (server, b_hi, calib, 0.5),
                (calibration, tr.server_b, 1.0, 0.5)]
    if change.buffered or change.local_then_copy:
        variants += [(METADATA_QUEUE, tr.server_b, calib, 0.0), (METADATA_QUEUE, tr.server_b, calib, 1.0)]
    results = []
    for _, b, k, kept in variants:
        x_before = _throughput(tr, before, b, _demand(tr, before, write_s))[0]
        x_after, limit = _throughput(tr, after, b, _demand(tr, after, write_s))
        rs = _ranks(tr, change, after.limit, x_before, x_after, k, kept)
        results.append((rs, limit, x_after * k, max(r["offset_s"] + r["predicted_s"] for r in rs)))
    ranks, p.limit, x_nominal, nominal = results[0]
    job = [t for *_, t in results]
    lo, hi = min(job) * (1 - RANGE_FLOOR), max(job) * (1 + RANGE_FLOOR)
    if p.limit in (SERVER, "link") and not (change.buffered or change.local_then_copy):
        # a resource already near its most: the change may buy nothing at all
        hi = max(hi, measured * (1 + RANGE_FLOOR))
    spans = {UNMODELLED: [nominal * (1 - RANGE_FLOOR), nominal * (1 + RANGE_FLOOR)]}
    for (name, *_), t in zip(variants[1:], job[1:]):
        spans.setdefault(name, [nominal]).append(t)
    p.dominant = max(spans, key=lambda k: max(spans[k]) - min(spans[k]))
    p.predicted_s, p.range, p.ranks = nominal, (lo, hi), ranks
    if change.local_then_copy:
        copies = [max(r["copy_s"] for r in rs) for rs, *_ in results]
        p.copy_s = copies[0]
        p.copy_range = (min(copies) * (1 - RANGE_FLOOR), max(copies) * (1 + RANGE_FLOOR))
        p.limit = f"local disk; the copy: {p.limit}"
        p.notes.append(f"blocking at the local disk's {number(change.local_mbps)} MB/s, shared by the host's "
                       f"{len(tr.ranks)} ranks (--local-mbps: measure yours); the copy runs in the background")
    p.little_gain = nominal >= LITTLE_GAIN * measured
    if not tr.link_Bps and x_nominal > (tr.seen_Bps or 0) * 1.1:
        p.why = (f"the link's speed is unknown (the NIC reports none) and the change needs "
                 f"{byte_rate(x_nominal)}, more than the {byte_rate(tr.seen_Bps or 0)} it was seen carrying: "
                 f"at best {number(lo, like=hi)}-{number(hi, 's')} if the link has room")
    if after.sync is False and tr.sync:
        p.notes.append("not modelled: the copies into the page cache (write() at memory speed) and the "
                       "client's CPU; where they become the limit the save is slower: a lower bound")
    return p


def _ranks(tr: Transport, change: Change, limit: int, x_before: float, x_after: float, k: float,
           kept: float) -> list[dict]:
    """Each rank's predicted save: its time outside NFS calls kept, its writes' time scaled, its
    metadata calls' slot waits scaled as its writes' are (with buffered or local writes, the
    share `kept` of them kept)."""
    out = []
    host_bytes = sum(r["bytes"] for r in tr.ranks) or tr.bytes
    # every rank's pages through the slots at once, then a COMMIT per file, as many at a time as slots
    flush = host_bytes / (x_after * k) + -(-len(tr.ranks) // limit) * tr.commit_s
    for r in tr.ranks:
        entry = {}
        # The metadata calls' time is kept but for their slot waits. Under a larger table those
        # scale as the rank's own WRITEs' waits do (larger writes keep them: the WRITEs change).
        # Buffered or local writes leave the table free of WRITEs while the metadata calls run:
        # they then wait only for each other, a part of their wait the capture does not tell
        # apart, so the nominal keeps half of it and the range none to all (METADATA_QUEUE).
        nfs_after = r["nfs_s"] * x_before / x_after
        meta = r["save_s"] - r["nfs_s"] - r["outside_s"]
        if change.buffered or change.local_then_copy:
            meta -= r["meta_wait_s"] * (1 - kept)
        elif change.write_size:
            pass
        elif r["write_wait_s"]:
            meta -= r["meta_wait_s"] * (1 - max(0.0, nfs_after - (r["nfs_s"] - r["write_wait_s"])) / r["write_wait_s"])
        else:
            meta -= r["meta_wait_s"] * (1 - x_before / x_after)
        outside = r["outside_s"] + meta
        if change.local_then_copy:
            # on local disk: the rank's own time, then its bytes at its share of the disk; the copy
            # makes the files on NFS (the metadata calls) and flushes them
            local = r["bytes"] * len(tr.ranks) / (change.local_mbps * 1e6)
            entry.update(predicted_s=r["outside_s"] + local, copy_s=outside - r["outside_s"] + flush)
        elif change.buffered and tr.sync:
            entry["predicted_s"] = outside + flush
        else:
            entry["predicted_s"] = outside + nfs_after
        out.append({**r, **entry})
    return out


def changes_for(kind: str, transports: list[Transport]) -> list[Change]:
    """The changes a finding's fix names, to predict: more slots (or session slots), more
    connections, buffered writes."""
    if not transports:
        return []
    tr = transports[0]
    out = []
    if kind == "slot_saturation":
        if tr.session is not None:
            out.append(Change(session_slots=max(64, 2 * tr.session)))
        else:
            out.append(Change(slots=max(128, 2 * (tr.per_connection or 64))))
            out.append(Change(nconnect=16 if tr.nconnect >= 8 else 8))
        if tr.write_bytes < 256 * 1024 and tr.sync:
            out.append(Change(buffered=True))
    elif kind == "small_sync_writes" and tr.sync:
        out.append(Change(buffered=True))
    return out


def fixes(kind: str, transports: list[Transport], why: str | None) -> list[dict]:
    """A finding's fixes with their predictions (DESIGN.md: fixes [{change, predicted_s, range, model}])."""
    return [p.as_json() for c in changes_for(kind, transports) for p in _job(predict(transports, why, c))]


def elsewhere(fixes: list[dict]) -> str | None:
    """What a finding's fix says first when the model predicts that none of its more slots or
    connections would help, the server or the link being the limit: the finding names the full
    slot table (the symptom), the predictions where the time goes."""
    more = [f for f in fixes if f["status"] == "predicted" and not f["change"].startswith(("buffered", "write size"))]
    limits = {f["limit"] for f in more}
    if not more or not all(f["little_gain"] for f in more) or not limits <= {SERVER, "link"}:
        return None
    where = "the link" if limits == {"link"} else "the server (its disk, its nfsd threads) or the path to it"
    return (f"more slots or connections buy little here (predicted below): each RPC's time grows with "
            f"the RPCs in flight, so {where} is the limit, not the slot table")


def _job(preds: list[Prediction]) -> list[Prediction]:
    """The job's prediction: the slowest host's (one per change)."""
    return [max(preds, key=lambda p: p.predicted_s or 0)] if preds else []


def inputs_json(tr: Transport) -> dict:
    return {"host": tr.host, "server": tr.server, "slots_per_connection": tr.per_connection, "nconnect": tr.nconnect,
            "session_slots": tr.session, "slot_limit": tr.limit, "wsize": tr.wsize, "link_Bps": tr.link_Bps,
            "link_seen_Bps": tr.seen_Bps, "mean_write_bytes": round(tr.write_bytes), "sync_writes": tr.sync,
            "write_bytes": tr.bytes, "sending_s": _r(tr.sending_s),
            "server_ms_at": {"fit_a_ms": round(tr.server_a * 1e3, 3), "fit_b_ms_per_rpc": round(tr.server_b * 1e3, 4),
                             "in_flight_seen": list(tr.flight_seen)},
            "overhead_ms": round(tr.overhead * 1e3, 3), "commit_ms": round(tr.commit_s * 1e3, 3), "commits": tr.commits,
            "ranks": len(tr.ranks)}


def inputs_lines(tr: Transport) -> list[str]:
    """The measured inputs, for people."""
    flight = tr.flight_seen
    server = (f"server time per RPC {number(tr.server_a * 1e3, 'ms')} + {number(tr.server_b * 1e3, 'ms', like=tr.server_a * 1e3)} "
              f"per RPC in flight (seen {flight[0]}-{flight[1]} in flight)")
    if not np.isfinite(tr.server_b_se):
        server += "; its growth beyond that is unknown"
    limit = ("slot limit unknown" if tr.limit is None else
             f"slot limit {tr.limit}: NFSv4.1 session slots, shared by {plural(tr.nconnect, 'connection')}"
             if tr.session else f"slot limit {tr.limit}: {tr.per_connection} per connection x nconnect {tr.nconnect}")
    link = f"link {round_rate(tr.link_Bps * 8)}" if tr.link_Bps else "link speed unknown"
    return [f"{tr.host} -> {tr.server}: {limit}; {link}",
            f"  {len(tr.ranks)} ranks, {size(tr.bytes)} in WRITEs of {size(tr.write_bytes)} mean "
            f"({'synchronous' if tr.sync else 'unstable, flushed'}), {byte_rate(tr.bytes / tr.sending_s)} while sending",
            f"  {server}; slot hold overhead {number(tr.overhead * 1e3, 'ms')}; "
            + (f"COMMIT {number(tr.commit_s * 1e3, 'ms')}" if tr.commits else
               f"no COMMIT sent (one would take a WRITE's round trip, {number(tr.commit_s * 1e3, 'ms')})")]

