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
