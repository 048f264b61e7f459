"""The decoder across batches: a process's last calls may be read a batch after its exit."""
from __future__ import annotations

import os
import socket
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pytest

from slotscope.agent.decode import Decoder
from slotscope.agent.files import FileFilter, FileRegistry
from slotscope.agent.identity import Identities
from slotscope.agent.layouts import PATH_EVENT, PROC_EVENT, PROC_EXIT, SYS_EVENT
from slotscope.capture.syscalls import OP_NUMBER

pytestmark = pytest.mark.unit

O_WRONLY_CREAT_TRUNC = 0o1101
AT_FDCWD = -100


def _gone_pid() -> int:
    """A tgid no process holds now (a reaped child's): /proc cannot name its fds."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _sys(rows: list[dict]) -> np.ndarray:
    out = np.zeros(len(rows), SYS_EVENT.dtype)
    for i, row in enumerate(rows):
        for name, value in row.items():
            out[name][i] = value
    return out


def _call(tgid: int, t: int, op: str, fd: int, ret: int, **more) -> dict:
    return {"ts_enter": t, "ts_exit": t + 10, "tid": tgid, "tgid": tgid, "op": OP_NUMBER[op], "fd": fd,
            "fd2": -1, "ret": ret, "offset": -1, **more}


def _path(tgid: int, t: int, path: str) -> np.ndarray:
    out = np.zeros(1, PATH_EVENT.dtype)
    out["ts_enter"], out["tid"], out["len"], out["path"] = t, tgid, len(path) + 1, path.encode()
    return out


def _exit(tgid: int, t: int) -> np.ndarray:
    out = np.zeros(1, PROC_EVENT.dtype)
    out["ts"], out["tid"], out["tgid"], out["ptid"], out["kind"] = t, tgid, tgid, tgid, PROC_EXIT
    return out


@pytest.mark.parametrize("stopped_short", [False, True])
def test_a_write_read_after_its_process_exit_is_still_named(tmp_path, stopped_short):
    """`sh -c 'echo x > f'` as dash runs it: open f as 3, dup2 onto 1, close 3, write 1, exit.
    The batch that sees the exit holds the calls up to the close; the write comes in the next
    batch (committed before the exit was read, after the syscall ring's position was taken),
    or in the one after that when the next batch stopped short of it (`caught_up` false)."""
    f = tmp_path / "f"
    f.write_text("x\n")
    tgid = _gone_pid()
    dec = Decoder(FileRegistry(FileFilter(prefixes=(str(tmp_path),), fstypes=None)), Identities())
    none = np.empty(0, PATH_EVENT.dtype), np.empty(0, PROC_EVENT.dtype)
    first = _sys([_call(tgid, 100, "openat", AT_FDCWD, 3, flags=O_WRONLY_CREAT_TRUNC, npaths=1),
                  _call(tgid, 200, "dup2", 3, 1, fd2=1),
                  _call(tgid, 300, "close", 3, 0)])
    dec.feed(first, _path(tgid, 100, str(f)), _exit(tgid, 600))
    if stopped_short:
        assert dec.feed(np.empty(0, SYS_EVENT.dtype), *none, caught_up=False) is None
    rows = dec.feed(_sys([_call(tgid, 400, "write", 1, 2, count=2)]), *none)
    assert rows is not None and rows.column("path").to_pylist() == [str(f)]
    assert rows.column("bytes").to_pylist() == [2]
    assert dec.unnamed == 0
    # Once a caught-up batch followed, the process's fds are forgotten: its pid may be reused.
    assert dec.feed(_sys([_call(tgid, 700, "write", 1, 2, count=2)]), *none) is None


@pytest.mark.timeout(10)   # the bug was an endless loop in the mount lookup
def test_a_path_with_two_leading_slashes_is_the_file_it_names(tmp_path):
    """Linux reads "//x" as "/x" (normpath keeps the two slashes): a file opened so is the traced
    file, named as it is elsewhere."""
    f = tmp_path / "f"
    f.write_text("x\n")
    tgid = _gone_pid()
    dec = Decoder(FileRegistry(FileFilter(prefixes=(str(tmp_path),), fstypes=None)), Identities())
    calls = _sys([_call(tgid, 100, "openat", AT_FDCWD, 3, flags=O_WRONLY_CREAT_TRUNC, npaths=1),
                  _call(tgid, 200, "write", 3, 2, count=2)])
    rows = dec.feed(calls, _path(tgid, 100, "/" + str(f)), np.empty(0, PROC_EVENT.dtype))
    assert rows is not None and rows.column("path").to_pylist() == [str(f)] * 2


def test_a_batch_held_for_seconds_names_a_file_whose_fd_was_reused_twice(tmp_path):
    """A drain that waited seconds for a CPU (behind CPU-bound ranks) decodes one batch holding a
    file's write and two later reuses of its fd, 6 s apart: the batch's fd changes are applied
    before its calls are looked up, and the fd's history must still hold the first file then."""
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_text("x\n")
    tgid = _gone_pid()
    dec = Decoder(FileRegistry(FileFilter(prefixes=(str(tmp_path),), fstypes=None)), Identities())
    s = 1_000_000_000
    calls, paths = [], []
    for i, f in enumerate(files):
        t = i * 6 * s
        calls += [_call(tgid, t, "openat", AT_FDCWD, 3, flags=O_WRONLY_CREAT_TRUNC, npaths=1),
                  _call(tgid, t + s, "write", 3, 2, count=2),
                  _call(tgid, t + 2 * s, "close", 3, 0)]
        paths.append(_path(tgid, t, str(f)))
    rows = dec.feed(_sys(calls), np.concatenate(paths), np.empty(0, PROC_EVENT.dtype))
    writes = rows.filter(pa.compute.equal(rows.column("syscall"), "write"))
    assert writes.column("path").to_pylist() == [str(f) for f in files]
    assert dec.unnamed == 0


def test_pipes_and_sockets_are_skipped_not_counted_as_unnamed_files(tmp_path):
    """A process's pipe from before the recording, and a socket made (by a call not traced) on the
    number of a traced file it closed: neither is a file. Their calls are no rows and no loss, and
    the kernel is told to skip them (a job's gloo sockets and logging pipes would otherwise reach
    the agent call by call). An fd no longer open anywhere stays unnamed."""
    f = tmp_path / "f"
    f.write_text("x\n")
    tgid = os.getpid()      # /proc names this process's fds as they are now
    skipped = []
    dec = Decoder(FileRegistry(FileFilter(prefixes=(str(tmp_path),), fstypes=None)), Identities(),
                  ignore_fd=lambda *fd: skipped.append(fd))
    none = np.empty(0, PATH_EVENT.dtype), np.empty(0, PROC_EVENT.dtype)
    read_end, write_end = os.pipe()
    sock = socket.socket()
    try:
        n = sock.fileno()
        rows = dec.feed(_sys([_call(tgid, 100, "openat", AT_FDCWD, n, flags=O_WRONLY_CREAT_TRUNC, npaths=1),
                              _call(tgid, 200, "write", n, 2, count=2),
                              _call(tgid, 300, "close", n, 0),
                              _call(tgid, 400, "write", n, 5, count=5),
                              _call(tgid, 500, "write", write_end, 3, count=3)]),
                        _path(tgid, 100, str(f)), none[1])
        assert rows.column("syscall").to_pylist() == ["openat", "write", "close"]
        assert rows.column("path").to_pylist() == [str(f)] * 3
        assert dec.unnamed == 0
        assert sorted(skipped) == sorted([(tgid, n, 310), (tgid, write_end, None)])
        dec.feed(_sys([_call(tgid, 600, "write", 999, 1, count=1)]), *none)
        assert dec.unnamed == 1
    finally:
        sock.close()
        os.close(read_end)
        os.close(write_end)
