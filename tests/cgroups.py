"""cgroup v2, for the tests and benches that give processes a cgroup of their own."""
from __future__ import annotations


def cgroup2_root() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
    hybrid host), or None."""
    with open("/proc/self/mounts") as f:
        for line in f:
            point, fstype = line.split()[1:3]
            if fstype == "cgroup2":
                return point
    return None


def into(cgroup: str) -> list[str]:
    """The argv prefix that starts a command inside `cgroup`: the shell moves itself there, then
    execs the command, so every call the command makes is in it."""
    return ["/bin/sh", "-c", 'echo $$ > "$0"/cgroup.procs && exec "$@"', cgroup]
