"""One checkpoint-saving rank: writes its shard files with a given write size and mode.

Protocol with the scenario runner: print "ready" once set up, wait for a line on stdin
(so all ranks start together), write, then print one JSON line with the results. With
--saves it stays up, as a training process does, and saves once per line on stdin.
"""

import argparse
import json
import mmap
import os
import sys
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
    outdir = os.path.join(where, f"rank{rank:04d}")
    os.makedirs(outdir, exist_ok=True)
    t0 = time.monotonic()
    files = {}
    for i in range(a.files):
        path = os.path.join(outdir, f"shard{i}.bin")
        files[os.path.relpath(path, where)] = write_file(path, a.file_bytes, a.write_size, a.mode, buf)
    wall = time.monotonic() - t0
    print(json.dumps({"rank": rank, "pid": os.getpid(), "uid": os.getuid(), "wall_s": round(wall, 4),
                      "bytes": sum(files.values()), "files": files,
                      "write_size": a.write_size, "mode": a.mode}), flush=True)


if __name__ == "__main__":
    main()
