"""/proc/self/mountstats, the kernel's own per-op NFS counters, parsed: for meta.json's copies at
start and stop (the analyzer checks a capture against their difference) and for the sampled
mode, which reads it every interval."""
from __future__ import annotations

OP_FIELDS = ("ops", "ntrans", "timeouts", "bytes_sent", "bytes_recv", "queue_ms", "rtt_ms",
             "execute_ms", "errors")
# "xprt: tcp ..." after the protocol name (net/sunrpc/xprtsock.c, xs_tcp_print_stats)
TCP_FIELDS = ("srcport", "bind_count", "connect_count", "connect_time", "idle_time", "sends",
              "recvs", "bad_xids", "req_u", "bklog_u", "max_slots", "sending_u", "pending_u")


def _count(word: str) -> bool:
    return word.isascii() and word.isdigit()      # what int() reads (not "²", a digit to isdigit)


def nfs_sections(text: str) -> dict[str, str]:
    """mountpoint -> its section (the "device" line and what follows), for the NFS mounts of a
    whole mountstats text."""
    out, point = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("device "):
            words = line.split()
            point = words[4] if len(words) >= 8 and words[7].startswith("nfs") else None
            if point:
                out[point] = line
        elif point:
            out[point] += line
    return out


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


MS = 1_000_000      # mountstats counts times in whole ms
# The transport counters that are running totals (the rest are the port and a high-water mark).
XPRT_COUNTERS = ("connect_count", "sends", "recvs", "bad_xids", "req_u", "bklog_u", "sending_u", "pending_u")


def went_back(before: dict, after: dict) -> bool:
    """Whether an op's counters are lower than before: a remount at the same point (a new baseline)."""
    return any(now[k] < before["ops"].get(op, now).get(k, 0) for op, now in after["ops"].items() for k in now)


def interval_rows(before: dict, after: dict, ts: int, interval_ns: int, mount: str,
                  server: str) -> tuple[list[dict], list[dict]]:
    """One mount's rows of the ms_ops and ms_xprt tables for the interval between two
    parse_section()s ending at ts: counter deltas, times in ns, max_slots as after. An op gets a
    row when its counters moved (no row: nothing happened); a transport (matched by its place in
    the list) every interval, an interval with sends and no receives being an answer in itself,
    unless its counters went back or it has no predecessor."""
    key = {"ts": ts, "interval_ns": interval_ns, "mount": mount, "server": server}
    ops = []
    for op, now in after["ops"].items():
        then = before["ops"].get(op, {})
        d = {k: now[k] - then.get(k, 0) for k in now}    # older kernels count no errors: 8 fields
        if any(d.values()):
            ops.append({**key, "op": op, **{k[:-3] + "_ns" if k.endswith("_ms") else k: v * MS if k.endswith("_ms")
                                            else v for k, v in d.items()}})
    xprts = []
    for n, (then, now) in enumerate(zip(before["xprt"], after["xprt"])):
        d = {k: now[k] - then[k] for k in XPRT_COUNTERS}
        if min(d.values()) >= 0:
            xprts.append({**key, "xprt": n, "srcport": now["srcport"], "max_slots": now["max_slots"], **d})
    return ops, xprts
