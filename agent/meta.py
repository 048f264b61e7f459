"""meta.json: what a reader needs to interpret the tables (DESIGN.md, capture format)."""
from __future__ import annotations

import os
import socket
import time

from slotscope.capture.meta import new_meta, slotscope_version
from slotscope.capture.mountstats import nfs_sections

from .clock import sync_state
from .identity import redact_argv
from .links import interfaces, speed_bps
from .mounts import MountTable

SUNRPC_SYSCTLS = ("tcp_slot_table_entries", "tcp_max_slot_table_entries", "udp_slot_table_entries",
                  "min_resvport", "max_resvport")


def clock_pair() -> dict[str, int]:
    """CLOCK_MONOTONIC (bpf_ktime_get_ns) <-> CLOCK_REALTIME, from the tightest of a few samples."""
    best = None
    for _ in range(5):
        r0 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if best is None or r1 - r0 < best[2]:
            best = (m, (r0 + r1) // 2, r1 - r0)
    return {"monotonic_ns": best[0], "realtime_ns": best[1], "uncertainty_ns": best[2]}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def nfs_mounts() -> list[dict]:
    out = []
    for m in MountTable.read().nfs_mounts():
        opts = dict((kv.partition("=")[0], kv.partition("=")[2]) for kv in m.options.split(","))
        out.append({
            "mountpoint": m.mountpoint, "source": m.source, "fstype": m.fstype, "dev": m.dev,
            "vers": opts.get("vers"), "proto": opts.get("proto"), "nconnect": opts.get("nconnect", "1"),
            "wsize": opts.get("wsize"), "rsize": opts.get("rsize"),
            "hard": "soft" not in opts, "timeo": opts.get("timeo"), "retrans": opts.get("retrans"),
            "server": opts.get("addr"), "options": m.options,
        })
    return out


def nfs_mountstats() -> dict[str, str]:
    """mountpoint -> its section of /proc/self/mountstats (per-op counters, transports): the
    kernel's own totals, read at start and stop so the analyzer can check the capture
    against their difference. Reading it never contacts the server."""
    try:
        with open("/proc/self/mountstats", encoding="utf-8", errors="replace") as f:
            return nfs_sections(f.read())
    except OSError:
        return {}


def sunrpc_sysctls() -> dict[str, str | None]:
    """The slot limits: sunrpc's for NFSv3/TCP, the session's for NFSv4.1+."""
    out = {name: _read(f"/proc/sys/sunrpc/{name}") for name in SUNRPC_SYSCTLS}
    out["nfs_max_session_slots"] = _read("/sys/module/nfs/parameters/max_session_slots")
    return out


def nics() -> list[dict]:
    return [{"name": name, "speed_mbps": bps // 1_000_000 if bps else None}
            for name in interfaces() for bps in [speed_bps(name)]]


def _clock_sync() -> dict:
    try:
        return {"clock_sync": sync_state()}
    except OSError:         # a seccomp filter may refuse adjtimex: then nothing is known
        return {}


def start_meta(argv: list[str], filters: dict, probes: dict) -> dict:
    return {
        **new_meta(),
        "slotscope_version": slotscope_version(),
        "host": socket.gethostname(),
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "kernel": os.uname().release,
        "command": " ".join(redact_argv(argv)),
        "agent_pid": os.getpid(),
        "start": clock_pair(),
        **_clock_sync(),
        "filters": filters,
        "nfs_mounts": nfs_mounts(),
        "mountstats_start": nfs_mountstats(),
        "sunrpc": sunrpc_sysctls(),
        "nics": nics(),
        "probes": probes,
    }
