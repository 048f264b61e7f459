"""Per NFS server (transport): slot-table occupancy against its limit, and the link toward it.

The agent records occupancy per RPC client on every change of the slots in use or of the
tasks waiting for one; clients cloned from the same mount (nfs, nfsacl, ...) share the
server's transport, so the occupancy of the transport is the sum over its clients. Each
sample holds until the next one. Where the xprt kprobes ran, each transport's own counters
(num_reqs, max_reqs, backlog) are there too, per connection: `xprts`, and the kernel's
limit replaces the one from the sysctl.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.events import SLOT_COUNTS

from .job import Job


def server_addr(server: str | None) -> str | None:
    """'10.0.0.1:2049' -> '10.0.0.1'; '[fd00::1]:2049' -> 'fd00::1'."""
    if not server:
        return server
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit():
        return server
    return host.strip("[]")


def slot_limit(meta: dict, addr: str | None) -> tuple[int | None, int | None, dict | None]:
    """(transport slots, NFSv4.1+ session slots, the mount) for a server, from meta.json:
    the sunrpc slot-table sysctl of the mount's protocol times its nconnect transports."""
    mount = next((m for m in meta.get("nfs_mounts") or [] if m.get("server") == addr), None)
    sysctls = meta.get("sunrpc") or {}
    if mount is None:
        return None, None, None
    proto = mount.get("proto") or "tcp"
    key = {"tcp": "tcp_max_slot_table_entries", "tcp6": "tcp_max_slot_table_entries",
           "udp": "udp_slot_table_entries", "udp6": "udp_slot_table_entries"}.get(proto)
    nconnect = int(mount.get("nconnect") or 1)
    slots = int(sysctls[key]) * nconnect if key and str(sysctls.get(key, "")).isdigit() else None
    session = None
    if str(mount.get("vers", "")).startswith(("4.1", "4.2")):
        value = str(sysctls.get("nfs_max_session_slots", ""))
        session = int(value) if value.isdigit() else None
    return slots, session, mount


@dataclass
class Occupancy:
    """A transport's occupancy as a step function: value[i] holds from ts[i] (UTC ns) on."""
    ts: np.ndarray
    cols: dict[str, np.ndarray]

    def durations(self, t0: int, t1: int) -> np.ndarray:
        """How long each step lasts inside [t0, t1]."""
        ends = np.append(self.ts[1:], t1)
        return np.clip(np.minimum(ends, t1) - np.maximum(self.ts, t0), 0, None)

    def within(self, t0: int, t1: int) -> np.ndarray:
        """Steps in force at some time inside [t0, t1]."""
        ends = np.append(self.ts[1:], t1)
        return (ends > t0) & (self.ts <= t1)


def occupancy(slots: pa.Table, offset_ns: int) -> Occupancy:
    """Sum the per-client step functions of one transport's rows (any order)."""
    ts = slots["ts"].to_numpy().astype(np.int64)
    order = np.argsort(ts, kind="stable") if (np.diff(ts) < 0).any() else slice(None)   # agents write in order
    client = slots["client_id"].to_numpy()[order]
    # each row's previous row of the same client (-1: its first), so that a row's change to
    # its own client's value can be summed into the transport's total
    before = np.full(client.size, -1)
    for c in np.unique(client):
        idx = np.flatnonzero(client == c)
        before[idx[1:]] = idx[:-1]
    cols = {}
    for name in SLOT_COUNTS:
        v = slots[name].to_numpy().astype(np.int64)[order]
        cols[name] = np.cumsum(v - np.where(before >= 0, v[before], 0))
    return Occupancy(ts[order] + offset_ns, cols)


def occupancy_of(entry: dict) -> Occupancy | None:
    """A transport_table() entry's occupancy over time: its slot samples', or a sampled
    capture's means per interval (counted()); None without either."""
    return entry.get("_occupancy", entry.get("_counted"))


