"""When each process of a sampled capture (record --no-bpf) wrote and waited, from what /proc
gives every interval: /proc/PID/io's write_bytes (what the process dirtied or wrote through to
storage: its NFS writes, buffered or O_DIRECT, and those to any other filesystem) and the
thread samples (where each thread was). The rank table (ranks.rank_table) and the saves
(saves.find_saves) of a sampled capture are made of it, as a BPF capture's are of its syscalls.

What BPF measures per call is estimated here: a process's time blocked is its samples in a
wait on NFS times the interval; its activity runs from the sample before its write_bytes
first grew to its last sample that saw growth or an NFS wait. So its times are good to an
interval, and a process that lived less than one is not seen at all.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import FLUSH_SYSCALLS, WRITE_SYSCALLS

from .job import Job
from .waits import NFS_WAITS, wait_kind

S = 1_000_000_000
WRITING_CALLS = WRITE_SYSCALLS + FLUSH_SYSCALLS     # a thread sampled in one of these names the file it writes


def interval_ns(job: Job) -> int | None:
    """The sampling interval of the job's sampled captures (the shortest); None: none is sampled."""
    every = [int(c.meta["sampled"].get("interval_ns") or S // 10) for c in job.captures if "sampled" in c.meta]
    return min(every) if every else None


def growth(job: Job) -> pa.Table | None:
    """Each interval in which a process's write_bytes grew: host, tgid, `since` and `ts` (UTC ns:
    the process's previous sample and this one) and `bytes` (the growth). A process first seen
    after the capture's first sample was born in it: its first counters are growth too. A child's
    bytes that its parent gains when it reaps it are the child's (_less_reaped). In a
    window of the capture (analysis.between), the rows before it are the baseline (job.UNWINDOWED)."""
    return job.memo("sampled_growth", lambda: _growth(job))


def _growth(job: Job) -> pa.Table | None:
    io = job.table("proc_io")
    if io is None or not io.num_rows:
        return None
    io = io.select(["host", "tgid", "ts", "write_bytes"])
    io = io.set_column(2, "ts", job.to_utc(io["host"], io["ts"])).sort_by(
        [("host", "ascending"), ("tgid", "ascending"), ("ts", "ascending")])
    hosts = pc.dictionary_encode(io["host"]).combine_chunks()
    host = hosts.indices.to_numpy().astype(np.int64)
    tgid = io["tgid"].to_numpy().astype(np.int64)
    ts = io["ts"].to_numpy()
    wb = pc.fill_null(io["write_bytes"], 0).to_numpy()
    first = np.r_[True, (host[1:] != host[:-1]) | (tgid[1:] != tgid[:-1])]
    born = ts > _first_ticks(job, hosts.dictionary.to_pylist())[host]   # a new process's counters are read at once
    delta = np.where(first, np.where(born, wb, 0), wb - np.r_[0, wb[:-1]])
    _less_reaped(job, io["host"].to_pylist(), tgid, ts, wb, first, delta)
    since = np.where(first, ts - interval_ns(job), np.r_[0, ts[:-1]])
    keep = (delta > 0) & (ts > _window_start(job))
    return pa.table({"host": io["host"].filter(pa.array(keep)), "tgid": io["tgid"].filter(pa.array(keep)),
                     "since": since[keep], "ts": ts[keep], "bytes": delta[keep]})


def _less_reaped(job: Job, hosts: list, tgid: np.ndarray, ts: np.ndarray, wb: np.ndarray, first: np.ndarray,
                 delta: np.ndarray) -> None:
    """Take from each parent's growth (`delta`, in place) the bytes of the children it reaped: the
    kernel adds a reaped child's I/O counters to its parent's (wait_task_zombie), so a launcher's
    /proc/PID/io grows by its ranks' bytes when they exit. A child's last sampled total is taken
    from its parent's growth after that sample, first interval first; what the child wrote after
    its last sample stays with the parent (that is not told apart from the parent's own)."""
    idents = job.identities()
    if idents is None:
        return
    parent_of = {(h, t): p for h, t, p in zip(idents["host"].to_pylist(), idents["tgid"].to_pylist(),
                                              idents["ppid"].to_pylist())}
    rows: dict[tuple, list[int]] = {}           # (host, tgid) -> its row indices, in time order
    for i, key in enumerate(zip(hosts, tgid.tolist())):
        rows.setdefault(key, []).append(i)
    debts: dict[tuple, list[tuple[int, int]]] = {}     # parent -> [(child's last sample, its total)]
    for (host, child), mine in rows.items():
        parent = (host, parent_of.get((host, child)))
        if parent in rows:
            debts.setdefault(parent, []).append((int(ts[mine[-1]]), int(wb[mine[-1]])))
    for parent, owed in debts.items():
        owed.sort()
        for i in rows[parent]:
            for k, (seen, left) in enumerate(owed):
                if seen < ts[i] and left and not first[i]:
                    took = min(left, int(delta[i]))
                    delta[i] -= took
                    owed[k] = (seen, left - took)


def _window_start(job: Job) -> int:
    """Where the job's window begins (UTC ns; the lowest int64 for whole captures)."""
    return max((c.since_utc for c in job.captures if not c.whole and c.since_utc is not None),
               default=np.iinfo(np.int64).min)


# Written from the sampler's first tick on: mountstats' transports every tick, the rest where the
# job has processes. A job's processes that started after the agent are first seen in a later tick.
TICKED = ("ms_xprt", "ms_ops", "thread_samples", "proc_io")


def _first_ticks(job: Job, hosts: list[str]) -> np.ndarray:
    """Per host of `hosts`, its first sample (UTC ns): the earliest row of any sampled table
    (proc_io alone would put it at the first process's first sample, whose counters would then
    be taken for a baseline: the VM rig's ranks, started after the agent, lost their first 48
    KiB so)."""
    first: dict[str, int] = {}
    for name in TICKED:
        t = job.table(name)
        if t is None or not t.num_rows:
            continue
        utc = job.to_utc(t["host"], t["ts"])
        for part in pa.table({"host": t["host"], "ts": utc}).group_by("host").aggregate([("ts", "min")]).to_pylist():
            first[part["host"]] = min(first.get(part["host"], part["ts_min"]), part["ts_min"])
    return np.array([first[h] for h in hosts], np.int64)


def nfs_waits(job: Job) -> pa.Table | None:
    """The thread samples that found a thread waiting on NFS (waits.NFS_WAITS), UTC times,
    with `flush`: the sample was in close/fsync."""
    return job.memo("sampled_nfs_waits", lambda: _nfs_waits(job))


def _nfs_waits(job: Job) -> pa.Table | None:
    t = job.table("thread_samples")
    if t is None or not t.num_rows:
        return None
    t = t.select(["host", "tgid", "tid", "ts", "state", "wchan", "syscall", "path"])
    # one wait_kind() per distinct (state, wchan): the rows are many, the pairs few
    pairs = pc.binary_join_element_wise(pc.fill_null(t["state"], ""), pc.fill_null(t["wchan"], ""), "\0")
    enc = pc.dictionary_encode(pairs).combine_chunks()
    on_nfs = np.array([wait_kind(*(p.split("\0") if p else ("", ""))) in NFS_WAITS
                       for p in enc.dictionary.to_pylist()], bool)
    t = t.filter(pa.array(on_nfs[enc.indices.to_numpy()] if len(on_nfs) else np.zeros(t.num_rows, bool)))
    t = t.set_column(3, "ts", job.to_utc(t["host"], t["ts"]))
    return t.append_column("flush", pc.fill_null(pc.is_in(t["syscall"], pa.array(FLUSH_SYSCALLS)), False))


def file_samples(job: Job) -> pa.Table | None:
    """The thread samples that named a file the thread was writing, closing or syncing (those
    the recording's --path/--fs select): host, ts (UTC ns), path."""
    t = job.table("thread_samples")
    if t is None or not t.num_rows:
        return None
    t = t.select(["host", "ts", "syscall", "path"])
    t = t.filter(pc.and_(pc.is_valid(t["path"]), pc.is_in(t["syscall"], pa.array(WRITING_CALLS))))
    if not t.num_rows:
        return None
    return pa.table({"host": t["host"], "ts": job.to_utc(t["host"], t["ts"]), "path": t["path"]})


def per_process(job: Job) -> pa.Table | None:
    """Per (host, tgid) that wrote or waited on NFS: `start_ns`, `end_ns` (UTC), `bytes`,
    `blocked_ns` and `flush_ns` (samples in an NFS wait, in close/fsync, times the interval)."""
    every = interval_ns(job)
    if every is None:
        return None
    parts = []
    grew = growth(job)
    if grew is not None:
        parts.append(pa.table({"host": grew["host"], "tgid": grew["tgid"], "start": grew["since"],
                               "end": grew["ts"], "bytes": grew["bytes"],
                               "blocked": pa.array(np.zeros(grew.num_rows, np.int64)),
                               "flushing": pa.array(np.zeros(grew.num_rows, np.int64))}))
    waits = nfs_waits(job)
    if waits is not None and waits.num_rows:
        zero = pa.array(np.zeros(waits.num_rows, np.int64))
        parts.append(pa.table({"host": waits["host"], "tgid": waits["tgid"], "start": waits["ts"], "end": waits["ts"],
                               "bytes": zero, "blocked": pa.array(np.full(waits.num_rows, every, np.int64)),
                               "flushing": pc.multiply(pc.cast(waits["flush"], pa.int64()), every)}))
    if not parts:
        return None
    g = pa.concat_tables(parts).group_by(["host", "tgid"]).aggregate(
        [("start", "min"), ("end", "max"), ("bytes", "sum"), ("blocked", "sum"), ("flushing", "sum")])
    return g.rename_columns({"start_min": "start_ns", "end_max": "end_ns", "bytes_sum": "bytes",
                             "blocked_sum": "blocked_ns", "flushing_sum": "flush_ns"})


def waiting_at_last_sample(job: Job) -> pa.Table | None:
    """The threads each host's last sample found waiting on NFS: host, tgid, tid, syscall, path,
    ts (UTC ns) and age_ns, how long it had been seen in that call: since the first of its
    consecutive samples in it, plus the interval before that one (when it began is not seen).
    Successive calls of one syscall that each wait look like one call to samples: age_ns is then
    theirs together."""
    waits = nfs_waits(job)
    if waits is None or not waits.num_rows:
        return None
    ends = job.table("thread_samples").select(["host", "ts"]).group_by("host").aggregate([("ts", "max")])
    last = dict(zip(ends["host"].to_pylist(), job.to_utc(ends["host"], ends["ts_max"]).to_pylist()))
    at_end = waits.filter(pa.array([ts == last[h] for h, ts in zip(waits["host"].to_pylist(), waits["ts"].to_pylist())]))
    every = interval_ns(job)
    ages = []
    for row in at_end.select(["host", "tid", "syscall", "ts"]).to_pylist():
        mine = waits.filter(pc.and_(pc.equal(waits["tid"], row["tid"]), pc.equal(waits["host"], row["host"])))
        ts = np.sort(mine.filter(pc.equal(pc.fill_null(mine["syscall"], ""), row["syscall"] or ""))["ts"].to_numpy())
        # the run of samples that ends at the last one, none more than an interval and a half apart
        gaps = np.flatnonzero(np.diff(ts) > every * 3 // 2)
        ages.append(int(row["ts"] - (ts[gaps[-1] + 1] if gaps.size else ts[0]) + every))
    if not at_end.num_rows:
        return None
    return at_end.select(["host", "tgid", "tid", "syscall", "path", "ts"]).append_column(
        "age_ns", pa.array(ages, pa.int64()))
