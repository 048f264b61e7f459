#!/usr/bin/env python3
"""Does `slotscope top` keep up with a cursor moving 10 times a second, at 1,000 ranks and at 8,000?

Generates two jobs as the agent writes them (syscall, procs, rpc, slots, netdev, agent and
blocked tables, one segment a second): 1,000 ranks in one capture, and 8,000 ranks on 1,000
nodes (a capture each, 8 ranks per node). For each it runs the TUI headless (App.run_test) at
120x40, makes one untimed move (it builds the rank index: "first move"), and for `--seconds`
moves the time cursor 10 times a second (as scrubbing or playing do: each move asks for the
view as of the new cursor) while pressing a key every 0.5 s, twice: as the TUI does it (a move
updates the rank rows incrementally; the findings follow when the cursor rests, and while it
moves within FULL_SHARE of a core: tui/worker.py), and with a full re-analysis per move (the
baseline, measured in the same run). Per run:

  frame ms     UI-thread time to apply one result (banner, panels, rank table): mean, p95
  loop lag ms  how late a 10 ms timer on the UI's event loop fires: p95, max
  key ms       from pressing `down` to the rank table's cursor having moved: mean, max
  answer ms    from a request to its result in the UI (analysis, transfer), mean
  results/s    results shown per second (requests made while one is on its way merge)
  CPU %        CPU time / wall time over the run (100 = one core): the UI process, and the UI
               with its analysis process (from /proc)

and each figure of the full re-analysis as a ratio to the incremental one's. The goals: at
1,000 ranks, UI and analysis under 25% of a core; at 8,000, every key under 200 ms.

    .venv/bin/python bench/tui.py [--ranks 1000] [--job 1000x8] [--seconds 10] [--hz 10]
                                  [--keep DIR] [--json]

--keep DIR keeps the generated captures there (and reuses them: the 1,000 captures of the
8,000-rank job take a minute or two to write); --job "" skips the big job.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from slotscope.capture.tables import schema
from slotscope.capture.writer import CaptureWriter

S = 1_000_000_000
T0 = 1_000_000_000                # monotonic ns of the capture's start
START_UTC = 1_790_000_000 * S
SIZE = (120, 40)


def _table(name: str, n: int, cols: dict) -> pa.Table:
    """A table of `name`'s schema with n rows: given columns, the rest 0 or null."""
    want = schema(name)
    arrays = []
    for f in want:
        if f.name in cols:
            v = cols[f.name]
            if isinstance(v, pa.ChunkedArray):
                v = v.combine_chunks()
            arrays.append(v.cast(f.type) if isinstance(v, pa.Array) else pa.array(v, f.type))
        elif pa.types.is_integer(f.type) or pa.types.is_boolean(f.type):
            arrays.append(pa.array(np.zeros(n, dtype=np.int64), pa.int64()).cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=want)