def counted(rows: pa.Table, offset_ns: int) -> Occupancy:
    """A sampled capture's transport (ms_xprt rows of one server) as an Occupancy of means per
    interval: each send adds the requests outstanding (req_u) and those waiting for a slot
    (bklog_u) then, so their growth over the sends' is the mean each send found in the
    interval before the row; none after it (an interval without a row sent nothing)."""
    g = rows.group_by(["ts", "interval_ns"]).aggregate([("sends", "sum"), ("req_u", "sum"), ("bklog_u", "sum")])
    g = g.sort_by("ts")
    sends = np.maximum(g["sends_sum"].to_numpy(), 1)
    ends = g["ts"].to_numpy() + offset_ns

    def step(v: np.ndarray) -> np.ndarray:
        return np.ravel(np.column_stack([v, np.zeros_like(v)]))
    in_use, waiting = g["req_u_sum"].to_numpy() / sends, g["bklog_u_sum"].to_numpy() / sends
    return Occupancy(np.ravel(np.column_stack([ends - g["interval_ns"].to_numpy(), ends])),
                     {"in_use": step(in_use), "backlog": step(waiting), "session_wait": step(np.zeros_like(in_use))})


def transport_table(job: Job, window: tuple[int, int] | None) -> list[dict]:
    """One entry per (host, server) with slot rows or RPCs, as in the JSON contract, plus the
    time series the findings and the report use (keys starting with '_' stay out of JSON):
    `_occupancy` from slot samples, `_counted` from a sampled capture's mountstats (counted())."""
    slots = {cap.meta.get("host", "?"): t for cap, t in job.per_capture("slots")}
    ms_xprt = {cap.meta.get("host", "?"): t for cap, t in job.per_capture("ms_xprt")}
    kernel_rows = {cap.meta.get("host", "?"): t for cap, t in job.per_capture("xprt")}
    keys = {(cap.meta.get("host", "?"), server) for name in ("rpc", "slots", "xprt", "ms_xprt")
            for cap, t in job.per_capture(name) for server in pc.unique(t["server"]).to_pylist()}
    out = []
    for host, server in sorted(keys, key=lambda k: (k[0], k[1] or "")):
        cap = next(c for c in job.captures if c.meta.get("host", "?") == host)
        offset = job.utc_offset_ns(host)
        addr = server_addr(server)
        limit, session, mount = slot_limit(cap.meta, addr)
        entry = {"host": host, "server": server, "max_slots": limit, "session_slots": session,
                 "mount": mount and {k: mount.get(k) for k in ("mountpoint", "vers", "proto", "nconnect",
                                                               "wsize", "timeo", "retrans", "hard")},
                 "peak_in_use": None, "saturated_fraction": None, "saturated_s": None, "backlog_peak": None,
                 "mean_waiting": None, "link": link_usage(job, host, addr, window), "xprts": []}
        xprts = _of_server(kernel_rows.get(host), server)
        if xprts is not None:
            entry["xprts"] = xprt_entries(xprts, offset, window)
            # the kernel's own limit: every connection's table (nconnect makes several)
            entry["max_slots"] = sum(x["max_reqs"] for x in entry["xprts"]) or limit
            limit = entry["max_slots"]
        mine = _of_server(slots.get(host), server)
        sampled = _of_server(ms_xprt.get(host), server) if mine is None else None
        if sampled is not None:
            entry["_counted"] = counted(sampled, offset)
        if mine is not None:
            occ = occupancy(mine, offset)
            entry["_occupancy"] = occ
            t0, t1 = window or (int(occ.ts[0]), int(occ.ts[-1]))
            inside = occ.within(t0, t1)
            if inside.any():
                dur = occ.durations(t0, t1)
                waiting = occ.cols["backlog"] + occ.cols["session_wait"]
                full = waiting > 0
                if limit:
                    full |= occ.cols["in_use"] >= limit
                span = max(t1 - t0, 1)
                entry.update(peak_in_use=int(occ.cols["in_use"][inside].max()),
                             backlog_peak=int(waiting[inside].max()),
                             saturated_s=float((dur * full).sum()) / 1e9,
                             saturated_fraction=float((dur * full).sum()) / span,
                             mean_waiting=float((dur * waiting).sum()) / span)
        out.append(entry)
    return out


