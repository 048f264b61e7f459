"""RPC figures: the latency split per procedure, and when a server sent no replies."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Metadata procedures of NFSv3 and NFSv4 (the names the sunrpc tracepoints report).
METADATA_PROCS = frozenset({
    "GETATTR", "SETATTR", "LOOKUP", "LOOKUPP", "ACCESS", "CREATE", "MKDIR", "MKNOD", "SYMLINK", "LINK",
    "REMOVE", "RMDIR", "RENAME", "READDIR", "READDIRPLUS", "READLINK", "FSSTAT", "FSINFO", "PATHCONF",
    "OPEN", "OPEN_NOATTR", "OPEN_CONFIRM", "OPEN_DOWNGRADE", "CLOSE", "DELEGRETURN", "GETACL", "SETACL",
    "STATFS", "SERVER_CAPS", "LOOKUP_ROOT", "GETDEVICEINFO", "LAYOUTGET", "LAYOUTRETURN", "LAYOUTCOMMIT",
})
SPANS = ("slot_wait_ns", "transmit_wait_ns", "backlog_ns", "rtt_ns", "execute_ns")


def by_proc(rpc: pa.Table | None) -> dict[str, dict]:
    """procname -> count, bytes and summed spans of its completed RPCs, p50/p99 of execute."""
    if rpc is None:
        return {}
    done = rpc.filter(pc.equal(rpc["complete"], 1))
    out = {}
    for name in sorted(pc.unique(done["procname"]).to_pylist()):
        t = done.filter(pc.equal(done["procname"], name))
        ex = np.sort(t["execute_ns"].to_numpy(zero_copy_only=False))
        e = {"count": t.num_rows, "bytes": int(pc.sum(t["io_count"]).as_py() or 0),
             **{s: int(pc.sum(t[s]).as_py() or 0) for s in SPANS},
             "session_wait_ns": int(pc.sum(t["session_sleep_ns"]).as_py() or 0),
             "p50_ns": int(ex[(ex.size - 1) // 2]), "p99_ns": int(ex[int(np.ceil(0.99 * ex.size)) - 1]),
             "max_ns": int(ex[-1]), "retransmits": int(pc.sum(t["retransmits"]).as_py() or 0),
             "timeouts": int(pc.sum(t["timeouts"]).as_py() or 0)}
        out[name] = e
    outstanding = rpc.filter(pc.equal(rpc["complete"], 0))
    for name in pc.unique(outstanding["procname"]).to_pylist():
        n = pc.sum(pc.equal(outstanding["procname"], name)).as_py()
        out.setdefault(name, {"count": 0})["outstanding"] = n
    return out


def silences(sent: np.ndarray, ended: np.ndarray, replied: np.ndarray, stop: int, min_ns: int) -> list[tuple]:
    """Stretches of at least `min_ns` in which a server sent no reply while RPCs sent to it
    waited for one: (start, end, rpcs waiting at the end). `sent`/`ended` per RPC (ended:
    its reply or its end; RPCs still outstanding end at `stop`), `replied` marks the
    RPCs whose end is a reply (not a timeout error)."""
    replies = np.unique(ended[replied])
    bounds = np.concatenate(([np.iinfo(np.int64).min], replies, [stop]))
    out = []
    for i in np.flatnonzero(np.diff(bounds) >= min_ns):
        prev, nxt = bounds[i], bounds[i + 1]
        waiting = (sent < nxt) & (ended >= nxt)
        if not waiting.any():
            continue
        start = max(prev, sent[waiting].min())
        if nxt - start >= min_ns:
            out.append((int(start), int(nxt), int(waiting.sum())))
    return out
