"""RPC figures: the latency split per procedure, and when a server sent no replies."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Part:
    """A part of the latency split: one share of an RPC's execute time, as every output shows it."""
    key: str        # the by_proc sum it is, or REST
    label: str      # in a legend
    column: str     # as a table's column head, short: the TUI's drill-down fits nine in 71 columns


REST = "rest_ns"
# The latency split, in the order an RPC goes through it; REST is what the measured parts
# leave of execute.
SPLIT = (Part("slot_wait_ns", "slot wait", "slot"),
         Part("transmit_wait_ns", "transmit wait", "xmit"),
         Part("rtt_ns", "round trip", "rtt"),
         Part(REST, "rest of execute", "rest"))
# what the tables' column heads stand for
COLUMN_LEGEND = ", ".join(f"{part.column}: {part.label}" for part in SPLIT)


def split(p: dict) -> dict[str, float] | None:
    """A by_proc entry's mean ns per completed RPC of each part of SPLIT (keyed by Part.key)
    and of execute whole ("execute_ns"); None when none completed."""
    n = p.get("count") or 0
    if not n:
        return None
    means = {part.key: p[part.key] / n for part in SPLIT if part.key != REST}
    execute = p["execute_ns"] / n
    # the spans are measured apart from execute and can add up to more: the rest stops at 0
    return {**means, REST: max(0.0, execute - sum(means.values())), "execute_ns": execute}


def by_proc(rpc: pa.Table | None) -> dict[str, dict]:
    """procname -> count, bytes and summed spans of its completed RPCs, p50/p99/max of execute,
    and how many were still outstanding at the stop."""
    if rpc is None:
        return {}
    sums = ("io_count",) + SPANS + ("session_sleep_ns", "retransmits", "timeouts")
    names = pc.dictionary_encode(rpc["procname"]).combine_chunks()     # hashed once, grouped on codes
    t = rpc.select(("complete",) + sums).append_column("code", names.indices)
    g = t.group_by(["code", "complete"]).aggregate([(c, "sum") for c in sums] + [("complete", "count")])
    # exact percentiles of execute per procedure: a sort of each procedure's times (few procedures)
    codes = names.indices.to_numpy(zero_copy_only=False)
    done = rpc["complete"].to_numpy() == 1
    ex = rpc["execute_ns"].to_numpy()
    procs = names.dictionary.to_pylist()
    out = {}
    for row in sorted(g.to_pylist(), key=lambda r: (procs[r["code"]], -r["complete"])):
        name = procs[row["code"]]
        if row["complete"] != 1:
            out.setdefault(name, {"count": 0})["outstanding"] = row["complete_count"]
            continue
        times = np.sort(ex[done & (codes == row["code"])])
        n = times.size
        out[name] = {
            "count": n, "bytes": row["io_count_sum"] or 0,
            **{sp: row[f"{sp}_sum"] or 0 for sp in SPANS},
            "session_wait_ns": row["session_sleep_ns_sum"] or 0,
            "p50_ns": int(times[(n - 1) // 2]), "p99_ns": int(times[int(np.ceil(0.99 * n)) - 1]),
            "max_ns": int(times[-1]), "retransmits": row["retransmits_sum"] or 0, "timeouts": row["timeouts_sum"] or 0}
    return out


def silences(sent: np.ndarray, ended: np.ndarray, replied: np.ndarray, stop: int, min_ns: int) -> list[tuple]:
    """Stretches of at least `min_ns` in which a server sent no reply while RPCs sent to it
    waited for one: (start, end, rpcs waiting at the end). `sent`/`ended` per RPC (ended:
    its reply or its end; RPCs still outstanding end at `stop`), `replied` marks the
    RPCs whose end is a reply (not a timeout error)."""
    replies = np.sort(ended[replied])
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
