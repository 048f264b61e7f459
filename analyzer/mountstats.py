"""/proc/self/mountstats, the kernel's own per-op NFS counters: what the agent stores in
meta.json at start and stop, and their difference, against which a capture is checked."""
from __future__ import annotations

import re

from .job import utc_ns

OP_FIELDS = ("ops", "ntrans", "timeouts", "bytes_sent", "bytes_recv", "queue_ms", "rtt_ms",
             "execute_ms", "errors")
# "xprt: tcp ..." after the protocol name (net/sunrpc/xprtsock.c, xs_tcp_print_stats)
TCP_FIELDS = ("srcport", "bind_count", "connect_count", "connect_time", "idle_time", "sends",
              "recvs", "bad_xids", "req_u", "bklog_u", "max_slots", "sending_u", "pending_u")


def _count(word: str) -> bool:
    return word.isascii() and word.isdigit()      # what int() reads (not "²", a digit to isdigit)


def parse_section(text: str) -> dict:
    """One mount's section: {"ops": {op: {field: n}}, "xprt": [{field: n}], "opts": {option: value}}."""
    ops, xprts, opts = {}, [], {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "opts:":
            opts = dict(o.partition("=")[::2] for o in parts[1].split(","))
        elif len(parts) > 2 and parts[0] == "xprt:" and parts[1] == "tcp" and all(map(_count, parts[2:])):
            xprts.append(dict(zip(TCP_FIELDS, map(int, parts[2:]))))
        elif parts and parts[0].endswith(":") and parts[0][:-1].isupper() and parts[1:] \
                and all(map(_count, parts[1:])):
            ops[parts[0][:-1]] = dict(zip(OP_FIELDS, map(int, parts[1:])))
    return {"ops": ops, "xprt": xprts, "opts": opts}


def parse(text: str, mountpoint: str = "/mnt/nfs") -> dict:
    """The section of one mount in a whole /proc/self/mountstats text."""
    inside, lines = False, []
    for line in text.splitlines():
        if line.startswith("device "):
            inside = f" mounted on {mountpoint} " in line
        elif inside:
            lines.append(line)
    found = parse_section("\n".join(lines))
    if not found["ops"]:
        raise ValueError(f"no NFS mount on {mountpoint} in mountstats")
    return found


def delta(before: dict, after: dict) -> dict:
    """Counter differences per op; transports as they are after (max_slots is a high-water
    mark, so only the after value means anything)."""
    ops = {name: {k: v - before["ops"].get(name, {}).get(k, 0) for k, v in c.items()}
           for name, c in after["ops"].items()}
    return {"ops": ops, "xprt": after["xprt"]}


def capture_deltas(meta: dict) -> dict[str, dict]:
    """mountpoint -> delta() over the recording, for the mounts meta.json has both ends of."""
    start, stop = meta.get("mountstats_start") or {}, meta.get("mountstats_stop") or {}
    return {point: delta(parse_section(start[point]), parse_section(stop[point]))
            for point in sorted(set(start) & set(stop))}


def _device_server(device: str) -> str:
    """'10.0.0.1:/export' -> '10.0.0.1'; '[fd00::1]:/export' -> 'fd00::1'."""
    return device.rpartition(":/")[0].strip("[]") if ":/" in device else device


def mounts(text: str) -> dict[str, tuple[str, dict]]:
    """mountpoint -> (server, parse_section()) of every NFS mount in a whole mountstats text."""
    found, lines = {}, None
    for line in text.splitlines():
        if line.startswith("device "):
            words = line.split()
            nfs = len(words) >= 8 and words[6] == "fstype" and words[7].startswith("nfs")
            lines = [] if nfs else None
            if nfs:
                found[words[4]] = (_device_server(words[1]), lines)
        elif lines is not None:
            lines.append(line)
    return {point: (server, parse_section("\n".join(body))) for point, (server, body) in found.items()}


MS = 1_000_000


def interval_rows(before: dict, after: dict, ts: int, interval_ns: int, mount: str,
                  server: str) -> tuple[list[dict], list[dict]]:
    """One mount's rows of the ms_ops and ms_xprt tables (capture/tables.py) for the interval
    between two parse_section()s ending at ts: counter deltas, times in ns; max_slots as after."""
    key = {"ts": ts, "interval_ns": interval_ns, "mount": mount, "server": server}
    d = delta(before, after)
    ops = [{**key, "op": op, **{k.replace("_ms", "_ns"): v * MS if k.endswith("_ms") else v for k, v in c.items()}}
           for op, c in d["ops"].items()]
    xprts = []
    for i, x in enumerate(after["xprt"]):
        old = before["xprt"][i] if i < len(before["xprt"]) else {}
        row = {**key, "xprt": i, "srcport": x["srcport"], "max_slots": x["max_slots"]}
        for k in ("connect_count", "sends", "recvs", "bad_xids", "req_u", "bklog_u", "sending_u", "pending_u"):
            row[k] = x[k] - old.get(k, 0)
        xprts.append(row)
    return ops, xprts


_ISO = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?")


def stamp(line: str) -> int | None:
    """UTC ns of a timestamp line (`date +%s.%N`, or ISO 8601 as `date -Ins` writes it; without
    a zone it is UTC), None when the line is not one."""
    line = line.strip()
    if re.fullmatch(r"\d+(\.\d+)?", line):
        whole, _, frac = line.partition(".")
        return int(whole) * 1_000_000_000 + int((frac + "000000000")[:9])
    m = _ISO.fullmatch(line)
    if not m:
        return None
    zone = m.group(3) or "Z"
    base = utc_ns(m.group(1).replace(" ", "T") + (zone if ":" in zone or zone == "Z" else zone[:3] + ":" + zone[3:]))
    return base + int(((m.group(2) or "") + "000000000")[:9])


def snapshots(text: str) -> list[tuple[int, str]]:
    """(UTC ns, mountstats text) of each copy in a file of copies each headed by a timestamp line."""
    out: list[tuple[int, list[str]]] = []
    for line in text.splitlines():
        t = stamp(line) if line and not line[0].isspace() and not line.startswith("device ") else None
        if t is not None:
            out.append((t, []))
        elif out:
            out[-1][1].append(line)
    return [(t, "\n".join(lines)) for t, lines in out]
