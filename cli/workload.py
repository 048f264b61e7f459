"""A small checkpoint save, as a training job does it: the demo's workload and the live tests'.

Each rank is a process with RANK, LOCAL_RANK and WORLD_SIZE set. It writes its
shard with write(), its optimizer state with pwrite64(), a header with writev(),
fsyncs and closes. Rank 0 also writes from a second thread (async save) and
rank 1 from a child process whose environment has no rank variables (a writer
subprocess): both must be charged to their rank. What every rank did is written
to a manifest, so a test can compare a capture with the truth.

    python -m slotscope.cli.workload --dir D --ranks N [--manifest F] [--chunk B] [--chunks K]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading

RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


class Tally:
    def __init__(self):
        self.calls: dict[str, int] = {}
        self.bytes = 0
        self.lock = threading.Lock()

    def add(self, name: str, nbytes: int = 0) -> None:
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes += nbytes


def _open(path: str, tally: Tally) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    tally.add("openat")
    return fd


def _close(fd: int, tally: Tally) -> None:
    os.close(fd)
    tally.add("close")


def save_shard(folder: str, rank: int, chunk: int, chunks: int, tally: Tally) -> None:
    fd = _open(os.path.join(folder, "model.bin"), tally)
    for _ in range(chunks + rank):           # ranks differ, so a mix-up shows
        tally.add("write", os.write(fd, b"m" * chunk))
    tally.add("writev", os.writev(fd, [b"h" * 100, b"e" * 28]))
    os.fsync(fd)
    tally.add("fsync")
    _close(fd, tally)

    fd = _open(os.path.join(folder, "optim.bin"), tally)
    for i in range(chunks):
        tally.add("pwrite64", os.pwrite(fd, b"o" * (chunk // 2), i * (chunk // 2)))
    _close(fd, tally)


def thread_save(folder: str, chunk: int, tally: Tally) -> None:
    fd = _open(os.path.join(folder, "async.bin"), tally)
    for _ in range(3):
        tally.add("write", os.write(fd, b"a" * chunk))
    _close(fd, tally)


CHILD_CODE = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
n = os.write(fd, b"c" * int(sys.argv[2]))
os.close(fd)
print(n)
"""


def child_save(folder: str, nbytes: int, tally: Tally) -> None:
    env = {k: v for k, v in os.environ.items() if k not in RANK_ENV}
    out = subprocess.run([sys.executable, "-c", CHILD_CODE, os.path.join(folder, "child.bin"), str(nbytes)],
                         env=env, check=True, capture_output=True, text=True)
    tally.add("openat")
    tally.add("write", int(out.stdout))
    tally.add("close")


def run_rank(folder: str, rank: int, chunk: int, chunks: int) -> dict:
    os.makedirs(folder, exist_ok=True)
    tally = Tally()
    worker = threading.Thread(target=thread_save, args=(folder, chunk, tally)) if rank == 0 else None
    if worker:
        worker.start()
    save_shard(folder, rank, chunk, chunks, tally)
    if rank == 1:
        child_save(folder, 777, tally)
    if worker:
        worker.join()
    return {"rank": rank, "pid": os.getpid(), "bytes_written": tally.bytes, "syscalls": tally.calls}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--chunk", type=int, default=64 * 1024)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--manifest")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)   # internal: be one rank
    args = p.parse_args(argv)

    if args.rank is not None:
        json.dump(run_rank(os.path.join(args.dir, f"rank{args.rank}"), args.rank, args.chunk, args.chunks),
                  sys.stdout)
        return 0
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.ranks))
        cmd = [sys.executable, "-m", "slotscope.cli.workload", "--dir", args.dir, "--rank", str(r),
               "--chunk", str(args.chunk), "--chunks", str(args.chunks)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    ranks = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            print(f"workload: a rank failed with status {proc.returncode}", file=sys.stderr)
            return 1
        ranks.append(json.loads(out))
    if args.manifest:
        with open(args.manifest, "w") as f:
            json.dump({"ranks": ranks}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
