"""What a newcomer's first run prints on this machine, which has no NFS: `slotscope demo` records
the bundled workload on local disk, finds it healthy, says why that is not the story and goes on
to the capture shipped with slotscope; every path it names still exists when it ends. `doctor`
points at the shipped capture too, and `demo --keep` over an earlier capture takes --force."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from livehelp import slotscope
from slotscope.agent.doctor import checks
from slotscope.capture.reader import Capture
from slotscope.cli.demo import sample_path

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]

# an absolute path: a slash not inside a word or a number (KiB/s, 1.5 Mb/s are none)
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/[\w.\-]+(?:/[\w.\-]+)*")


def nfs_traceable() -> bool:
    reasons = {name: reason for name, reason, _ in checks()}
    return reasons["probe group sunrpc"] is None and reasons["probe group nfs"] is None


def test_the_first_demo_shows_the_shipped_storm_and_names_only_paths_that_exist(tmp_path):
    if nfs_traceable():
        pytest.skip("this kernel traces NFS: the demo's own save may be the story")
    sample_report = slotscope("analyze", sample_path()).stdout
    res = slotscope("demo", stdin=subprocess.DEVNULL, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert res.returncode == 0, res.stderr
    local, shown, rest = res.stdout.partition(sample_report)
    assert shown and rest.strip() == "", "the shipped capture's analysis is not the last thing printed"
    why = " ".join(local.strip().split("\n\n")[-1].split())      # one paragraph, wrapped
    assert why.startswith("slotscope demo: the save above went to local disk")
    assert "this kernel has no NFS client to trace" in why and "`slotscope demo --sample`" in why
    # the sample's own paths are of the VM it was recorded in: data, not pointers
    named = set(ABSOLUTE_PATH.findall(local + res.stderr))
    assert named, "the demo names no path at all: its recording, at least, must be named"
    assert sorted(p for p in named if not os.path.exists(p)) == []
    kept = [p for p in named if os.path.exists(os.path.join(p, "meta.json"))]
    assert len(kept) == 1 and Capture.open(kept[0]).meta["stop_reason"] == "command exited"
    assert os.listdir(os.path.dirname(kept[0])) == ["capture"]      # the checkpoint is gone


def test_doctor_without_nfs_points_at_the_shipped_capture():
    res = slotscope("doctor")
    pointer = [line for line in res.stdout.splitlines() if "slotscope demo --sample" in line]
    if nfs_traceable():
        assert pointer == []
    else:
        assert len(pointer) == 1 and pointer[0].startswith("no NFS to trace here"), res.stdout


def test_demo_keep_over_an_earlier_capture_takes_force(tmp_path):
    cap = tmp_path / "cap"
    shutil.copytree(sample_path(), cap)
    res = slotscope("demo", "--keep", str(cap), stdin=subprocess.DEVNULL)
    assert res.returncode == 1 and "use --force" in res.stderr and "Traceback" not in res.stderr
    res = slotscope("demo", "--keep", str(cap), "--force", stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    assert "slotscope.cli.workload" in Capture.open(str(cap)).meta["command"]    # the demo's, not the sample's
