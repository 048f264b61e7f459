"""watch's sweep of the kernel's aggregates (agent/aggregates.py), the map contents given as
plain data as read_maps reads them, through the real Metrics and prometheus_client: what the
endpoint serves is what the maps hold, and counters never go down. (The kernel side: the live
test on this kernel's syscalls, the VM test on sunrpc.)"""
import os

import numpy as np
import pytest

from slotscope.agent.aggregates import AGG_SERVERS, Aggregator, Raw, bucket_tree, cflags
from slotscope.agent.metrics import BOUNDS_NS, Metrics
from slotscope.capture.syscalls import OP_NUMBER
from unit_helpers import scrape

pytestmark = pytest.mark.unit

S = 1_000_000_000
NB = len(BOUNDS_NS) + 1


def hist(*values_ns) -> tuple[list[int], int]:
    """A kernel histogram of these values: (bucket counts, sum ns)."""
    counts = [0] * NB
    for v in values_ns:
        counts[int(np.searchsorted(BOUNDS_NS, v, side="left"))] += 1
    return counts, sum(values_ns)


def rpc(slot_wait=(), rtt=(), execute=()) -> dict:
    return {"slot_wait": hist(*slot_wait), "rtt": hist(*rtt), "execute": hist(*execute)}


def test_the_kernels_bucket_is_the_metrics_bucket():
    """AGG_BUCKET (a binary search compiled into the programs) puts every ns value, at the bounds
    and beside them, in the bucket np.searchsorted puts it in for the rows."""
    def bucket(tree, ns: int) -> int:
        while not isinstance(tree, int):
            tree = tree[1] if ns <= tree[0] else tree[2]
        return tree
    tree = bucket_tree()
    assert f"-DAGG_BUCKET(ns)=((ns)<={tree[0]}ULL?" in " ".join(cflags())
    for bound in BOUNDS_NS:
        for v in (int(bound) - 1, int(bound), int(bound) + 1, 0, 10**12):
            assert bucket(tree, v) == np.searchsorted(BOUNDS_NS, v, side="left"), v


def test_rpc_histograms_per_server_and_procedure():
    """A mount's nfs and nfsacl clients (one server) add up under their server; each sweep adds
    what the kernel's cumulative histograms grew by."""
    servers = {3: "10.0.0.2:2049", 4: "10.0.0.2:2049", 9: None}
    agg, m = Aggregator(servers.get, lambda *_: None), Metrics()
    assert agg.clients([3, 4, 9]) == {3: 0, 4: 0, 9: 1}       # 9 unknown in debugfs: server "?"
    raw = Raw(rpcs={(3, "WRITE"): rpc([2 * S], [10_000_000], [2_020_000_000]),
                    (4, "WRITE"): rpc([0], [50_000_000], [60_000_000]),
                    (9, "GETATTR"): rpc([0], [1_000], [2_000])})
    m.sweep(agg.sweep(raw, 10 * S)[0])
    got = scrape(m)
    w = 'procedure="WRITE",server="10.0.0.2:2049"'
    assert got[f"slotscope_rpc_slot_wait_seconds_count{{{w}}}"] == 2
    assert got[f'slotscope_rpc_slot_wait_seconds_bucket{{le="0.0001",{w}}}'] == 1
    assert got[f'slotscope_rpc_slot_wait_seconds_bucket{{le="1",{w}}}'] == 1
    assert got[f'slotscope_rpc_slot_wait_seconds_bucket{{le="2.5",{w}}}'] == 2
    assert got[f"slotscope_rpc_execute_seconds_sum{{{w}}}"] == pytest.approx(2.08)
    assert got['slotscope_rpc_rtt_seconds_count{procedure="GETATTR",server="?"}'] == 1
    # the next sweep: client 3's WRITE histogram grew by one RPC; nothing is counted twice
    raw.rpcs[3, "WRITE"] = rpc([2 * S, 30_000], [10_000_000, 40_000], [2_020_000_000, 100_000])
    m.sweep(agg.sweep(raw, 11 * S)[0])
    got = scrape(m)
    assert got[f"slotscope_rpc_slot_wait_seconds_count{{{w}}}"] == 3
    assert got[f"slotscope_rpc_execute_seconds_sum{{{w}}}"] == pytest.approx(2.0801)


