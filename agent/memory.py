"""What loading the probes leaves in the agent's memory, given back once they are loaded.

BCC compiles the programs inside this process with clang and LLVM, which libbcc links:
importing bcc maps them and touches ~55 MiB of their pages (relocations, static
constructors), the compile ~30 MiB more, and malloc keeps ~20 MiB the compile freed. None
of it is used again while the programs run (bench/memory.py measures it all).
"""
from __future__ import annotations

import ctypes
import re

COMPILER = re.compile(r"/lib(bcc|LLVM|clang)[^/]*\.so")   # BCC's library and the compiler it links
MADV_DONTNEED = 4


def release_compiler() -> None:
    """Give back the heap malloc kept (malloc_trim), and drop from this process the pages of
    the compiler's libraries that are plain copies of their files (MADV_DONTNEED, as BCC's
    own bcc_free_memory does for a libbcc linked into the program): were the compiler to run
    again (it does not before the unload), they would be read again from the page cache.
    Mappings a library wrote to (its relocated data) are left as they are."""
    libc = ctypes.CDLL(None, use_errno=True)
    trim = getattr(libc, "malloc_trim", None)    # glibc's; other C libraries have none
    if trim is not None:
        trim(0)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for start, end in _file_copies():
        libc.madvise(start, end - start, MADV_DONTNEED)


def _file_copies() -> list[tuple[int, int]]:
    """(start, end) of the compiler libraries' read-only mappings without a page of their own
    (none Anonymous): each page is the file's, and nothing can write one before the madvise."""
    out, mapping = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):      # a mapping: range perms offset dev inode path
                path = fields[5] if len(fields) > 5 else ""
                mapping = fields if COMPILER.search(path) and "w" not in fields[1] else None
            elif fields[0] == "Anonymous:" and mapping is not None and fields[1] == "0":
                start, end = (int(x, 16) for x in mapping[0].split("-"))
                out.append((start, end))
    return out
