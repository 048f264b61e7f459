"""The drain's niceness follows its load (agent/priority.py): the draining thread sleeps at
DRAIN_NICE and drains at the agent's own niceness at a save's pace, every thread is at DRAIN_NICE
while a ring fills fast, at the agent's own again after CALM_S without; a thread it starts goes
back to the agent's own (as_own); closed, every thread is as it found it; refused (no CAP_SYS_NICE), it stays where it was and says
nothing. Real setpriority on this
kernel, in a process of its own: niceness is per thread and the test's must not change."""
import json
import os
import subprocess
import sys

import pytest

from slotscope.agent.priority import DRAIN_NICE

pytestmark = pytest.mark.live
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# Prints each thread's niceness after each step: asleep, a save's pace, a storm, calm but not
# for CALM_S yet, calm for CALM_S, asleep again; a thread started while raised is followed too.
SCRIPT = """
import json, os, sys, threading
from slotscope.agent.priority import CALM_S, DrainPriority, as_own
stop = threading.Event()
def thread(target=stop.wait):
    t = threading.Thread(target=target); t.start(); return t
threads = [thread()]
p = DrainPriority()
def nice():
    return [os.getpriority(os.PRIO_PROCESS, 0)] + [os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threads]
out = []
p.sleeping(); out.append(nice())
p.follow(0.004, 1.0, 10.0); out.append(nice())            # 0.4% of a ring in a second
p.sleeping()
own = thread(lambda: (as_own(), stop.wait())); threads.append(own)   # started by the raised thread
import time; time.sleep(0.2); out.append(nice()); threads.remove(own)
p.follow(0.004, 1.0, 10.5)
p.follow(0.06, 0.04, 11.0); out.append(nice())            # 6% in 40 ms: full in 0.7 s
threads.append(thread())
p.follow(0.0, 0.02, 11.0 + CALM_S - 0.5); out.append(nice())
p.follow(0.0, 0.02, 11.0 + CALM_S); out.append(nice())
p.sleeping(); out.append(nice())
p.follow(0.06, 0.04, 20.0)
p.close(); out.append(nice())                               # closed while raised
p = DrainPriority(); p.sleeping(); p.close(); out.append(nice())   # closed asleep
stop.set()
print(json.dumps(out))
"""


def _at_nice_0():
    """The script's niceness known, whatever the test run's (its agent's own is 0)."""
    os.setpriority(os.PRIO_PROCESS, 0, 0)


def _steps(prefix=()):
    res = subprocess.run([*prefix, sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                         preexec_fn=_at_nice_0)
    assert res.returncode == 0 and not res.stderr, res.stderr
    return json.loads(res.stdout)


def test_raised_while_a_ring_fills_and_lowered_after_calm():
    asleep, pace, started, storm, settling, calm, asleep_again, closed_raised, closed_asleep = _steps()
    assert asleep == [DRAIN_NICE, 0]            # the draining thread alone
    assert pace == [0, 0]
    assert started == [DRAIN_NICE, 0, 0]        # back to the agent's own
    assert storm == [DRAIN_NICE, DRAIN_NICE]
    assert settling == [DRAIN_NICE] * 3          # the thread started meanwhile inherited it
    assert calm == [0, 0, 0]
    assert asleep_again == [DRAIN_NICE, 0, 0]
    assert closed_raised == closed_asleep == [0, 0, 0]     # as it found them


def test_an_ordinary_user_keeps_its_niceness():
    assert _steps(NOBODY) == [[0, 0], [0, 0], [0, 0, 0], [0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0],
                              [0, 0, 0]]


GUARDED = """
import os, sys, threading, time
from slotscope.agent.priority import DrainPriority
storm = sys.argv[1] == "storm"
asked = threading.Event()
def ask():
    asked.set()
    return storm
p = DrainPriority()
r, w = os.pipe()
p.guard([r], ask)
p.follow(0.004, 1.0, 10.0)                  # a calm drain: the agent's own niceness
calm = os.getpriority(os.PRIO_PROCESS, 0)
os.write(w, b"x")                           # the kernel's forced wakeup, as the ring fd signals it
asked.wait(10)
end = time.monotonic() + (10 if storm else 0.5)     # raised at once, or never
while os.getpriority(os.PRIO_PROCESS, 0) == calm and time.monotonic() < end:
    time.sleep(0.01)
roused = os.getpriority(os.PRIO_PROCESS, 0)
p.close()
print(asked.is_set(), calm, roused, os.getpriority(os.PRIO_PROCESS, 0))
"""


@pytest.mark.parametrize("storm", [True, False], ids=["a ring filling fast", "a new program's wakeup"])
def test_a_forced_wakeup_rouses_a_calm_drain_in_a_storm_only(storm):
    """A storm that starts while the drain works at the agent's own niceness: the guard thread,
    woken by the ring's fd, puts the draining thread at DRAIN_NICE at once. A wakeup with the
    rings nearly empty (a new program's, at a save's pace) leaves it where it was."""
    res = subprocess.run([sys.executable, "-c", GUARDED, "storm" if storm else "calm"], capture_output=True,
                         text=True, timeout=60, preexec_fn=_at_nice_0)
    assert res.returncode == 0 and not res.stderr, res.stderr
    roused = str(DRAIN_NICE) if storm else "0"
    assert res.stdout.split() == ["True", "0", roused, "0"]      # and closed, as it found it


# In unpreempted(), the thread's policy, inside and after, and its niceness after (SCHED_BATCH at 7 before).
UNPREEMPTED = """
import os
from slotscope.agent.priority import unpreempted
os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
os.setpriority(os.PRIO_PROCESS, 0, 7)
with unpreempted():
    inside = os.sched_getscheduler(0)
print(inside, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
"""


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_map_syscalls_run_unpreempted_and_the_thread_is_as_it_was_after(user):
    """The agent's long map reads run at SCHED_FIFO (agent/priority.py unpreempted): after, the
    thread is back at the policy and niceness it had; an ordinary user's stays at its own, with
    no error."""
    out = subprocess.run([*(NOBODY if user == "nobody" else []), sys.executable, "-c", UNPREEMPTED],
                         capture_output=True, text=True, check=True).stdout.split()
    inside = os.SCHED_FIFO if user == "root" else os.SCHED_BATCH
    assert [int(v) for v in out] == [inside, os.SCHED_BATCH, 7]
