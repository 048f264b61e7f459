"""Fds the agent marks uninteresting are skipped in the kernel (Loaded.ignore_fd), only
while they hold the file they were marked for: a reused fd number is traced again."""
import subprocess
import sys

import pytest

from slotscope.agent.layouts import OP_NUMBER
from slotscope.agent.probes import Filters, SyscallProbes, load

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
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.first_fd = int(proc.stdout.readline())
    yield proc
    proc.stdin.close()
    proc.wait(timeout=10)


@pytest.fixture
def loaded(child):
    probes = SyscallProbes()
    if probes.can_run():
        pytest.skip(probes.can_run())
    loaded = load([probes], Filters(tgids=[child.pid]))
    yield loaded
    loaded.close()


def ask(child, command: str) -> str:
    child.stdin.write(f"{command}\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


def events(loaded, op: str, fd: int):
    sys_ev = loaded.read_batch()["sys_ring"]
    return sys_ev[(sys_ev["op"] == OP_NUMBER[op]) & (sys_ev["fd"] == fd)]


def test_an_fd_from_before_tracing_is_skipped_once_marked(child, loaded):
    fd = child.first_fd
    ask(child, f"write {fd} 5")
    assert events(loaded, "write", fd).size == 5
    loaded.ignore_fd(child.pid, fd, None)
    ask(child, f"write {fd} 5")
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
    ask(child, f"write {fd} 5")
    assert events(loaded, "write", fd).size == 0
    ask(child, f"close {fd}")
    again, _ = opened(child, loaded)
    assert again == fd                     # the lowest free number: the same fd, another file
    ask(child, f"write {fd} 5")
    assert events(loaded, "write", fd).size == 5
