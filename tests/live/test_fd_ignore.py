"""Fds the agent marks uninteresting are skipped in the kernel (Loaded.ignore_fd), only
while they hold the file they were marked for: a reused fd number is traced again."""
import pytest

from slotscope.agent.layouts import OP_NUMBER
from livehelp import ask, python_child, syscall_probes_on

pytestmark = pytest.mark.live

# "open" opens /dev/null and prints the fd; "write FD N" writes N bytes one by one; "close FD".
CHILD = r"""
import os, sys
print(os.open(os.devnull, os.O_WRONLY), flush=True)   # before tracing: no generation yet
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "open":
        print(os.open(os.devnull, os.O_WRONLY), flush=True)
        continue
    if cmd == "write":
        for _ in range(int(args[1])):
            os.write(int(args[0]), b"x")
    elif cmd == "close":
        os.close(int(args[0]))
    print("done", flush=True)
"""


@pytest.fixture
def child():
    with python_child(CHILD) as proc:
        proc.first_fd = int(proc.stdout.readline())
        yield proc


@pytest.fixture
def loaded(child):
    with syscall_probes_on(child.pid) as loaded:
        yield loaded


def events(loaded, op: str, fd: int):
    sys_ev = loaded.read_batch()["sys_ring"]
    return sys_ev[(sys_ev["op"] == OP_NUMBER[op]) & (sys_ev["fd"] == fd)]


def test_an_fd_from_before_tracing_is_skipped_once_marked(child, loaded):
    fd = child.first_fd
    assert ask(child, f"write {fd} 5") == "done"
    assert events(loaded, "write", fd).size == 5
    loaded.ignore_fd(child.pid, fd, None)
    assert ask(child, f"write {fd} 5") == "done"
    assert events(loaded, "write", fd).size == 0


def opened(child, loaded) -> tuple[int, int]:
    """(fd, generation) of a new open: the generation is its openat's exit time."""
    fd = int(ask(child, "open"))
    opens = events(loaded, "openat", -100)   # its dirfd: AT_FDCWD
    [ts_exit] = opens[opens["ret"] == fd]["ts_exit"].tolist()
    return fd, ts_exit


def test_a_mark_lasts_while_the_fd_holds_its_file(child, loaded):
    fd, gen = opened(child, loaded)
    loaded.ignore_fd(child.pid, fd, gen)
    assert ask(child, f"write {fd} 5") == "done"
    assert events(loaded, "write", fd).size == 0
    assert ask(child, f"close {fd}") == "done"
    again, _ = opened(child, loaded)
    assert again == fd                     # the lowest free number: the same fd, another file
    assert ask(child, f"write {fd} 5") == "done"
    assert events(loaded, "write", fd).size == 5
