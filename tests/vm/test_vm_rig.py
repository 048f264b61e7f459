"""The VM rig end to end: real NFS client and server in a qemu VM (slow tier)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vmrig import mountstats
from vmrig.image import REPO
from vmrig.vm import VMTimeout, crashed_before_job, run_vm

VM_DIR = Path(__file__).resolve().parent
MiB = 2**20

pytestmark = pytest.mark.vm


def run_scenario(out, *args, timeout=900):
    cmd = [sys.executable, str(VM_DIR / "run-scenario"), "--out", str(out), *map(str, args)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)


def test_scenario_without_agent(vm_image, tmp_path):
    """run-scenario as one runs it by hand, on a kernel other than the default (the fixtures' boots
    of every kernel show the rest)."""
    out, kernel = tmp_path / "s", "6.12"
    p = run_scenario(out, "--kernel", kernel, "--no-agent", "--nfs-vers", "3", "--slots", "2",
                     "--delay-ms", "5", "--ranks", "3", "--write-size", "65536", "--mode", "fsync",
                     "--file-mb", "1", "--rank-override", "1:write-size=4096,mode=osync")
    assert p.returncode == 0, p.stderr
    rec = json.loads((out / "scenario.json").read_text())
    assert rec["kernel"].startswith(kernel + ".")
    # bytes as the server's own filesystem sees them
    assert rec["server_bytes"] == 3 * MiB
    assert rec["server_files"] == {f"rank{r:04d}/shard0.bin": MiB for r in range(3)}
    assert [r["rank"] for r in rec["ranks"]] == [0, 1, 2]
    assert all(r["bytes"] == MiB and r["wall_s"] > 0 for r in rec["ranks"])
    assert rec["ranks"][1]["mode"] == "osync" and rec["ranks"][1]["write_size"] == 4096
    # the traffic crossed the veth link
    rx = rec["link_after"]["server_veth0"]["rx_bytes"] - rec["link_before"]["server_veth0"]["rx_bytes"]
    assert rx > 3 * MiB
    before = mountstats.parse((out / "mountstats.before").read_text())
    after = mountstats.parse((out / "mountstats.after").read_text())
    assert after["ops"]["WRITE"]["ops"] > before["ops"]["WRITE"]["ops"]
    # the NFSv3 slot limit held: the transport never had more than 2 requests
    assert after["xprt"] and all(x["max_slots"] <= 2 for x in after["xprt"])
    for f in ("nfsstat.before", "nfsstat.after", "console.log", "job.log"):
        assert (out / f).stat().st_size > 0, f


def test_scenario_with_agent_returns_capture(small_sync):
    """The agent inside the VM, default filter (files on NFS mounts): every rank is
    named, with exactly the bytes and write() calls the writers made (8 ranks of 4 KiB
    O_SYNC writes, a scenario sharing its boot with others)."""
    out = small_sync
    rec = json.loads((out / "scenario.json").read_text())
    res = subprocess.run([sys.executable, "-m", "slotscope.cli", "analyze", "--json", str(out / "capture")],
                         capture_output=True, text=True, check=False, cwd=REPO)
    assert res.returncode == 0, res.stderr
    ranks = {r["rank"]: r for r in json.loads(res.stdout)["ranks"]}
    assert sorted(ranks) == list(range(8))
    for want in rec["ranks"]:
        got = ranks[want["rank"]]
        assert got["bytes_written"] == want["bytes"]
        assert got["syscalls"]["write"]["count"] == want["bytes"] // 4096
        assert want["pid"] in got["pids"]
    meta = json.loads((out / "capture" / "meta.json").read_text())
    assert [m["fstype"] for m in meta["nfs_mounts"]] == ["nfs"]
    assert meta["stop_reason"] == "SIGUSR1"    # the boot's agent ended its capture after the writers


def test_hung_vm_is_killed_at_timeout(vm_image, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "job").write_text("#!/bin/sh\necho job-started-and-hangs\nexec sleep 100000\n")
    (job / "job").chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(VMTimeout) as err:
        run_vm(vm_image, "6.1", job, tmp_path / "console.log", timeout=45)
    assert time.monotonic() - t0 < 60
    assert "45 s timeout" in str(err.value)
    assert "job-started-and-hangs" in str(err.value)  # the console tail is in the message


def test_run_scenario_reports_timeout(vm_image, tmp_path):
    """A scenario whose server never comes back (its writers sleep in the kernel for good) is
    killed at its budget, and the command says which, with the console's last lines."""
    p = run_scenario(tmp_path / "s", "--no-agent", "--timeout", "15", "--server-freeze-at", "0",
                     "--server-freeze-for", "100000", "--writer-timeout", "100000")
    assert p.returncode == 1
    assert "scenario s hung: still running after 15 s" in p.stderr and "Console" in p.stderr


def test_only_a_crash_before_the_job_is_booted_again(tmp_path):
    """A kernel that oopsed while booting (seen under TCG with 6.12) ran nothing of the job:
    run_vm boots once more. A panic after the job started is the job's failure, not retried."""
    console = tmp_path / "console.log"
    assert not crashed_before_job(console)                       # no console at all
    console.write_text("[ 2.03] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI\n"
                       "[ 2.03] Kernel panic - not syncing: Fatal exception in interrupt\n")
    assert crashed_before_job(console)
    console.write_text("vminit: running /job/job (uptime 3.1s)\n"
                       "[ 9.50] Kernel panic - not syncing: hung_task: blocked tasks\n")
    assert not crashed_before_job(console)
    console.write_text("vminit: up, kernel 6.12.95+deb12-amd64 (uptime 2.9s)\n")
    assert not crashed_before_job(console)                       # no panic: the job's own trouble
