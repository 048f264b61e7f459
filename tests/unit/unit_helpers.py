"""Helpers of the unit tier: rows and captures built in the test, and the `slotscope` command.

Everything here writes under pytest's tmp_path, needs no root and no BCC.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from slotscope.capture.format import FORMAT_MAJOR
from slotscope.capture.tables import LOSS, PROCS, SYSCALL

REPO = Path(__file__).resolve().parents[2]

START_NS = 1_700_000_000_000_000_000     # 2023-11-14T22:13:20Z


def meta(host: str = "node-a", **extra) -> dict:
    """A meta.json as the agent writes it (the keys the reader and analyzer use)."""
    m = {
        "format": "slotscope-capture",
        "schema_version": FORMAT_MAJOR,
        "slotscope_version": "0.1.0",
        "host": host,
        "kernel": "6.1.0-test",
        "start": {"monotonic_ns": 1_000, "realtime_ns": START_NS, "uncertainty_ns": 10},
        "stop": {"monotonic_ns": 61_000_000_000, "realtime_ns": START_NS + 60_000_000_000,
                 "uncertainty_ns": 10},
    }
    m.update(extra)
    return m


def sc(tgid: int, syscall: str = "write", latency_ns: int = 1_000, nbytes: int | None = None,
       ts: int = 1_000_000, tid: int | None = None, **more) -> dict:
    """One `syscall` row; write-family rows get `bytes` (default 0), others null, as decode.py does."""
    is_write = syscall in ("write", "pwrite64", "writev", "pwritev", "pwritev2")
    ret = more.pop("ret", nbytes if nbytes is not None else 0)
    row = {
        "ts_enter": ts, "ts_exit": ts + latency_ns, "latency_ns": latency_ns,
        "tid": tid if tid is not None else tgid, "tgid": tgid, "syscall": syscall,
        "fd": 3, "ret": ret, "bytes": (max(ret, 0) if is_write else None),
        "requested": nbytes or 0, "offset": -1, "errno": -ret if ret < 0 else 0, "flags": 0,
        "iov_partial": False, "path": "/mnt/ckpt/shard", "path2": None, "dev": 42, "ino": 7,
        "fstype": "nfs4",
    }
    row.update(more)
    return row


def save_writes(start_s: float, tgid: int, path: str, n: int = 4) -> list[dict]:
    """`syscall` rows of a save by one process: open, n writes of 1 MiB, close, one second apart."""
    t = int(start_s * 1e9)
    rows = [{"ts_enter": t, "ts_exit": t + 1000, "syscall": "openat", "path": path, "tgid": tgid, "tid": tgid,
             "dev": 30, "ino": tgid, "fd": 5, "ret": 5, "errno": 0, "fstype": "nfs", "latency_ns": 1000}]
    for i in range(1, n + 1):
        rows.append({**rows[0], "ts_enter": t + i * 10**9, "ts_exit": t + i * 10**9 + 1000, "syscall": "write",
                     "bytes": 2**20, "ret": 2**20, "path": path})
    rows.append({**rows[0], "ts_enter": t + (n + 1) * 10**9, "ts_exit": t + (n + 1) * 10**9 + 1000,
                 "syscall": "close", "ret": 0})
    return rows


THREE_SAVES = ((99.5, 105.0), (129.5, 135.0), (159.5, 169.0))   # each save's bounds, s since the capture's start


def three_saves() -> list[dict]:
    """`syscall` rows of a recording of three torch.save saves, 30 s apart, by two processes each
    writing 4 MiB (8 MiB in the third), each save from the mkdir of its directory half a second
    before the writers open their files to the last close (THREE_SAVES); and a file read, never
    written, before them."""
    rows = []
    for k, start in enumerate((100, 130, 160)):
        for tgid in (201, 202):
            rows += save_writes(start, tgid, f"/mnt/ckpt/step_{k + 1}/r{tgid}.pt", n=4 if k < 2 else 8)
        rows.append({**rows[-1], "syscall": "mkdir", "ts_enter": int((start - 0.5) * 1e9),
                     "ts_exit": int((start - 0.5) * 1e9) + 1000, "path": f"/mnt/ckpt/step_{k + 1}", "ino": None,
                     "dev": None, "bytes": None})
    rows.append({**rows[0], "syscall": "openat", "ts_enter": 50 * 10**9, "ts_exit": 50 * 10**9 + 10,
                 "path": "/mnt/ckpt/config.json", "ino": 999})     # read, never written: no save
    return rows


def proc(tgid: int, rank: int | None = None, ppid: int = 1, comm: str = "python", ts: int = 500,
         rank_source: str | None = None, inherited_from: int | None = None, **more) -> dict:
    """One `procs` row."""
    env = [("RANK", str(rank))] if rank is not None else []
    row = {
        "ts": ts, "tgid": tgid, "ppid": ppid, "comm": comm, "cmdline": f"{comm} train.py",
        "cgroup": "0::/job", "rank": rank, "local_rank": rank, "world_size": 2 if rank is not None else None,
        "rank_env": env, "rank_source": rank_source or ("env" if rank is not None else "none"),
        "inherited_from": inherited_from, "complete": True,
    }
    row.update(more)
    return row


def syscall_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SYSCALL)


def procs_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=PROCS)


def loss_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=LOSS)


def slotscope_command() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "slotscope"
    if script.exists():
        return [str(script)]
    found = shutil.which("slotscope")
    return [found] if found else [sys.executable, "-m", "slotscope.cli"]


def run_slotscope(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(slotscope_command() + list(args), capture_output=True, text=True,
                          timeout=120, env=env)


def assert_one_line_error(res: subprocess.CompletedProcess, *phrases: str) -> str:
    """Exit status 1, exactly one line on stderr naming the problem, no traceback."""
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith("slotscope: "), line
    for phrase in phrases:
        assert phrase in line, (phrase, line)
    return line


def scrape(metrics) -> dict[str, float]:
    """What Prometheus would read from watch's Metrics: series -> value."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = generate_latest(registry).decode()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}