def test_transport_integrals_and_full_time():
    """The kernel's per-server counts and accumulators (acc - delta * ts at each change) give the
    integrals at the sweep's time: 2 slots in use from 1 s, 128 and 5 waiting from 2 s, none
    waiting from 5 s (a full period of 3 s), 0 in use from 6 s."""
    agg, m = Aggregator({1: "a"}.get, lambda *_: None), Metrics()
    agg.clients([1])
    in_use_acc, backlog_acc = -(2 * 1 + 126 * 2) * S, -5 * 2 * S
    raw = Raw(servers={0: (128, 5, in_use_acc, backlog_acc, 0, 2 * S)})
    swept, _ = agg.sweep(raw, 4 * S)
    assert swept.full_since == {"a": 2 * S}                   # what slot_full_s reads
    m.sweep(swept)
    got = scrape(m)
    s = 'server="a"'
    assert got[f"slotscope_transport_slots_in_use_seconds_total{{{s}}}"] == pytest.approx(2 * 1 + 128 * 2)
    assert got[f"slotscope_transport_backlog_seconds_total{{{s}}}"] == pytest.approx(5 * 2)
    assert got[f"slotscope_transport_full_seconds_total{{{s}}}"] == pytest.approx(2)
    in_use_acc += 118 * 5 * S + 10 * 6 * S      # 10 in use from 5 s, none from 6 s
    backlog_acc += 5 * 5 * S
    raw.servers[0] = (0, 0, in_use_acc, backlog_acc, 3 * S, 0)
    swept, _ = agg.sweep(raw, 9 * S)
    assert swept.full_since == {}
    m.sweep(swept)
    got = scrape(m)
    assert got[f"slotscope_transport_slots_in_use_seconds_total{{{s}}}"] == pytest.approx(2 * 1 + 128 * 3 + 10 * 1)
    assert got[f"slotscope_transport_backlog_seconds_total{{{s}}}"] == pytest.approx(5 * 3)
    assert got[f"slotscope_transport_full_seconds_total{{{s}}}"] == pytest.approx(3)


def test_an_integral_read_mid_change_never_goes_down():
    """A sweep between the kernel's change of a count and of its accumulator overstates the
    integral by the time since the change; the next sweep's truth is less, and the counter stays."""
    agg, m = Aggregator({1: "a"}.get, lambda *_: None), Metrics()
    agg.clients([1])
    m.sweep(agg.sweep(Raw(servers={0: (1, 0, 0, 0, 0, 0)}), 1 * S)[0])     # count 1, acc not yet -1 s
    swept, _ = agg.sweep(Raw(servers={0: (1, 0, -1 * S + 1, 0, 0, 0)}), 1 * S + 2)
    assert swept.transports["a"]["in_use_ns"] == 0
    m.sweep(swept)
    assert scrape(m)['slotscope_transport_slots_in_use_seconds_total{server="a"}'] == 1.0


def test_servers_past_the_kernels_table_are_left_out():
    agg = Aggregator(lambda cid: f"s{cid}", lambda *_: None)
    assert len(agg.clients(range(AGG_SERVERS + 5))) == AGG_SERVERS


def _sample_capture_as_the_kernel_adds_it():
    """The bundled VM capture's slots rows (a mount's nfs and nfsacl clients on one transport) as
    the kernel's server entry would hold them after each second: every sample's change of its
    client's counts added at its ts (what bpf/sunrpc.c agg_slots does)."""
    from slotscope.capture.reader import Capture
    slots = Capture.open(os.path.join(os.path.dirname(__file__), "..", "..", "analyzer", "sample")).read("slots")
    slots = slots.sort_by("ts")
    assert len(set(slots["client_id"].to_pylist())) > 1
    last: dict[int, tuple[int, int]] = {}
    state = [0, 0, 0, 0, 0, 0]      # in_use, backlog, in_use_acc, backlog_acc, full_ns, full_since
    ts0, sweeps = slots["ts"][0].as_py(), []
    for r in slots.select(["ts", "client_id", "in_use", "backlog"]).to_pylist():
        while r["ts"] - ts0 >= (len(sweeps) + 1) * S:
            sweeps.append((ts0 + len(sweeps) * S + S, tuple(state)))
        was = last.get(r["client_id"], (0, 0))
        last[r["client_id"]] = (r["in_use"], r["backlog"])
        d_in, d_bl, ts = r["in_use"] - was[0], r["backlog"] - was[1], r["ts"]
        state[0] += d_in
        state[2] -= d_in * ts
        state[1] += d_bl
        state[3] -= d_bl * ts
        if state[1] > 0 and not state[5]:
            state[5] = ts
        elif state[1] <= 0 and state[5]:
            state[4] += ts - state[5]
            state[5] = 0
    return slots, sweeps, (slots["ts"][-1].as_py(), tuple(state))


