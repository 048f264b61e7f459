"""Memory the agent gives back: what loading the probes left, and what its allocators keep.

BCC compiles the programs inside this process with clang and LLVM, which libbcc links:
importing bcc maps them and touches ~55 MiB of their pages (relocations, static
constructors), the compile ~30 MiB more, and malloc keeps ~20 MiB the compile freed. None
of it is used again while the programs run. Importing pyarrow and numpy touches tens of MiB of
their libraries' pages likewise (libarrow's, the compute kernels' registration, libparquet's
and substrait's, which pyarrow links), much of it never used again by the agent. After a
burst of events, malloc keeps the pages freed for its tables (30-50 MiB after a write storm)
until give_back. bench/memory.py measures it all.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

import pyarrow as pa

COMPILER = re.compile(r"/lib(bcc|LLVM|clang)[^/]*\.so")   # BCC's library and the compiler it links
MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def release_compiler() -> None:
    """Once the probes are loaded: give back the heap malloc kept, and drop from this process
    the pages of its libraries that are plain copies of their files (MADV_DONTNEED, as BCC's
    own bcc_free_memory does for a libbcc linked into the program): the compiler's, which does
    not run again before the unload, and the others', of which the agent then uses a part (the
    pages it touches again are mapped again from the page cache, where they all stay, shared).
    Mappings a library wrote to (its relocated data) are left as they are."""
    _malloc_trim()
    for m in file_copies():
        _libc.madvise(m.start, m.end - m.start, MADV_DONTNEED)


def arrow_from_malloc() -> None:
    """Arrow's buffers from malloc, not from mimalloc (its default pool): mimalloc gives pages
    freed back to the kernel within milliseconds, so in a write storm every drain's tables
    were made in fresh pages the kernel zeroed, 15% of the agent's CPU here (perf: clear_page).
    malloc keeps them for the next drain, until give_back."""
    pa.set_memory_pool(pa.system_memory_pool())


def give_back() -> None:
    """The free memory the allocators keep, to the kernel: Arrow's pool and malloc's. Costs
    0.3-0.8 ms idle, up to 17 ms during a write storm (bench/memory.py's)."""
    pa.default_memory_pool().release_unused()
    _malloc_trim()


def _malloc_trim() -> None:
    trim = getattr(_libc, "malloc_trim", None)    # glibc's; other C libraries have none
    if trim is not None:
        trim(0)


@dataclass
class Mapping:
    """One mapping of a process's address space, as /proc/PID/smaps describes it."""
    start: int
    end: int
    perms: str
    path: str                                   # "" for anonymous memory; [heap], anon_inode:...
    kb: dict[str, int] = field(default_factory=dict)     # Rss, Anonymous, ... in kB


def mappings(pid: int | str = "self") -> list[Mapping]:
    out = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split(None, 5)
            if fields[0].endswith(":"):
                if len(fields) == 3 and fields[2] == "kB":
                    out[-1].kb[fields[0][:-1]] = int(fields[1])
            else:                               # range perms offset dev inode [path]
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out.append(Mapping(start, end, fields[1], fields[5].rstrip("\n") if len(fields) > 5 else ""))
    return out


def file_copies() -> list[Mapping]:
    """The read-only mappings of files (libraries, the interpreter) without a page of their own
    (none Anonymous): each page is the file's, and nothing can write one before the madvise."""
    return [m for m in mappings() if m.path.startswith("/") and not m.path.startswith("/dev/")
            and "w" not in m.perms and m.kb.get("Anonymous") == 0]
