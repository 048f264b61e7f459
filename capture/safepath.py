"""Opening the places root writes to, so that no link an ordinary user planted redirects it.

The path is walked one component at a time from "/" with O_NOFOLLOW, each step relative to
the directory just opened: a component swapped for a link between two steps is not followed.
A symbolic link on the way is followed only if it belongs to root or to us (as the kernel's
protected_symlinks does in sticky directories): /var/run -> /run is fine, /tmp/x -> /etc,
planted by another user, is refused.
"""
from __future__ import annotations

import errno
import os
import stat

MAX_LINKS = 40          # as the kernel's limit on links followed in one lookup


class UnsafePath(OSError):
    """A path that must not be written through; str() is the one line to show."""


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkFound(Exception):
    """open_subdir met a symbolic link; `st` is its lstat."""

    def __init__(self, st: os.stat_result):
        super().__init__("a symbolic link")
        self.st = st


def open_subdir(name: str, dir_fd: int) -> int:
    """The fd of directory `name` in dir_fd, never through a link: LinkFound when it is one."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.lstat(name, dir_fd=dir_fd)
            if stat.S_ISLNK(st.st_mode):
                raise LinkFound(st) from None
        raise


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def open_dir(path: str) -> int:
    """An O_DIRECTORY fd of `path`, reached without following an untrusted link.
    Raises UnsafePath, or OSError (FileNotFoundError, NotADirectoryError, ...) as open would."""
    todo = [p for p in os.path.abspath(path).split("/") if p][::-1]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked, links = "", 0
    try:
        while todo:
            part = todo.pop()
            if part == ".":
                continue
            try:
                nfd = open_subdir(part, fd)
            except LinkFound as link:
                st = link.st
                where = f"{walked}/{part}"
                if not _trusted(st):
                    raise UnsafePath(errno.EPERM, f"{where} is a symbolic link owned by uid {st.st_uid}; "
                                                  f"refusing to follow it as root") from None
                links += 1
                if links > MAX_LINKS:
                    raise UnsafePath(errno.ELOOP, f"{path}: too many symbolic links") from None
                target = os.readlink(part, dir_fd=fd)
                todo.extend([p for p in target.split("/") if p][::-1])
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    walked = ""
                continue
            os.close(fd)
            fd = nfd
            walked = os.path.normpath(f"{walked}/{part}") if part == ".." else f"{walked}/{part}"
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_parent(path: str) -> tuple[int, str]:
    """(fd of the directory holding path, reached as open_dir does; path's last component)."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path) or "/"
    try:
        return open_dir(parent), os.path.basename(path) or "."
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no such directory: {parent}") from None


def create_file(path: str, mode: int = 0o600, replace: bool = True):
    """A binary file object for writing `path` as root: never through a planted link, never over
    a file of another user or a special file. With replace, an existing file of ours is replaced
    (written beside it, then renamed over it, so a reader never sees half of it)."""
    dfd, name = open_parent(path)
    try:
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(errno.EEXIST, f"{path}: exists and is not a regular file; not replacing it")
            if st.st_uid != os.geteuid():
                raise UnsafePath(errno.EPERM, f"{path}: belongs to uid {st.st_uid}; not replacing it")
            if not replace:
                raise FileExistsError(errno.EEXIST, f"{path}: exists")
        return _Replacing(dfd, name, mode)
    except BaseException:
        os.close(dfd)
        raise


class _Replacing:
    """Writes to a new hidden file beside the target and renames it over the target on a clean
    close; on an exception the hidden file goes."""

    def __init__(self, dfd: int, name: str, mode: int):
        self.dfd, self.name, self.tmp = dfd, name, f".{name}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.tmp, flags, mode, dir_fd=dfd)
        os.fchmod(fd, mode)
        self.file = os.fdopen(fd, "wb")

    def __enter__(self):
        return self.file

    def __exit__(self, kind, _value, _tb):
        done = False
        try:
            self.file.close()
            if kind is None:
                os.rename(self.tmp, self.name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
                done = True
        finally:
            if not done:
                try:
                    os.unlink(self.tmp, dir_fd=self.dfd)
                except OSError:
                    pass
            os.close(self.dfd)
        return False
