"""The `slots` rows the agent makes (agent/rpc_rows.py slots_table): the kernel's rows of the
waits for a slot, and those of each RPC's taking and giving back of its slot, made from the
counts its record carries (bpf/sunrpc.c). Played here as the kernel plays them: the rows come
out as the kernel made them all when it emitted a row per change."""
import numpy as np
import pytest
from numpy.lib.recfunctions import repack_fields

from slotscope.agent.layouts import RPC_EVENT, SLOT_EVENT
from slotscope.agent.rpc_rows import RPC_SLOT_FIELDS, slots_table
from slotscope.analyzer.transports import occupancy
from slotscope.capture.events import SLOT_COUNTS, SLOT_FREED, SLOT_ROW_FREED, SLOT_ROW_TAKEN, SLOT_TAKEN

pytestmark = pytest.mark.unit


class NoNames:
    def names(self, ids):
        import pyarrow as pa
        return pa.nulls(len(ids), pa.string())


def play(changes):
    """changes: (ts, client, rpc, what, delta), what one of SLOT_COUNTS, rpc an index or None. ->
    (the kernel's slot events: the waits' changes; the RPC records; the row of each change of
    in_use, backlog and session_wait, as the kernel made them before the RPCs carried theirs)."""
    counts, kernel, every, rpcs = {}, [], [], {}
    for ts, client, rpc, what, delta in changes:
        c = counts.setdefault(client, dict.fromkeys(SLOT_COUNTS, 0))
        c[what] += delta
        if what in ("sending", "pending"):    # ride along in the other rows
            continue
        row = (ts, *(c[n] for n in SLOT_COUNTS), client)
        every.append(row)
        if what == "in_use":
            r = rpcs.setdefault(rpc, {"client_id": client, "slot_rows": 0})
            fields, bit, at = (SLOT_TAKEN, SLOT_ROW_TAKEN, "ts_reserved") if delta > 0 else \
                (SLOT_FREED, SLOT_ROW_FREED, "ts_end")
            r.update({at: ts, "slot_rows": r["slot_rows"] | bit, **dict(zip(fields, row[1:6]))})
        else:
            kernel.append(row)
    records = np.zeros(len(rpcs) + 1, RPC_EVENT.dtype)   # and one RPC that never took a slot
    records[-1]["client_id"], records[-1]["ts_end"] = 3, 55
    for i, r in enumerate(rpcs.values()):
        for name, value in r.items():
            records[i][name] = value
    return np.array(kernel, SLOT_EVENT.dtype), records, np.array(every, SLOT_EVENT.dtype)


CHANGES = [   # client 3: two RPCs, the second waits for the first's slot; client 4's RPC overlaps
    (10, 3, 0, "in_use", 1), (12, 4, 2, "in_use", 1), (15, 3, None, "backlog", 1), (15, 3, None, "sending", 1),
    (30, 3, 0, "in_use", -1), (31, 3, None, "backlog", -1), (31, 3, 1, "in_use", 1),
    (40, 4, 2, "in_use", -1), (50, 3, None, "session_wait", 1),
]


def test_each_rpcs_slot_makes_the_rows_the_kernel_made_a_change_each():
    kernel, records, every = play(CHANGES)
    rows = slots_table(kernel, records, NoNames())
    got = [tuple(r[n] for n in ("ts", *SLOT_COUNTS, "client_id")) for r in rows.to_pylist()]
    assert got == [tuple(int(v) for v in r) for r in every]
    # RPC 1 is outstanding (taken, not given back): its one row; the RPC without a slot has none
    assert sum(1 for r in got if r[0] == 31 and r[1] == 1) == 1 and 55 not in [r[0] for r in got]
    occ = occupancy(rows, 0)
    assert occ.cols["in_use"].tolist() == [1, 2, 2, 1, 1, 2, 1, 1]   # the two clients' slots, summed
    assert occ.cols["sending"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]


def test_the_fields_watch_keeps_of_an_rpc_make_the_same_rows():
    """watch's flight recorder keeps only RPC_SLOT_FIELDS of the RPC records for the slots stream."""
    kernel, records, _ = play(CHANGES)
    kept = repack_fields(records[list(RPC_SLOT_FIELDS)])
    assert kept.itemsize < RPC_EVENT.dtype.itemsize / 3
    assert slots_table(kernel, kept, NoNames()).equals(slots_table(kernel, records, NoNames()))
