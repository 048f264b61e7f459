"""Mount tables from /proc/PID/mountinfo: which filesystem a path is on.

Reading mountinfo never touches the filesystems themselves, so it cannot hang
on an unresponsive NFS server (stat() or statfs() of a path on it can).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

NFS_TYPES = frozenset({"nfs", "nfs4"})
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class Mount:
    mount_id: int
    dev: int            # os.makedev(major, minor), what st_dev would say
    root: str
    mountpoint: str
    fstype: str
    source: str
    options: str        # per-mount options, then the superblock's

    @property
    def is_nfs(self) -> bool:
        return self.fstype in NFS_TYPES

    def option(self, name: str) -> str | None:
        for opt in self.options.split(","):
            key, _, value = opt.partition("=")
            if key == name:
                return value or ""
        return None


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f = left.split()
        r = right.split()
        if len(f) < 6 or len(r) < 2:
            continue
        major, minor = (int(x) for x in f[2].split(":"))
        mounts.append(Mount(
            mount_id=int(f[0]), dev=os.makedev(major, minor), root=_unescape(f[3]),
            mountpoint=_unescape(f[4]), fstype=r[0], source=_unescape(r[1]),
            options=f[5] + ("," + r[2] if len(r) > 2 else ""),
        ))
    return mounts


class MountTable:
    def __init__(self, mounts: list[Mount]):
        # Later mounts shadow earlier ones at the same point: keep the last.
        self.by_point = {m.mountpoint: m for m in mounts}
        self.by_id = {m.mount_id: m for m in mounts}

    @classmethod
    def read(cls, pid: int | str = "self") -> "MountTable":
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
            return cls(parse_mountinfo(f.read()))

    def find(self, path: str) -> Mount | None:
        """The mount an absolute, normalised path is on (longest mount-point prefix)."""
        p = path
        while True:
            m = self.by_point.get(p)
            if m is not None or p == "/":
                return m
            parent = os.path.dirname(p)
            if parent == p:     # "//x" or "x" end in "//" or "": not a path this answers, and no endless loop
                return None
            p = parent

    def nfs_mounts(self) -> list[Mount]:
        return [m for m in self.by_point.values() if m.is_nfs]
