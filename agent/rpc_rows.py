"""`rpc`, `slots`, `xprt`, `nfs_io` and `owners` rows from the sunrpc, xprt, nfs and nfs_owner
probe groups' events."""
from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa

from slotscope.capture.events import NFS_KINDS, SLOT_COUNTS, SLOT_FREED, SLOT_ROW_FREED, SLOT_ROW_TAKEN, SLOT_TAKEN
from slotscope.capture.tables import NFS_IO, OWNERS, RPC, SLOTS, XPRT

from .layouts import NFS_EVENT, OWNER_EVENT, RPC_EVENT, SLOT_EVENT, XPRT_EVENT, Distinct, per_value

DEBUGFS_CLIENTS = "/sys/kernel/debug/sunrpc/rpc_clnt"


class ClientNames:
    """client_id -> server address, from debugfs: rpc_clnt/<id>/xprt links to the
    transport, whose info names the peer. Reading it never asks the server."""

    def __init__(self):
        self._names: dict[int, str | None] = {}

    def _refresh(self) -> None:
        for info in glob.glob(os.path.join(DEBUGFS_CLIENTS, "*", "xprt", "info")):
            try:
                cid = int(info.split(os.sep)[-3])
                with open(info) as f:
                    fields = {k.strip(): v.strip() for k, _, v in
                              (line.partition(":") for line in f.read().splitlines())}
            except (OSError, ValueError):
                continue
            addr, port = fields.get("addr"), fields.get("port")
            self._names[cid] = f"{addr}:{port}" if addr and port and port != "0" else addr

    def listed(self) -> list[int]:
        """The clients debugfs lists now (read afresh)."""
        self._refresh()
        return [cid for cid, name in self._names.items() if name is not None]

    def server(self, cid: int) -> str | None:
        """One client's server (None where unknown)."""
        self.learn(np.array([cid], np.uint32))
        return self._names[cid]

    def learn(self, ids: np.ndarray) -> Distinct:
        """Read the names of clients not seen before (while they exist: a mount's clients go
        with it). -> the distinct ids."""
        distinct = Distinct(ids)
        new = set(distinct.values) - self._names.keys()
        if new:
            self._refresh()
            for cid in new - self._names.keys():
                self._names[cid] = None   # not in debugfs: do not look again
        return distinct

    def names(self, ids: np.ndarray) -> pa.Array:
        """The server of each row's client (strings; null where unknown)."""
        return self.learn(ids).map(self._names.__getitem__, pa.string())


def _span(end: np.ndarray, start: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """end - start where both were seen, else the fallback."""
    both = (end > 0) & (start > 0)
    return np.where(both, end - start, fallback.astype(np.int64))


def rpc_table(ev: np.ndarray, clients: ClientNames, now_ns: int) -> pa.Table:
    cols = RPC_EVENT.to_arrow(ev)
    derived = {
        "slot_wait_ns": _span(ev["ts_reserved"], ev["ts_reserve_start"], ev["backlog_sleep_ns"]),
        "transmit_wait_ns": _span(ev["ts_first_tx"], ev["ts_transmit_start"], ev["sending_sleep_ns"]),
        "backlog_ns": ev["backlog_us"].astype(np.int64) * 1000,
        "rtt_ns": ev["rtt_us"].astype(np.int64) * 1000,
        "execute_ns": ev["execute_us"].astype(np.int64) * 1000,
        "age_ns": np.where(ev["complete"] == 0, now_ns - ev["ts_begin"], 0),
    }
    cols["server"] = clients.names(ev["client_id"])
    arrays = [cols[f.name] if f.name in cols else pa.array(derived[f.name], f.type) for f in RPC]
    return pa.Table.from_arrays(arrays, schema=RPC)


def _with_server(layout, schema: pa.Schema, ev: np.ndarray, clients: ClientNames) -> pa.Table:
    cols = layout.to_arrow(ev)
    cols["server"] = clients.names(ev["client_id"])
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


# The RPC record's fields of its slot's rows: what the slots stream keeps of an RPC (watch's
# flight recorder holds the RPC records twice, for the rpc and slots streams).
RPC_SLOT_FIELDS = ("ts_reserved", "ts_end", "client_id", "slot_rows", *SLOT_TAKEN, *SLOT_FREED)


def slots_table(ev: np.ndarray, rpcs: np.ndarray, clients: ClientNames) -> pa.Table:
    """The kernel's slot rows (each change of the waits for a slot) and those of each RPC's
    taking and giving back its slot, from the counts its record carries (bpf/sunrpc.c
    slots_change), in time order."""
    taken = rpcs[(rpcs["slot_rows"] & SLOT_ROW_TAKEN) != 0]
    freed = rpcs[(rpcs["slot_rows"] & SLOT_ROW_FREED) != 0]
    rows = np.concatenate([ev, _slot_events(taken, "ts_reserved", SLOT_TAKEN), _slot_events(freed, "ts_end", SLOT_FREED)])
    return _with_server(SLOT_EVENT, SLOTS, rows[np.argsort(rows["ts"], kind="stable")], clients)


def _slot_events(rpcs: np.ndarray, ts: str, counts: tuple[str, ...]) -> np.ndarray:
    out = np.zeros(rpcs.size, SLOT_EVENT.dtype)
    out["ts"], out["client_id"] = rpcs[ts], rpcs["client_id"]
    for name, field_ in zip(SLOT_COUNTS, counts):
        out[name] = rpcs[field_]
    return out


def xprt_table(ev: np.ndarray, clients: ClientNames) -> pa.Table:
    return _with_server(XPRT_EVENT, XPRT, ev, clients)


def nfs_table(ev: np.ndarray) -> pa.Table:
    cols = NFS_EVENT.to_arrow(ev)
    cols["kind"] = per_value(ev["kind"], lambda k: NFS_KINDS.get(k, "?"), pa.string())
    return pa.Table.from_arrays([cols[f.name] for f in NFS_IO], schema=NFS_IO)


def owners_table(ev: np.ndarray) -> pa.Table:
    cols = OWNER_EVENT.to_arrow(ev)
    return pa.Table.from_arrays([cols[f.name] for f in OWNERS], schema=OWNERS)
