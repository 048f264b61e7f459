"""The kernel wakes the agent only when a drain cannot wait (bpf/common.h, wake_flags):
a ring an eighth full, or a new program to identify. The tests read the programs' own count
of forced wakeups, not whether an epoll wait ended in time (which any busy machine can skew)."""
import subprocess

import pytest

from slotscope.agent.layouts import PROC_EXEC, SYS_EVENT
from slotscope.agent.probes import SyscallProbes, wake_every
from livehelp import ask, python_child, syscall_probes_on

pytestmark = pytest.mark.live

# Traced on command (the agent never traces its own process): "N" writes N bytes to
# /dev/null one by one, "exec" runs true. Pinned to one CPU: the wakeup counters are per CPU.
CHILD = r"""
import os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
fd = os.open(os.devnull, os.O_WRONLY)
for line in sys.stdin:
    if line.strip() == "exec":
        os.spawnv(os.P_WAIT, "/bin/true", ["true"])
    else:
        for _ in range(int(line)):
            os.write(fd, b"x")
    print("done", flush=True)
"""


@pytest.fixture
def child():
    with python_child(CHILD) as proc:
        yield proc


@pytest.fixture
def loaded(child):
    with syscall_probes_on(child.pid) as loaded:
        yield loaded


def test_a_few_events_do_not_wake_the_agent(child, loaded):
    before = loaded.forced_wakeups()
    assert ask(child, 10) == "done"
    assert loaded.forced_wakeups() == before
    assert loaded.read_batch()["sys_ring"].size >= 10     # they are there, for the next drain


def test_an_eighth_of_the_ring_wakes_it(child, loaded):
    every = wake_every(SYS_EVENT, SyscallProbes.rings["sys_ring"][1])
    before = loaded.forced_wakeups()
    assert ask(child, every + 10) == "done"
    after = loaded.forced_wakeups()
    assert after["sys_ring"] >= before["sys_ring"] + 1, (before, after)
    assert loaded.asked(30.0)                     # and the wakeup reaches the agent's wait
    assert loaded.read_batch()["sys_ring"].size >= every


def test_an_exec_wakes_it(child, loaded):
    before = loaded.forced_wakeups()
    assert ask(child, "exec") == "done"           # a traced descendant: its identity cannot wait
    assert loaded.forced_wakeups()["proc_ring"] >= before["proc_ring"] + 1
    assert loaded.asked(30.0)
    assert PROC_EXEC in loaded.read_batch()["proc_ring"]["kind"].tolist()


def test_untraced_programs_do_not_wake_an_agent_that_filters(child, loaded):
    """With --pid (here the child alone), the programs and threads other processes start are
    not recorded, so they can neither force a drain nor fill the ring (this test flaked when
    every exec woke the agent, and again, on a machine busy with a VM's threads, when their
    events filled the ring). A loop of execs runs beside the wait; the child's own exec is the
    one recorded."""
    before = loaded.forced_wakeups()
    loop = subprocess.Popen(["sh", "-c", "for i in $(seq 200); do /bin/true; done"])
    assert loop.wait(60) == 0
    assert loaded.forced_wakeups() == before
    assert ask(child, "exec") == "done"
    events = loaded.read_batch()["proc_ring"]
    children = {int(e["tid"]) for e in events if e["tgid"] == child.pid}   # what the child started
    assert set(events["tgid"].tolist()) <= {child.pid} | children, events
    assert PROC_EXEC in events["kind"].tolist() and loop.pid not in events["tgid"].tolist()