def _of_server(t: pa.Table | None, server: str | None) -> pa.Table | None:
    """The rows of `t` toward `server`, None when there are none."""
    if t is None:
        return None
    same = pc.fill_null(pc.equal(t["server"], server), False) if server is not None else pc.is_null(t["server"])
    t = t if pc.all(same).as_py() else t.filter(same)
    return t if t.num_rows else None


def xprt_entries(rows: pa.Table, offset_ns: int, window: tuple[int, int] | None) -> list[dict]:
    """Per transport (struct rpc_xprt: one per connection), from its own counters sampled at
    every slot given back: the table's limit, its peak, and how long tasks waited
    for a slot on it within the window. (num_reqs counts idle preallocated slots too: with
    min_reqs == max_reqs it is always at the limit, so waiters, not num_reqs, say full.)"""
    out = []
    for xid in sorted(pc.unique(rows["xprt_id"]).to_pylist()):
        mine = rows.filter(pc.equal(rows["xprt_id"], xid))
        ts = mine["ts"].to_numpy().astype(np.int64) + offset_ns
        order = np.argsort(ts, kind="stable")
        cols = {c: mine[c].to_numpy().astype(np.int64)[order] for c in ("num_reqs", "max_reqs", "min_reqs", "backlog")}
        occ = Occupancy(ts[order], cols)
        t0, t1 = window or (int(occ.ts[0]), int(occ.ts[-1]))
        inside = occ.within(t0, t1)
        if not inside.any():
            continue
        full = cols["backlog"] > 0
        out.append({"id": int(xid), "max_reqs": int(cols["max_reqs"][inside].max()),
                    "min_reqs": int(cols["min_reqs"][inside].max()),
                    "peak_num_reqs": int(cols["num_reqs"][inside].max()),
                    "backlog_peak": int(cols["backlog"][inside].max()),
                    "saturated_fraction": float((occ.durations(t0, t1) * full).sum()) / max(t1 - t0, 1)})
    return out


def link_util(transports: list[dict]) -> float | None:
    """The busiest link's mean use over the save, of the transports whose link speed is known."""
    utils = [tr["link"]["mean_util"] for tr in transports if tr["link"] and tr["link"]["mean_util"] is not None]
    return max(utils) if utils else None


def link_usage(job: Job, host: str, addr: str | None, window: tuple[int, int] | None) -> dict | None:
    """The interface the server is routed through: its speed and how much of it the save used
    (peak over the agent's sampling intervals, and the mean over the save window)."""
    net = job.of_host("netdev", host)
    if net is None or addr is None:
        return None
    net = net.filter(pc.equal(net["server"], addr)).sort_by("ts")
    if net.num_rows < 2:
        return None
    ts = net["ts"].to_numpy().astype(np.int64) + job.utc_offset_ns(host)
    speeds = [s for s in net["speed_bps"].to_pylist() if s]
    speed = max(speeds) if speeds else None
    dt = np.diff(ts)
    sent = {d: np.diff(net[f"{d}_bytes"].to_numpy().astype(np.int64)) for d in ("tx", "rx")}
    keep = dt > 0
    if window:
        keep &= (ts[1:] > window[0]) & (ts[:-1] < window[1])
    if not keep.any():
        return None
    rate = {d: sent[d][keep] * 8 / (dt[keep] / 1e9) for d in sent}      # bits per second
    mean = {d: sent[d][keep].sum() * 8 / (dt[keep].sum() / 1e9) for d in sent}
    return {
        "iface": net["iface"][0].as_py(), "speed_bps": speed,
        "peak_bps": float(max(rate["tx"].max(), rate["rx"].max())),
        "mean_tx_bps": float(mean["tx"]), "mean_rx_bps": float(mean["rx"]),
        "peak_util": float(max(rate["tx"].max(), rate["rx"].max()) / speed) if speed else None,
        "mean_util": float(max(mean["tx"], mean["rx"]) / speed) if speed else None,
        "_series": (ts[1:][keep], rate["tx"], rate["rx"]),
    }
