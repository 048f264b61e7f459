"""Opening the files a reader is given: regular files only, of a bounded size. A FIFO blocks
a plain open() forever and /dev/zero never ends, so a file is opened without blocking, checked
with fstat, and refused when it is anything else."""
from __future__ import annotations

import errno
import os
import stat

PERMISSION_HINT = ("permission denied: captures are root-only by default; "
                   "use sudo or record with --group-readable")

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotAFile(Exception):
    """Not a regular file, or too big; the message says what it is."""


def open_regular(path: str, follow: bool = True) -> tuple[int, int]:
    """(fd, size) of the regular file at `path`; without `follow`, a symlink is refused, not
    followed. OSError as open() raises it, NotAFile for anything but a regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow and os.path.islink(path):
            raise NotAFile("a symlink, not followed") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise NotAFile(f"{kind}, not a regular file")
    return fd, st.st_size


def read_capped(path: str, limit: int, follow: bool = True) -> bytes:
    """The whole regular file at `path`, refused (NotAFile) beyond `limit` bytes."""
    fd, size = open_regular(path, follow)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if max(size, len(data)) > limit:
        raise NotAFile(f"larger than {limit >> 20} MiB")
    return data


def why(exc: OSError | NotAFile) -> str:
    """What went wrong, in a few words."""
    if isinstance(exc, PermissionError):
        return PERMISSION_HINT
    return str(exc) if isinstance(exc, NotAFile) else (exc.strerror or str(exc))
