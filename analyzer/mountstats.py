"""/proc/self/mountstats, the kernel's own per-op NFS counters: what the agent stores in
meta.json at start and stop, and their difference, against which a capture is checked."""
from __future__ import annotations

OP_FIELDS = ("ops", "ntrans", "timeouts", "bytes_sent", "bytes_recv", "queue_ms", "rtt_ms",
             "execute_ms", "errors")
# "xprt: tcp ..." after the protocol name (net/sunrpc/xprtsock.c, xs_tcp_print_stats)
TCP_FIELDS = ("srcport", "bind_count", "connect_count", "connect_time", "idle_time", "sends",
              "recvs", "bad_xids", "req_u", "bklog_u", "max_slots", "sending_u", "pending_u")


def _count(word: str) -> bool:
    return word.isascii() and word.isdigit()      # what int() reads (not "²", a digit to isdigit)


def parse_section(text: str) -> dict:
    """One mount's section: {"ops": {op: {field: n}}, "xprt": [{field: n}]}."""
    ops, xprts = {}, []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] == "xprt:" and parts[1] == "tcp" and all(map(_count, parts[2:])):
            xprts.append(dict(zip(TCP_FIELDS, map(int, parts[2:]))))
        elif parts and parts[0].endswith(":") and parts[0][:-1].isupper() and parts[1:] \
                and all(map(_count, parts[1:])):
            ops[parts[0][:-1]] = dict(zip(OP_FIELDS, map(int, parts[1:])))
    return {"ops": ops, "xprt": xprts}


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
