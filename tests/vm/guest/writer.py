"""One checkpoint-saving rank: writes its shard files with a given write size and mode.

Protocol with the scenario runner: print "ready" once set up, wait for a line on stdin
(so all ranks start together), write, then print one JSON line with the results. With
--saves it stays up, as a training process does, and saves once per line on stdin.

With --local-dir a save writes its files there (a local tmpfs) and returns, then copies them
to the NFS directory in large buffered writes, as a background copy would (issue 23's "local
then copy" fix): `wall_s` is the blocking save, `copy_s` the copy.
"""

import argparse
import json
import mmap
import os
import sys
import shutil
import time

MODES = {
    "buffered": 0,
    "fsync": 0,
    "osync": os.O_SYNC,
    "odirect": os.O_DIRECT,
}


def write_file(path, size, write_size, mode, buf):
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | MODES[mode]
    fd = os.open(path, flags, 0o644)
    try:
        done = 0
        while done < size:
            n = os.write(fd, memoryview(buf)[:min(write_size, size - done)])
            done += n
        if mode == "fsync":
            os.fsync(fd)
    finally:
        os.close(fd)  # NFS flushes dirty pages on close (close-to-open)
    return done


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--write-size", type=int, required=True)
    ap.add_argument("--mode", choices=sorted(MODES), required=True)
    ap.add_argument("--file-bytes", type=int, required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--local-dir", help="save here first, then copy to --dir")
    ap.add_argument("--saves", action="store_true",
                    help="stay up: save once per line on stdin (the line names the subdirectory)")
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    buf = mmap.mmap(-1, a.write_size)  # page-aligned, as O_DIRECT wants
    buf.write(bytes([rank % 251 + 1]) * a.write_size)
    print("ready", flush=True)
    if not a.saves:
        sys.stdin.readline()
        save(a, rank, a.dir, buf)
        return
    for line in sys.stdin:      # one save per line, into that subdirectory, until EOF
        save(a, rank, os.path.join(a.dir, line.strip()), buf)


def save(a, rank, where, buf):
    first = a.local_dir or where
    os.makedirs(os.path.join(first, f"rank{rank:04d}"), exist_ok=True)
    t0 = time.monotonic()
    files = {}
    for i in range(a.files):
        rel = os.path.join(f"rank{rank:04d}", f"shard{i}.bin")
        files[rel] = write_file(os.path.join(first, rel), a.file_bytes, a.write_size, a.mode, buf)
    wall = time.monotonic() - t0
    result = {"rank": rank, "pid": os.getpid(), "uid": os.getuid(), "wall_s": round(wall, 4),
              "bytes": sum(files.values()), "files": files, "write_size": a.write_size, "mode": a.mode}
    if a.local_dir:
        t1 = time.monotonic()
        os.makedirs(os.path.join(where, f"rank{rank:04d}"), exist_ok=True)
        for rel in files:
            copy(os.path.join(first, rel), os.path.join(where, rel))
        result["copy_s"] = round(time.monotonic() - t1, 4)
    print(json.dumps(result), flush=True)


def copy(src, dst):
    """A background copy's writes: 1 MiB buffered, the pages flushed at close."""
    with open(src, "rb") as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    os.unlink(src)


if __name__ == "__main__":
    main()