def test_transport_metrics_sum_the_clients_as_the_analyzer_does():
    """Swept once a second, the server's slots in use, waiters and saturated time are the
    analyzer's occupancy of the same rows (each client's sample holding until its next, summed),
    to the last sample."""
    from slotscope.analyzer.transports import occupancy
    slots, sweeps, end = _sample_capture_as_the_kernel_adds_it()
    agg, m = Aggregator(lambda cid: "10.0.0.1:2049", lambda *_: None), Metrics()
    agg.clients(set(slots["client_id"].to_pylist()))
    for now, state in [*sweeps, end]:
        m.sweep(agg.sweep(Raw(servers={0: state}), now)[0])
    occ = occupancy(slots, 0)
    held = np.diff(occ.ts) / 1e9
    want = {"slots_in_use": (held * occ.cols["in_use"][:-1]).sum(), "backlog": (held * occ.cols["backlog"][:-1]).sum(),
            "full": (held * (occ.cols["backlog"][:-1] > 0)).sum()}
    got = scrape(m)
    for name, value in want.items():
        assert got[f'slotscope_transport_{name}_seconds_total{{server="10.0.0.1:2049"}}'] == pytest.approx(value, rel=1e-9)


def test_calls_on_an_undecided_fd_wait_until_it_is_decided(tmp_path):
    """agg_pending: a write on fd 5 before the decoder knows its file is held back; once the fd
    is known traced it is folded into its (syscall, mount) and process, the fd is marked (its
    later calls the kernel adds up as a marked fd's), and the entry forgotten a sweep later. fd
    6's file is not traced: its entry is forgotten, counted nowhere."""
    write, fsync = OP_NUMBER["write"], OP_NUMBER["fsync"]
    known: dict[tuple[int, int, int], object] = {}
    agg, m = Aggregator(lambda cid: None, lambda tgid, fd, gen: known.get((tgid, fd, gen))), Metrics(per_process=True)
    pending = {(7, 5, 100, write): (hist(50_000, 60_000)[0], 110_000, 8192), (7, 6, 120, write): (hist(1)[0], 1, 1)}
    raw = Raw(pending={k: (v, (60_000, 90, 7)) for k, v in pending.items()})
    swept, writes = agg.sweep(raw, 1 * S)
    assert not swept.calls and not writes.marks and not writes.forget
    known[7, 5, 100], known[7, 6, 120] = (99, "/mnt", "/mnt/ckpt"), False
    swept, writes = agg.sweep(raw, 2 * S)
    assert swept.calls == {("write", "/mnt"): (hist(50_000, 60_000)[0], 110_000, 8192)}
    assert swept.processes == {7: (8192, 110_000)}
    assert swept.longest == {"ns": 60_000, "tgid": 7, "tid": 7, "syscall": "write", "fd": 5, "ts_enter": 90,
                             "path": "/mnt/ckpt"}
    assert writes.marks == {(7, 5): (100, 99)} and writes.forget == [(7, 6, 120, write)]
    m.sweep(swept)
    # the next sweep: one more call held back (it looked for the mark before it was made), and the
    # kernel's own entry for the marked fd's later calls
    raw.pending = {(7, 5, 100, write): ((hist(50_000, 60_000, 70_000)[0], 180_000, 12288), (70_000, 95, 7))}
    raw.calls = {(99, fsync): (hist(3 * S)[0], 3 * S, 0)}
    raw.processes = {7: (0, 3 * S)}
    raw.longest = (3 * S, 200, 8, 7, 5, 100, fsync)
    swept, writes = agg.sweep(raw, 3 * S)
    assert writes.forget == [(7, 5, 100, write)]
    assert swept.longest["syscall"] == "fsync" and swept.longest["path"] == "/mnt/ckpt"
    m.sweep(swept)
    got = scrape(m)
    assert got['slotscope_syscall_duration_seconds_count{mount="/mnt",syscall="write"}'] == 3
    assert got['slotscope_syscall_duration_seconds_count{mount="/mnt",syscall="fsync"}'] == 1
    assert got['slotscope_written_bytes_total{mount="/mnt"}'] == 12288
    assert got['slotscope_process_blocked_seconds_total{comm="",pid="7",rank=""}'] == pytest.approx(3.00018)
    assert not any('syscall="write"' in k and "/mnt" not in k for k in got if k.startswith("slotscope_syscall"))
