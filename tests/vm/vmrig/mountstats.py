"""Parse /proc/self/mountstats for one NFS mount: per-op counters and transports."""

OP_FIELDS = ("ops", "ntrans", "timeouts", "bytes_sent", "bytes_recv", "queue_ms", "rtt_ms",
             "execute_ms", "errors")
# "xprt: tcp ..." after the protocol name (net/sunrpc/xprtsock.c, xs_tcp_print_stats)
# "bytes:" (fs/nfs/iostat.h): through the page cache, O_DIRECT, and what READ/WRITE RPCs moved
BYTES_FIELDS = ("normal_read", "normal_write", "direct_read", "direct_write", "server_read", "server_write",
                "read_pages", "write_pages")
TCP_FIELDS = ("srcport", "bind_count", "connect_count", "connect_time", "idle_time", "sends",
              "recvs", "bad_xids", "req_u", "bklog_u", "max_slots", "sending_u", "pending_u")


def parse(text, mountpoint="/mnt/nfs"):
    ops, xprts, nbytes, inside = {}, [], {}, False
    for line in text.splitlines():
        if line.startswith("device "):
            inside = f" mounted on {mountpoint} " in line
            continue
        if not inside:
            continue
        parts = line.split()
        if parts and parts[0] == "bytes:":
            nbytes = dict(zip(BYTES_FIELDS, map(int, parts[1:])))
        elif parts and parts[0] == "xprt:" and parts[1] == "tcp":
            xprts.append(dict(zip(TCP_FIELDS, map(int, parts[2:]))))
        elif parts and parts[0].endswith(":") and parts[0][:-1].isupper() and parts[1:] \
                and all(p.isdigit() for p in parts[1:]):
            ops[parts[0][:-1]] = dict(zip(OP_FIELDS, map(int, parts[1:])))
    if not ops:
        raise ValueError(f"no NFS mount on {mountpoint} in mountstats")
    return {"ops": ops, "xprt": xprts, "bytes": nbytes}


def delta(before, after):
    """Counter differences per op; transports as they are after (max_slots is a
    high-water mark, so only the after value means anything)."""
    ops = {name: {k: v - before["ops"].get(name, {}).get(k, 0) for k, v in c.items()}
           for name, c in after["ops"].items()}
    xprt_lines = [" ".join(f"{k}={x[k]}" for k in ("sends", "recvs", "max_slots", "req_u", "bklog_u"))
                  for x in after["xprt"]]
    return {"ops": ops, "xprt_lines": xprt_lines}


def describe(op):
    n = max(op["ops"], 1)
    return (f"ops={op['ops']} ntrans={op['ntrans']} timeouts={op['timeouts']} "
            f"bytes_sent={op['bytes_sent']} backlog(queue)={op['queue_ms']} ms "
            f"(avg {op['queue_ms'] / n:.1f}) rtt={op['rtt_ms']} ms (avg {op['rtt_ms'] / n:.1f}) "
            f"execute={op['execute_ms']} ms (avg {op['execute_ms'] / n:.1f})")


# the capture's per-RPC sums (rpc table, µs) against mountstats' per-op ones (ms)
SUMS = (("backlog_us", "queue_ms"), ("rtt_us", "rtt_ms"), ("execute_us", "execute_ms"))


def per_proc(rpc):
    """procname -> the rpc table's summed kernel accounting over its completed attempts
    (`<column>_sum`: attempts, backlog_us, rtt_us, execute_us, slot_wait_ns)."""
    import pyarrow.compute as pc     # here: run-scenario imports this module without the venv
    done = rpc.filter(pc.equal(rpc["complete"], 1))
    g = done.group_by("procname").aggregate([(c, "sum") for c in ("attempts", *(ours for ours, _ in SUMS),
                                                                  "slot_wait_ns")])
    return {r["procname"]: r for r in g.to_pylist()}


def fidelity(out):
    """The capture of scenario results `out` against the mountstats delta over it: per procedure
    mountstats counted, {"ops": (ours, theirs), "queue_ms": ..., "rtt_ms": ..., "execute_ms": ...}
    (ours None where the capture has none of it), and the bytes WRITEs carried, (ours, theirs)."""
    import pyarrow.compute as pc

    from slotscope.capture.reader import Capture
    before = parse((out / "mountstats.before").read_text())
    after = parse((out / "mountstats.after").read_text())
    want = {name: w for name, w in delta(before, after)["ops"].items() if w["ops"] > 0}
    rpc = Capture.open(str(out / "capture")).read("rpc")
    got = per_proc(rpc)
    procs = {}
    for name, w in want.items():
        mine = got.get(name)
        procs[name] = {"ops": (mine and mine["attempts_sum"], w["ops"]),
                       **{theirs: (mine and mine[f"{ours}_sum"] / 1000, w[theirs]) for ours, theirs in SUMS}}
    writes = rpc.filter(pc.and_(pc.equal(rpc["procname"], "WRITE"), pc.equal(rpc["complete"], 1)))
    sent = pc.sum(writes["io_count"]).as_py() or 0
    return {"procs": procs, "write_bytes": (sent, after["bytes"]["server_write"] - before["bytes"]["server_write"])}


def worst_sum_error(fid):
    """The largest relative difference of a summed time, over procedures (mountstats' ms rounding
    makes a small sum's error large: those within 1 ms are taken as equal)."""
    errors = [abs(ours - theirs) / theirs for p in fid["procs"].values() for key, (ours, theirs) in p.items()
              if key != "ops" and ours is not None and theirs and abs(ours - theirs) > 1]
    return max(errors, default=0.0)
