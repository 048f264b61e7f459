"""The traced syscalls (the `syscall` table's `syscall` column) and their groups, declared once
for the agent that traces them and every reader that groups them."""
from __future__ import annotations

# The order is the op number the BPF programs emit (bpf/syscalls.c uses the generated
# SYSOP_<NAME> constants).
OPS = (
    "write", "pwrite64", "writev", "pwritev", "pwritev2",
    "fsync", "fdatasync", "sync_file_range", "close",
    "openat", "openat2", "creat",
    "rename", "renameat", "renameat2", "unlink", "unlinkat",
    "mkdir", "mkdirat", "newfstatat", "statx", "ftruncate",
    "dup", "dup2", "dup3", "fcntl", "chdir", "fchdir", "close_range",
)
OP_NUMBER = {name: i + 1 for i, name in enumerate(OPS)}
OP_NAME = {i: name for name, i in OP_NUMBER.items()}

WRITE_SYSCALLS = ("write", "pwrite64", "writev", "pwritev", "pwritev2")
OPEN_SYSCALLS = ("openat", "openat2", "creat")
# Calls that wait for dirty pages to reach the server (NFS flushes on close: close-to-open).
FLUSH_SYSCALLS = ("close", "fsync", "fdatasync", "sync_file_range")
STAT_SYSCALLS = ("newfstatat", "statx")
RENAME_SYSCALLS = ("rename", "renameat", "renameat2")
MKDIR_SYSCALLS = ("mkdir", "mkdirat")
# Calls that are round trips to the server's namespace, not data.
METADATA_SYSCALLS = OPEN_SYSCALLS + STAT_SYSCALLS + RENAME_SYSCALLS + ("unlink", "unlinkat") + MKDIR_SYSCALLS
DUP_SYSCALLS = ("dup", "dup2", "dup3", "fcntl")
# Bookkeeping calls: they keep the agent's fd table and cwd right; they are not rows.
BOOKKEEPING_SYSCALLS = DUP_SYSCALLS + ("chdir", "fchdir", "close_range")

# The NFS client's entry points a syscall can spend its time in (the `nfs_calls` column, and
# bit i = 1 << i in the kernel event): fsync (nfs_file_fsync), flush (nfs_wb_all: close() and
# the syncs before rename, setattr...), getattr (stat of a file, which flushes it when dirty).
NFS_CALLS = ("fsync", "flush", "getattr")
