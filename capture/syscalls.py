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

# The sampled mode (record --no-bpf) finds a thread's syscall as a number (/proc/PID/task/TID/syscall):
# the numbers of the calls a training job's thread can be found waiting in (file I/O, the syncs, the
# namespace calls, and the usual sleeps: futex, poll, sleeps, waits), from the kernel's uapi headers
# (asm/unistd_64.h; asm-generic/unistd.h for arm64). Other numbers stay unnamed.
SYSCALL_NUMBERS = {
    "x86_64": {
        "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6, "poll": 7, "lseek": 8,
        "mmap": 9, "munmap": 11, "ioctl": 16, "pread64": 17, "pwrite64": 18, "readv": 19, "writev": 20,
        "select": 23, "sched_yield": 24, "msync": 26, "pause": 34, "nanosleep": 35, "sendfile": 40,
        "connect": 42, "accept": 43, "sendto": 44, "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "wait4": 61,
        "fcntl": 72, "flock": 73, "fsync": 74, "fdatasync": 75, "truncate": 76, "ftruncate": 77, "rename": 82,
        "mkdir": 83, "rmdir": 84, "creat": 85, "unlink": 87, "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "fstatfs": 138, "sync": 162, "futex": 202,
        "io_getevents": 208, "getdents64": 217, "fadvise64": 221, "clock_nanosleep": 230, "epoll_wait": 232,
        "waitid": 247, "openat": 257, "mkdirat": 258, "newfstatat": 262, "unlinkat": 263, "renameat": 264,
        "pselect6": 270, "ppoll": 271, "splice": 275, "sync_file_range": 277, "epoll_pwait": 281,
        "fallocate": 285, "accept4": 288, "preadv": 295, "pwritev": 296, "syncfs": 306, "renameat2": 316,
        "copy_file_range": 326, "preadv2": 327, "pwritev2": 328, "statx": 332, "io_uring_enter": 426,
        "openat2": 437, "epoll_pwait2": 441,
    },
    "aarch64": {
        "io_getevents": 4, "epoll_pwait": 22, "fcntl": 25, "ioctl": 29, "flock": 32, "mkdirat": 34,
        "unlinkat": 35, "renameat": 38, "fstatfs": 44, "truncate": 45, "ftruncate": 46, "fallocate": 47,
        "openat": 56, "close": 57, "getdents64": 61, "lseek": 62, "read": 63, "write": 64, "readv": 65,
        "writev": 66, "pread64": 67, "pwrite64": 68, "preadv": 69, "pwritev": 70, "sendfile": 71,
        "pselect6": 72, "ppoll": 73, "splice": 76, "newfstatat": 79, "fstat": 80, "sync": 81, "fsync": 82,
        "fdatasync": 83, "sync_file_range": 84, "waitid": 95, "futex": 98, "nanosleep": 101,
        "clock_nanosleep": 115, "sched_yield": 124, "accept": 202, "connect": 203, "sendto": 206,
        "recvfrom": 207, "sendmsg": 211, "recvmsg": 212, "munmap": 215, "clone": 220, "execve": 221, "mmap": 222, "fadvise64": 223,
        "msync": 227, "accept4": 242, "wait4": 260, "syncfs": 267, "renameat2": 276, "copy_file_range": 285,
        "preadv2": 286, "pwritev2": 287, "statx": 291, "io_uring_enter": 426, "openat2": 437,
        "epoll_pwait2": 441,
    },
}
READ_SYSCALLS = ("read", "pread64", "readv", "preadv", "preadv2")
# Calls whose first argument is the file they work on (a sample names it: readlink of the fd) ...
FD_FIRST = WRITE_SYSCALLS + READ_SYSCALLS + FLUSH_SYSCALLS + (
    "ftruncate", "fallocate", "fstat", "fstatfs", "flock", "fcntl", "getdents64", "lseek", "fadvise64",
    "copy_file_range", "splice", "syncfs")
# ... or the directory its path is relative to (AT_FDCWD: the working directory).
DIRFD_FIRST = ("openat", "openat2", "mkdirat", "unlinkat", "renameat", "renameat2", "newfstatat", "statx")
# Calls in which a sampled thread is idle, not waiting on a file: its wait channel says nothing
# more (a thread waiting for a lock held by one stuck on NFS is in futex all the same), so the
# sampler does not read it.
IDLE_SYSCALLS = ("futex", "nanosleep", "clock_nanosleep", "poll", "ppoll", "select", "pselect6", "epoll_wait",
                 "epoll_pwait", "epoll_pwait2", "wait4", "waitid", "pause")