def generate(path: str, ranks: int, seconds: int = 30, writes: int = 12, slots: int = 16, seed: int = 1,
             host: str = "node-0", first_rank: int = 0, world: int | None = None) -> dict:
    """A capture of `ranks` processes (RANK set: first_rank on, of `world`) each writing `writes`
    1 MiB chunks to its own file on an NFS mount over `seconds`, one WRITE RPC per chunk through
    a `slots`-slot table that is full most of the time, NIC counters every 0.5 s, and the agent's
    snapshots of calls blocked over 1 s. Rows are written one segment per second of capture time."""
    rng = np.random.default_rng(seed)
    world = ranks if world is None else world
    tgid = np.arange(ranks, dtype=np.int64) + 10_000
    end_ns = T0 + seconds * S
    # syscalls: openat, the writes (some stuck for seconds), fsync, close
    starts = T0 + (rng.random(ranks) * 2 * S).astype(np.int64)
    per = ((seconds - 4) * S) // writes
    t_enter = (starts[:, None] + np.arange(writes)[None, :] * per + rng.integers(0, per // 4, (ranks, writes)))
    lat = np.minimum(rng.lognormal(np.log(40e6), 0.8, (ranks, writes)).astype(np.int64), per // 2)
    stuck = rng.random((ranks, writes)) < 0.05          # some calls stuck for over a second
    lat[stuck] = rng.integers(S, per * 3 // 4, stuck.sum())
    w_tgid = np.repeat(tgid, writes)
    paths = np.array([f"/mnt/ckpt/step100/rank{first_rank + i:05d}.pt" for i in range(ranks)], dtype=object)
    w_path = np.repeat(paths, writes)
    sc = {
        "ts_enter": np.concatenate([starts - 5_000_000, t_enter.ravel(), t_enter[:, -1] + per, t_enter[:, -1] + per + 3 * S // 2]),
        "latency": np.concatenate([np.full(ranks, 2_000_000), lat.ravel(), np.full(ranks, 1 * S), np.full(ranks, 50_000)]),
        "tgid": np.concatenate([tgid, w_tgid, tgid, tgid]),
        "syscall": ["openat"] * ranks + ["write"] * (ranks * writes) + ["fsync"] * ranks + ["close"] * ranks,
        "path": np.concatenate([paths, w_path, paths, paths]),
    }
    n = len(sc["syscall"])
    is_write = np.array([s == "write" for s in sc["syscall"]])
    syscall = _table("syscall", n, {
        "ts_enter": sc["ts_enter"], "ts_exit": sc["ts_enter"] + sc["latency"], "latency_ns": sc["latency"],
        "tid": sc["tgid"], "tgid": sc["tgid"],
        "syscall": pa.array(sc["syscall"]).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string())),
        "fd": np.full(n, 3), "ret": np.where(is_write, 1 << 20, 0),
        "bytes": pa.array(np.where(is_write, 1 << 20, 0), pa.int64(), mask=~is_write),
        "requested": np.where(is_write, 1 << 20, 0), "offset": np.full(n, -1),
        "path": pa.array(sc["path"], pa.string()), "dev": np.full(n, 30), "ino": sc["tgid"],
        "fstype": pa.array(["nfs"] * n),
    })
    procs = _table("procs", ranks, {
        "ts": np.full(ranks, T0), "tgid": tgid, "ppid": np.full(ranks, 1), "comm": ["python"] * ranks,
        "cmdline": ["python train.py"] * ranks, "rank": first_rank + np.arange(ranks), "local_rank": np.arange(ranks) % 8,
        "world_size": np.full(ranks, world), "rank_env": [[("RANK", str(first_rank + i))] for i in range(ranks)],
        "rank_source": ["env"] * ranks, "complete": np.ones(ranks, dtype=bool),
    })
    # one WRITE RPC per write call, inside it: slot wait, then the round trip
    b = t_enter.ravel() + 100_000
    exe = np.maximum(lat.ravel() - 200_000, 1_000_000)
    slot = (exe * 0.7).astype(np.int64)
    rtt = (exe * 0.25).astype(np.int64)
    m = b.size
    rpc = _table("rpc", m, {
        "ts_begin": b, "ts_end": b + exe, "ts_reserve_start": b, "ts_reserved": b + slot,
        "ts_transmit_start": b + slot, "ts_first_tx": b + slot + 50_000, "ts_last_tx": b + slot + 50_000,
        "rtt_us": rtt // 1000, "execute_us": exe // 1000, "backlog_us": slot // 1000,
        "fileid": w_tgid, "io_count": np.full(m, 1 << 20), "io_stable": np.full(m, 2), "io_dev": np.full(m, 30),
        "client_id": np.full(m, 3), "owner_tid": w_tgid, "owner_tgid": w_tgid, "version": np.full(m, 3),
        "attempts": np.ones(m), "transmits": np.ones(m), "complete": np.ones(m),
        "procname": pa.array(["WRITE"] * m), "progname": pa.array(["nfs"] * m),
        "slot_wait_ns": slot, "transmit_wait_ns": np.full(m, 50_000), "backlog_ns": slot, "rtt_ns": rtt,
        "execute_ns": exe, "age_ns": np.zeros(m), "server": pa.array(["10.0.0.1:2049"] * m),
    })
    # the slot table: in use follows the RPCs holding a slot, capped at the limit; the rest wait
    events = np.concatenate([b + slot, b + exe])
    delta = np.concatenate([np.ones(m), -np.ones(m)]).astype(np.int64)
    order = np.argsort(events, kind="stable")
    active = np.cumsum(delta[order])
    ts_slots = events[order]
    waiting_rpcs = np.cumsum(np.concatenate([np.ones(m), -np.ones(m)])[np.argsort(np.concatenate([b, b + slot]))])
    waiting = np.interp(ts_slots, np.sort(np.concatenate([b, b + slot])), waiting_rpcs).astype(np.int64)
    keep = np.r_[True, np.diff(ts_slots) > 1_000_000]         # one sample a millisecond at most
    k = int(keep.sum())
    slots_t = _table("slots", k, {
        "ts": ts_slots[keep], "in_use": np.minimum(active[keep], slots), "backlog": waiting[keep],
        "client_id": np.full(k, 3), "server": pa.array(["10.0.0.1:2049"] * k),
    })
    # NIC counters every 0.5 s: the bytes of the WRITEs that ended by then
    nts = np.arange(T0, end_ns + 1, S // 2)
    sent = np.searchsorted(np.sort(b + exe), nts) * (1 << 20)
    netdev = _table("netdev", nts.size, {
        "ts": nts, "iface": pa.array(["eth0"] * nts.size), "server": pa.array(["10.0.0.1"] * nts.size),
        "speed_bps": np.full(nts.size, 25 * 10**9), "tx_bytes": sent, "rx_bytes": sent // 50,
    })
    # blocked snapshots every second: calls in progress for over a second
    ts_enter, ts_exit = syscall["ts_enter"].to_numpy(), syscall["ts_exit"].to_numpy()
    snaps = []
    for snap in range(T0 + S, end_ns + 1, S):
        inside = np.flatnonzero((ts_enter <= snap - S) & (ts_exit > snap))
        if inside.size:
            snaps.append(_table("blocked", inside.size, {
                "ts": np.full(inside.size, snap), "tid": syscall["tid"].take(pa.array(inside)),
                "tgid": syscall["tgid"].take(pa.array(inside)),
                "syscall": pa.array(syscall["syscall"].take(pa.array(inside)).to_pylist(), pa.string()),
                "ts_enter": ts_enter[inside], "fd": np.full(inside.size, 3),
                "path": syscall["path"].take(pa.array(inside)), "dev": np.full(inside.size, 30),
                "ino": syscall["tgid"].take(pa.array(inside)),
            }))
    blocked = pa.concat_tables(snaps) if snaps else None
    agent = _table("agent", seconds + 1, {"ts": np.arange(T0, end_ns + 1, S)})

    w = CaptureWriter(path)
    w.write_meta({
        "format": "slotscope-capture", "schema_version": 1, "slotscope_version": "bench", "host": host,
        "kernel": "6.1.0-bench", "start": {"monotonic_ns": T0, "realtime_ns": START_UTC},
        "stop": {"monotonic_ns": end_ns, "realtime_ns": START_UTC + end_ns - T0},
        "nfs_mounts": [{"server": "10.0.0.1", "mountpoint": "/mnt/ckpt", "proto": "tcp", "vers": "3",
                        "nconnect": "1", "wsize": "1048576"}],
        "sunrpc": {"tcp_max_slot_table_entries": str(slots)},
    })
    w.append("procs", procs)
    w.tables["procs"].close_segment()
    tables = {"syscall": (syscall, "ts_exit"), "rpc": (rpc, "ts_end"), "slots": (slots_t, "ts"),
              "netdev": (netdev, "ts"), "agent": (agent, "ts")}
    if blocked is not None:
        tables["blocked"] = (blocked, "ts")
    for second in range(seconds + 4):       # one segment per second of capture time, per table
        lo, hi = T0 + second * S, T0 + (second + 1) * S
        for name, (t, col) in tables.items():
            ts = t[col].to_numpy()
            idx = np.flatnonzero((ts >= lo) & (ts < hi) if second < seconds + 3 else ts >= lo)
            if idx.size:
                w.append(name, t.take(pa.array(idx)))
                w.tables[name].close_segment()
    w.close()
    return {"ranks": ranks, "syscall_rows": syscall.num_rows, "rpc_rows": rpc.num_rows,
            "slot_rows": slots_t.num_rows, "blocked_rows": 0 if blocked is None else blocked.num_rows}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of another process, from /proc."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_job(workdir: str, ranks: int, nodes: int) -> list[str]:
    """The captures of a job of `ranks` ranks on `nodes` nodes, written once into workdir."""
    root = os.path.join(workdir, f"job-{nodes}x{ranks // nodes}")
    paths = [os.path.join(root, f"node-{i:04d}") for i in range(nodes)]
    per = ranks // nodes
    os.makedirs(root, exist_ok=True)
    for i, path in enumerate(paths):
        if not os.path.exists(path):
            generate(path, per, seed=i + 1, host=f"node-{i:04d}", first_rank=i * per, world=ranks)
    return paths


async def _drive(paths: list[str], seconds: float, hz: float, incremental: bool) -> dict:
    from textual import events

    import slotscope.tui.app as top
    from slotscope.analyzer.job import Job

    # The cursor moves every 100 ms and never rests during the run; nor may it between the
    # untimed first move and the run (the whole analysis it would start could overlap the run).
    top.SETTLE_SECONDS = 3600
    app = top.TopApp(Job.open(paths), poll_seconds=3600, play_seconds=3600, incremental=incremental)
    lags: list[float] = []
    keys: list[float] = []
    async with app.run_test(size=SIZE) as pilot:
        started = time.perf_counter()
        while app.result is None:
            if time.perf_counter() - started > 900:
                raise SystemExit(f"bench/tui.py: no analysis after 900 s ({app.error or 'no error reported'})")
            await pilot.pause(0.05)
        first_s = time.perf_counter() - started
        await app.workers.wait_for_complete()
        span = app.result.timeline.span_ns
        step = span // max(int(seconds * hz), 1)
        t = time.perf_counter()                 # one move, untimed: it builds the rank index
        app.cursor = step // 2
        app.request(moving=True)
        await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        first_move_s = time.perf_counter() - t
        await pilot.pause(0.2)
        app.load_seconds.clear()
        app.frame_seconds.clear()
        running = True

        async def lag_probe():
            while running:
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                lags.append(time.perf_counter() - t - 0.01)

        probe = asyncio.create_task(lag_probe())
        worker = getattr(getattr(app.analyst, "proc", None), "pid", None)
        cpu0, wcpu0, wall0 = time.process_time(), _proc_cpu(worker), time.perf_counter()
        i, next_key = 0, wall0 + 0.5
        table = app.query_one("#ranks")
        while time.perf_counter() - wall0 < seconds:
            app.cursor = min(span, step * (i + 1))     # as scrubbing or playing do
            app.request(moving=True)
            i += 1
            if time.perf_counter() >= next_key:
                # a key as the terminal driver delivers it (Pilot.press also waits for idle)
                before = table.cursor_row
                event = events.Key("down" if before < min(15, table.row_count - 1) else "up", None)
                event.set_sender(app)
                t = time.perf_counter()
                app._driver.send_message(event)
                while table.cursor_row == before and time.perf_counter() - t < 5:
                    await asyncio.sleep(0.001)
                keys.append(time.perf_counter() - t)
                next_key += 0.5
            await asyncio.sleep(max(0.0, wall0 + i / hz - time.perf_counter()))
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        wcpu = _proc_cpu(worker) - wcpu0
        running = False
        await probe
        shown = len(app.frame_seconds)
        out = {
            "first_result_s": first_s, "first_move_s": first_move_s, "requests": i, "results_shown": shown, "results_per_s": shown / wall,
            "frame_ms_mean": 1e3 * statistics.fmean(app.frame_seconds) if shown else float("nan"),
            "frame_ms_p95": 1e3 * _pct(app.frame_seconds, 95),
            "loop_lag_ms_p95": 1e3 * _pct(lags, 95), "loop_lag_ms_max": 1e3 * max(lags, default=float("nan")),
            "key_ms_mean": 1e3 * statistics.fmean(keys) if keys else float("nan"),
            "key_ms_max": 1e3 * max(keys, default=float("nan")),
            "answer_ms_mean": 1e3 * statistics.fmean(app.load_seconds) if app.load_seconds else float("nan"),
            "ui_cpu_percent": 100 * cpu / wall, "cpu_percent": 100 * (cpu + wcpu) / wall,
            "ranks_shown": app.query_one("#ranks").row_count,
        }
        await pilot.press("q")
    return out


def _rows(paths: list[str]) -> dict:
    from slotscope.analyzer.job import Job
    job = Job.open(paths)
    n = {t: (job.table(t).num_rows if job.table(t) is not None else 0) for t in ("syscall", "rpc", "blocked")}
    return {"captures": len(paths), "syscall_rows": n["syscall"], "rpc_rows": n["rpc"], "blocked_rows": n["blocked"]}


def measure(paths: list[str], ranks: int, seconds: float, hz: float) -> dict:
    """The incremental TUI and the full re-analysis per move, one after the other."""
    out = {"ranks": ranks, **_rows(paths)}
    for name, incremental in (("incremental", True), ("full", False)):
        out[name] = asyncio.run(_drive(paths, seconds, hz, incremental))
    out["ratios"] = {k: out["full"][k] / out["incremental"][k] for k, _, _ in ROWS if out["incremental"][k]}
    return out


ROWS = [("frame_ms_mean", "frame ms, mean", "{:.2f}"), ("frame_ms_p95", "frame ms, p95", "{:.2f}"),
        ("loop_lag_ms_p95", "loop lag ms, p95", "{:.1f}"), ("loop_lag_ms_max", "loop lag ms, max", "{:.1f}"),
        ("key_ms_mean", "key ms, mean", "{:.1f}"), ("key_ms_max", "key ms, max", "{:.1f}"),
        ("answer_ms_mean", "answer ms, mean", "{:.0f}"), ("results_per_s", "results shown/s", "{:.1f}"),
        ("ui_cpu_percent", "CPU %, UI", "{:.0f}"), ("cpu_percent", "CPU %, UI + analysis", "{:.0f}")]


def _uptime() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1000, help="ranks of the one-capture job")
    ap.add_argument("--job", default="1000x8", help="NODESxRANKS of the many-node job (\"\": none)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hz", type=float, default=10.0, help="cursor moves (requests) a second")
    ap.add_argument("--keep", help="write the captures here, and reuse them")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load = [_uptime()]
    with tempfile.TemporaryDirectory(prefix="slotscope-bench-tui-") as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        runs = [measure(make_job(work, args.ranks, 1), args.ranks, args.seconds, args.hz)]
        if args.job:
            nodes, per = (int(x) for x in args.job.lower().split("x"))
            runs.append(measure(make_job(work, nodes * per, nodes), nodes * per, args.seconds, args.hz))
    load.append(_uptime())
    goals = {"cpu_under_25_percent_at_%d" % runs[0]["ranks"]: runs[0]["incremental"]["cpu_percent"] < 25}
    if len(runs) > 1:
        goals["keys_under_200_ms_at_%d" % runs[1]["ranks"]] = runs[1]["incremental"]["key_ms_max"] < 200
    if args.json:
        json.dump({"runs": runs, "goals": goals, "hz": args.hz, "seconds": args.seconds, "cpus": os.cpu_count(),
                   "load_average_before_after": load}, sys.stdout, indent=2)
        print()
        return 0
    print(f"slotscope top, {SIZE[0]}x{SIZE[1]} headless, cursor moved {args.hz:g}x/s for {args.seconds:g} s, "
          f"{os.cpu_count()} CPUs, load average {load[0]} before, {load[1]} after")
    for run in runs:
        print(f"  {run['ranks']:>5} ranks: {run['captures']:,} capture(s), {run['syscall_rows']:,} syscall rows, "
              f"{run['rpc_rows']:,} RPCs, {run['blocked_rows']:,} blocked rows; first result in "
              f"{run['incremental']['first_result_s']:.1f} s, first move in {run['incremental']['first_move_s']:.1f} s "
              f"(the full analysis per move: {run['full']['first_move_s']:.1f} s)")
    print(f"  {'':<22}" + "".join(f"{str(r['ranks']) + ' ranks':>33}" for r in runs))
    print(f"  {'':<22}" + "".join(f"{'incremental':>13}{'full/move':>11}{'ratio':>9}" for _ in runs))
    for key, title, fmt in ROWS:
        print(f"  {title:<22}" + "".join(
            f"{fmt.format(r['incremental'][key]):>13}{fmt.format(r['full'][key]):>11}"
            f"{(str(round(r['ratios'][key], 2)) + 'x') if key in r['ratios'] else '':>9}" for r in runs))
    for goal, ok in goals.items():
        print(f"  goal, {goal.replace('_', ' ')}: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
