"""The saves in a recording. A training job saves every few hundred steps, so one recording
holds several saves: each a burst of file events on the files the job writes (their opens,
writes, syncs and closes, and the directories made and files renamed beside them), apart
from the next burst by at least the save_gap_s threshold without any. A burst that wrote
nothing (a directory made before the planning of a save) belongs to the save after it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotscope.capture.syscalls import (FLUSH_SYSCALLS, MKDIR_SYSCALLS, OPEN_SYSCALLS, RENAME_SYSCALLS,
                                        WRITE_SYSCALLS)

from . import sampled_activity
from .checkpoints import describe
from .job import Job, between
from .units import ms, seconds, size

# Calls on a written file that belong to its save, and the namespace calls beside them.
FILE_CALLS = WRITE_SYSCALLS + FLUSH_SYSCALLS + OPEN_SYSCALLS + ("ftruncate",)
COLUMNS = ["host", "tgid", "syscall", "path", "path2", "dev", "ino", "bytes", "errno", "ts_enter", "ts_exit"]


@dataclass
class Save:
    number: int                 # 1, 2, ... in time order
    start_ns: int               # UTC: the first file event's entry
    end_ns: int                 # UTC: the last one's return
    first_write_ns: int         # UTC: the first write's entry (DCP plans with collectives before it)
    bytes: int
    files: dict[str, int]       # final path (after renames) -> bytes written to it
    renamed: int                # files written under another name and renamed
    directory: str | None       # the deepest directory holding every file
    what: dict                  # checkpoints.describe()

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def file_events(job: Job) -> pa.Table | None:
    """The calls saves are made of, with UTC times, in time order."""
    sc = job.table("syscall")
    if sc is None:
        return None
    sc = sc.select(COLUMNS)
    sc = sc.set_column(2, "syscall", pc.cast(sc["syscall"], pa.string()))
    # A file is its inode; a file renamed before the agent read its inode (DCP's .metadata.tmp,
    # safetensors' temporary file) is its path.
    sc = sc.append_column("file", pc.if_else(pc.is_valid(sc["ino"]), pc.cast(sc["ino"], pa.string()),
                                             pc.binary_join_element_wise("path ", sc["path"], "")))
    wrote = sc.filter(pc.fill_null(pc.greater(sc["bytes"], 0), False))
    if wrote.num_rows == 0:
        return None
    written = wrote.group_by(["host", "dev", "file"]).aggregate([])
    on_written = sc.filter(pc.is_in(sc["syscall"], pa.array(FILE_CALLS))).join(
        written, keys=["host", "dev", "file"], join_type="left semi")
    namespace = sc.filter(pc.and_(pc.is_in(sc["syscall"], pa.array(MKDIR_SYSCALLS + RENAME_SYSCALLS)),
                                  pc.equal(pc.fill_null(sc["errno"], 0), 0)))
    ev = pa.concat_tables([on_written, namespace])
    for col in ("ts_enter", "ts_exit"):
        ev = ev.append_column(f"{col}_utc", job.to_utc(ev["host"], ev[col]))
    return ev.sort_by("ts_enter_utc")


def burst_numbers(enter: np.ndarray, exit_: np.ndarray, gap_ns: int) -> np.ndarray:
    """For events sorted by entry, the number (0, 1, ...) of the burst each belongs to: a new
    burst starts at an event that enters gap_ns after every earlier one has returned (a
    call blocked through a pause keeps its burst open)."""
    if len(enter) == 0:
        return np.zeros(0, np.int64)
    returned = np.maximum.accumulate(exit_)
    starts = np.concatenate([[False], enter[1:] > returned[:-1] + gap_ns])
    return np.cumsum(starts)


def find_saves(job: Job, gap_s: float) -> list[Save]:
    ev = file_events(job)
    if ev is None:
        return _sampled_saves(job, gap_s)
    enter = ev["ts_enter_utc"].to_numpy()
    burst = _saves_of_bursts(burst_numbers(enter, ev["ts_exit_utc"].to_numpy(), int(gap_s * 1e9)),
                             pc.fill_null(ev["bytes"], 0).to_numpy())
    ev = ev.append_column("save", pa.array(burst))
    return [_save(number, ev.filter(pc.equal(ev["save"], idx))) for number, idx in enumerate(np.unique(burst), 1)]


def predicted_part(job: Job, gap_s: float) -> Job:
    """The part of a recording that a prediction is made for and checked against (whatif and
    compare; analyze's fixes take the same, from its analysis of each save): its slowest save
    when it holds several, whose pauses the whole recording's span would count; else the whole
    recording."""
    saves = find_saves(job, gap_s)
    if len(saves) < 2:
        return job
    slowest = max(saves, key=lambda s: s.seconds)
    return between(job, slowest.start_ns, slowest.end_ns)


def _saves_of_bursts(burst: np.ndarray, wrote: np.ndarray) -> np.ndarray:
    """Each event's save, the burst_numbers() of the bursts that wrote: a burst that wrote
    nothing joins the next (the last one's goes to the one before)."""
    totals = np.bincount(burst, weights=wrote)
    keep = np.flatnonzero(totals > 0)
    if not keep.size:
        return np.zeros(0, np.int64)
    target = keep[np.minimum(np.searchsorted(keep, np.arange(len(totals))), len(keep) - 1)]
    return target[burst]


def _sampled_saves(job: Job, gap_s: float) -> list[Save]:
    """A sampled capture's saves: bursts of the intervals in which its processes' write_bytes
    grew, with the files its samples found them writing, closing or syncing (sampled_activity.py:
    each file's own bytes are not known, nor renames)."""
    grew, named = sampled_activity.growth(job), sampled_activity.file_samples(job)
    if grew is None:
        return []
    n = named.num_rows if named is not None else 0
    enter = np.r_[grew["since"].to_numpy(), named["ts"].to_numpy() if n else []].astype(np.int64)
    leave = np.r_[grew["ts"].to_numpy(), named["ts"].to_numpy() if n else []].astype(np.int64)
    wrote = np.r_[grew["bytes"].to_numpy(), np.zeros(n, np.int64)]
    paths = [None] * grew.num_rows + (named["path"].to_pylist() if n else [])
    order = np.argsort(enter, kind="stable")
    enter, leave, wrote = enter[order], leave[order], wrote[order]
    burst = _saves_of_bursts(burst_numbers(enter, leave, int(gap_s * 1e9)), wrote)
    saves = []
    for number, idx in enumerate(np.unique(burst), 1):
        mine = burst == idx
        files = dict.fromkeys(sorted({paths[i] for i in order[mine] if paths[i]}), 0)
        directory = _directory(files)
        saves.append(Save(number=number, start_ns=int(enter[mine].min()), end_ns=int(leave[mine].max()),
                          first_write_ns=int(enter[mine & (wrote > 0)].min()), bytes=int(wrote[mine].sum()),
                          files=files, renamed=0, directory=directory, what=describe(list(files), directory)))
    return saves


def _save(number: int, rows: pa.Table) -> Save:
    renames = {r["path"]: r["path2"] for r in rows.filter(pc.is_in(rows["syscall"], pa.array(RENAME_SYSCALLS)))
               .select(["path", "path2"]).to_pylist() if r["path"] and r["path2"]}
    per_file = rows.filter(pc.fill_null(pc.greater(rows["bytes"], 0), False)).group_by(
        ["host", "dev", "file"]).aggregate([("bytes", "sum"), ("path", "max")])
    files, renamed = {}, 0
    for f in per_file.to_pylist():
        path = f["path_max"] or f"inode {f['file']}"
        seen = {path}
        while path in renames and renames[path] not in seen:     # a.tmp -> a, and chains of them
            path = renames[path]
            seen.add(path)
        renamed += len(seen) > 1
        files[path] = files.get(path, 0) + f["bytes_sum"]
    directory = _directory(files)
    writes = rows.filter(pc.is_in(rows["syscall"], pa.array(WRITE_SYSCALLS)))
    return Save(number=number, start_ns=pc.min(rows["ts_enter_utc"]).as_py(),
                end_ns=pc.max(rows["ts_exit_utc"]).as_py(), first_write_ns=pc.min(writes["ts_enter_utc"]).as_py(),
                bytes=sum(files.values()), files=files,
                renamed=renamed, directory=directory, what=describe(sorted(files), directory))


def _directory(files: dict[str, int]) -> str | None:
    """The deepest directory holding every file of a save (None when none has an absolute path)."""
    dirs = [os.path.dirname(p) for p in files if p.startswith("/")]
    return os.path.commonpath(dirs) if dirs else None


# What trend() compares between the first save and a slower one: (key, what it is, formatter).
TREND_MEASURES = (
    ("bytes", "bytes written", size),
    ("before_first_write_ns", "time before the first write", lambda v: seconds(v, unit=True)),
    ("write_execute_ns", "mean WRITE RPC time", lambda v: f"{ms(v)} ms"),
    ("slot_wait_ns", "slot wait", lambda v: seconds(v, unit=True)),
    ("flush_ns", "time in close/fsync", lambda v: seconds(v, unit=True)),
)
SLOWER = 1.25       # a save this many times as long as the first is slower, and so is a measure


def trend(saves: list[dict]) -> dict | None:
    """Across a recording's saves (save_report() dicts): how the slowest compares with the
    fastest, and which measures grew with it."""
    if len(saves) < 2:
        return None
    fastest = min(saves, key=lambda s: s["duration_s"])
    slowest = max(saves, key=lambda s: s["duration_s"])
    ratio = slowest["duration_s"] / fastest["duration_s"] if fastest["duration_s"] else None
    out = {"durations_s": [round(s["duration_s"], 3) for s in saves], "fastest": fastest["number"],
           "slowest": slowest["number"], "ratio": ratio, "changed": []}
    if ratio is None or ratio < SLOWER:
        out["text"] = (f"{len(saves)} saves of {min(out['durations_s']):.2f}-{max(out['durations_s']):.2f} s: "
                       "none slower than another by more than a quarter")
        return out
    for key, label, fmt in TREND_MEASURES:
        a, b = fastest.get(key), slowest.get(key)
        # what grew with the time (not what shrank), by more than the figures' last digit
        if a and b and b / a >= SLOWER and fmt(a) != fmt(b):
            out["changed"].append({"measure": key, "fastest": a, "slowest": b,
                                   "text": f"{label} {fmt(b)} against {fmt(a)}"})
    why = [c["text"] for c in out["changed"]]
    if slowest["verdict"] != fastest["verdict"]:
        why.insert(0, f"verdict {slowest['verdict']} against {fastest['verdict']}")
    out["text"] = (f"save {slowest['number']} took {ratio:.1f}x as long as save {fastest['number']} "
                   f"({slowest['duration_s']:.2f} s against {fastest['duration_s']:.2f} s)"
                   + (": " + "; ".join(why) if why else ": nothing traced changed as much; the time went "
                      "outside the traced calls (the job's own computing or collectives)"))
    return out


class SaveClock:
    """Saves as they happen, for `watch --trigger slow_save`: fed the `syscall` rows of each
    drain in turn (monotonic ns), it says when a save ends and how long each took. A save is a
    burst of the calls saves are made of (FILE_CALLS, returned), apart from the next by gap_s
    without any (burst_numbers' rule, carried across batches); a burst that wrote nothing is
    not one. Unlike find_saves it cannot wait to see which files were written, so a file
    only read in the same burst counts too."""

    def __init__(self, gap_s: float):
        self.gap_ns = int(gap_s * 1e9)
        self.durations_s: list[float] = []     # of every save ended so far, in order
        self._start = self._returned = None    # of the burst going on
        self._wrote = 0

    def feed(self, rows: pa.Table | None, now_ns: int) -> bool:
        """-> whether a save ended with these rows or by now (gap_s after its last call)."""
        if rows is not None and rows.num_rows:
            calls = rows.filter(pc.is_in(pc.cast(rows["syscall"], pa.string()), pa.array(FILE_CALLS)))
            if calls.num_rows:
                calls = calls.sort_by("ts_enter")
                enter, exit_ = calls["ts_enter"].to_numpy(), calls["ts_exit"].to_numpy()
                wrote = pc.fill_null(calls["bytes"], 0).to_numpy()
                if self._start is not None:     # the burst going on, as the batch's first event
                    enter = np.concatenate([[self._start], enter])
                    exit_ = np.concatenate([[self._returned], exit_])
                    wrote = np.concatenate([[self._wrote], wrote])
                burst = burst_numbers(enter, exit_, self.gap_ns)
                ended = False
                for b in range(int(burst[-1]) + 1):
                    mine = burst == b
                    if b < burst[-1]:
                        ended |= self._end(int(enter[mine][0]), int(exit_[mine].max()), int(wrote[mine].sum()))
                    else:
                        self._start, self._returned, self._wrote = (int(enter[mine][0]), int(exit_[mine].max()),
                                                                    int(wrote[mine].sum()))
                return self._timed_out(now_ns) or ended
        return self._timed_out(now_ns)

    def _timed_out(self, now_ns: int) -> bool:
        if self._start is None or now_ns - self._returned < self.gap_ns:
            return False
        start, returned, wrote = self._start, self._returned, self._wrote
        self._start = self._returned = None
        return self._end(start, returned, wrote)

    def _end(self, start: int, returned: int, wrote: int) -> bool:
        if wrote > 0:
            self.durations_s.append((returned - start) / 1e9)
        return wrote > 0
