"""The kernel's NTP state as the agent records it (agent/clock.py; meta.json clock_sync): read with
the real adjtimex, by an ordinary user as much as by root."""
import json
import os
import subprocess
import sys

import pytest

from slotscope.agent.clock import sync_state
from slotscope.capture.meta import check_meta, new_meta

pytestmark = pytest.mark.unit

READ = "import json; from slotscope.agent.clock import sync_state; print(json.dumps(sync_state()))"


def test_the_state_is_read_and_fits_meta_json():
    state = sync_state()
    assert isinstance(state["synchronized"], bool)
    # an unsynchronized clock's errors are the kernel's ceiling (16 s), a synchronized one's less
    assert 0 < state["esterror_ns"] <= 16 * 10**9 and 0 < state["maxerror_ns"] <= 16 * 10**9
    kept, problems = check_meta({**new_meta(), "clock_sync": state}, "meta.json")
    assert kept["clock_sync"] == state and problems == []


def test_a_bad_clock_sync_is_left_out_with_a_problem():
    kept, problems = check_meta({**new_meta(), "clock_sync": {"synchronized": "yes"}}, "meta.json")
    assert "clock_sync" not in kept and problems == [
        'meta.json: clock_sync.synchronized is "yes", not true or false: \'clock_sync\' ignored']


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root to nobody")
def test_an_ordinary_user_reads_it_too():
    """adjtimex with no modes only reads: no CAP_SYS_TIME needed, so an agent without root records it."""
    res = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", READ],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    theirs = json.loads(res.stdout)
    assert theirs["synchronized"] == sync_state()["synchronized"]
