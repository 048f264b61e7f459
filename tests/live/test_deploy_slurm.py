"""deploy/slurm's prolog and epilog, run as slurmd runs them: as root, with only the variables
slurmd gives (no PATH), in their own process group, killed once the script exits, from slurmd's
cgroup. Between them a job of an ordinary user writes a checkpoint from the cgroup slurmstepd
would make for it, while a process outside the job writes beside it."""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pyarrow.compute as pc
import pytest
from cgroups import cgroup2_root, into

from slotscope.capture.reader import Capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]

SLURM = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "slurm")
SCRIPTS = ("common.sh", "prolog.sh", "epilog.sh")
JOB_UID = JOB_GID = 65534            # nobody: the job's user
NODE = "node1"
CHUNK, CHUNKS = 4096, 50
# The job: a checkpoint of 50 fsync'd 4 KiB writes.
JOB = f"""
import os, sys
fd = os.open(os.path.join(sys.argv[1], "ckpt.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for _ in range({CHUNKS}):
    os.write(fd, b"c" * {CHUNK})
    os.fsync(fd)
os.close(fd)
"""
# Not the job: root writing beside it until killed.
OUTSIDE = """
import os, sys, time
fd = os.open(os.path.join(sys.argv[1], "outside.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
while True:
    os.write(fd, b"o" * 512)
    time.sleep(0.01)
"""


def _cgroup2_root() -> str:
    root = cgroup2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    return root


def _in_cgroup(cgroup: str, argv: list[str], **kw) -> subprocess.Popen:
    """argv started inside `cgroup`."""
    return subprocess.Popen([*into(cgroup), *argv], **kw)


class Node:
    """A compute node's slurmd as far as the scripts see it: their folder with a
    slotscope-slurm.conf, slurmd's cgroup, and the job's variables."""

    def __init__(self, base: str, cgroups: str, job_id: int, conf: str):
        self.base, self.cgroups, self.job_id = base, cgroups, job_id
        self.etc = os.path.join(base, "etc")
        os.mkdir(self.etc, 0o755)
        for name in SCRIPTS:
            shutil.copy(os.path.join(SLURM, name), self.etc)
        with open(os.path.join(self.etc, "slotscope-slurm.conf"), "w") as f:
            f.write(f"SLOTSCOPE={os.path.join(os.path.dirname(sys.executable), 'slotscope')}\n"
                    f"CAPTURES={base}/captures\nSTATE={base}/state\n{conf}")
        self.slurmd = os.path.join(cgroups, "slurmd.service")
        os.makedirs(self.slurmd)
        self.name = f"job-{job_id}-{NODE}"

    def run(self, script: str, context: str, **more) -> subprocess.CompletedProcess:
        """As slurmd runs a Prolog or Epilog; then its process group is killed, as slurmd does."""
        env = {"SLURM_JOB_ID": str(self.job_id), "SLURM_JOBID": str(self.job_id), "SLURM_JOB_UID": str(JOB_UID),
               "SLURM_JOB_GID": str(JOB_GID), "SLURM_JOB_USER": "nobody", "SLURM_JOB_GROUP": "nogroup",
               "SLURMD_NODENAME": NODE, "SLURM_CLUSTER_NAME": "test", "SLURM_JOB_PARTITION": "debug",
               "SLURM_JOB_ACCOUNT": "test", "SLURM_JOB_NUM_NODES": "1", "SLURM_CONF": "/etc/slurm/slurm.conf",
               "SLURM_SCRIPT_CONTEXT": context, **more}
        proc = _in_cgroup(self.slurmd, [os.path.join(self.etc, script)], env=env, preexec_fn=os.setpgrp,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=300)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def state(self, suffix: str) -> str:
        return os.path.join(self.base, "state", self.name + suffix)

    def wait_recording(self, timeout: float = 180.0) -> None:
        end = time.monotonic() + timeout
        text = ""
        while time.monotonic() < end:
            try:
                with open(self.state(".log")) as f:
                    text = f.read()
            except FileNotFoundError:
                pass
            if "recording to" in text:
                return
            time.sleep(0.5)
        raise AssertionError(f"the recorder did not start: {text}")


def _as_job_user(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_GID}", "--clear-groups", *argv],
                          capture_output=True, text=True, timeout=60)


def _mode(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, stat.S_IMODE(st.st_mode)


@pytest.fixture
def node_base():
    """A root-owned folder reachable by everyone, as /var/lib is (pytest's tmp_path is not)."""
    base = tempfile.mkdtemp(prefix="slotscope-slurm-", dir="/tmp")
    os.chmod(base, 0o711)
    cgroups = os.path.join(_cgroup2_root(), os.path.basename(base))    # a test's own: one left does not
    yield base, cgroups                                                 # stop the next from making it
    left = []
    for top, _dirs, _files in os.walk(cgroups, topdown=False):
        left += _emptied(top)
        os.rmdir(top)
    shutil.rmtree(base)
    assert not left, f"processes left in the node's cgroups after the scripts: {left}"


def _emptied(cgroup: str, wait: float = 10.0) -> list[str]:
    """The processes still in `cgroup` (their command lines), killed. A process the scripts
    stopped may still be exiting (closing its BPF programs takes a moment): it is given `wait` s."""
    end, seen = time.monotonic() + wait, []
    while "populated 1" in open(os.path.join(cgroup, "cgroup.events")).read():
        if time.monotonic() > end:
            assert not seen, f"{cgroup}: unkillable processes: {seen}"
            for pid in open(os.path.join(cgroup, "cgroup.procs")).read().split():
                try:
                    seen.append(open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip())
                    os.kill(int(pid), signal.SIGKILL)
                except (FileNotFoundError, ProcessLookupError):
                    pass
            end = time.monotonic() + wait
        time.sleep(0.05)
    return seen


@pytest.mark.parametrize("scoped", [True, False], ids=["job-cgroup", "no-cgroup"])
def test_prolog_and_epilog_record_the_job_and_write_its_report(node_base, scoped):
    """With the job's cgroup (derived from slurmd's, made after the prolog returned), the
    capture holds the job's writes and nothing of the process beside it, and the report is
    the job user's to read (0400 in a root directory 0711) while the capture stays root's. When
    the job's cgroup never appears, the recorder records every process's files after
    CGROUP_WAIT, and the report stays root's too."""
    base, cgroups = node_base
    data = os.path.join(base, "data")
    os.mkdir(data, 0o700)
    os.chown(data, JOB_UID, JOB_GID)
    job_id = 4000 + os.getpid() % 1000
    node = Node(base, cgroups, job_id, f"RECORD_ARGS=(--path {data})\n" +
                ("" if scoped else f"JOB_CGROUP={cgroups}/never\nCGROUP_WAIT=1\n"))
    job_cgroup = os.path.join(cgroups, "slurmstepd.scope", f"job_{job_id}")
    outside = job = None
    try:
        prolog = node.run("prolog.sh", "prolog_slurmd")
        assert prolog.returncode == 0 and prolog.stderr == "", prolog
        step = os.path.join(job_cgroup, "step_batch")
        os.makedirs(step)                   # slurmstepd, once the prolog has returned
        node.wait_recording()
        outside = subprocess.Popen([sys.executable, "-c", OUTSIDE, data])
        job = _in_cgroup(step, ["setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_GID}", "--clear-groups",
                                sys.executable, "-c", JOB, data])
        assert job.wait(120) == 0
        outside.kill()
        outside.wait()
        os.rmdir(step)
        os.rmdir(job_cgroup)                # slurmstepd, at the job's end
        epilog = node.run("epilog.sh", "epilog_slurmd", SLURM_JOB_EXIT_CODE="0", SLURM_JOB_DERIVED_EC="0")
        assert epilog.returncode == 0, epilog
    finally:
        for p in (outside, job):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        try:
            os.kill(int(open(node.state(".pid")).read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    assert not os.path.exists(node.state(".pid")) and not os.path.exists(node.state(".log"))

    capture = os.path.join(base, "captures", node.name)
    assert _mode(capture) == (0, 0o700) and _mode(os.path.join(capture, "meta.json")) == (0, 0o600)
    rows = Capture.open(capture).read("syscall")
    written = pc.fill_null(rows["bytes"], 0)
    ckpt = pc.equal(rows["path"], os.path.join(data, "ckpt.bin"))
    assert pc.sum(pc.filter(written, ckpt)).as_py() == CHUNK * CHUNKS
    assert set(pc.filter(rows["tgid"], ckpt).to_pylist()) == {job.pid}
    beside = pc.sum(pc.cast(pc.equal(rows["path"], os.path.join(data, "outside.bin")), "int64")).as_py()
    assert (beside == 0) if scoped else (beside > 0)

    report = capture + ".report"
    names = ("report.txt", "report.json", "report.html")
    doc = json.load(open(os.path.join(report, "report.json")))
    mine = [r for r in doc["ranks"] if job.pid in r["pids"]]
    assert sum(r["bytes_written"] for r in mine) == CHUNK * CHUNKS, doc["ranks"]
    if scoped:
        assert _mode(report) == (0, 0o711)
        assert {_mode(os.path.join(report, n)) for n in names} == {(JOB_UID, 0o400)}
        read = _as_job_user("cat", os.path.join(report, "report.txt"))
        assert read.returncode == 0 and read.stdout == open(os.path.join(report, "report.txt")).read()
    else:
        assert _mode(report) == (0, 0o700)
        assert {_mode(os.path.join(report, n)) for n in names} == {(0, 0o600)}
        assert _as_job_user("cat", os.path.join(report, "report.txt")).returncode != 0
    assert _as_job_user("ls", report).returncode != 0
    assert _as_job_user("cat", os.path.join(capture, "meta.json")).returncode != 0


@pytest.mark.parametrize("plant", ["writable-above", "link"])
def test_the_prolog_writes_nowhere_another_user_could_redirect(node_base, plant):
    """CAPTURES under a directory others may write to (not sticky), or through a link another
    user owns: the prolog starts no recorder, says why, and still exits 0 (a failing Prolog
    drains the node)."""
    base, cgroups = node_base
    if plant == "writable-above":
        above = os.path.join(base, "shared")
        os.mkdir(above)
        os.chmod(above, 0o777)
        captures = os.path.join(above, "captures")
    else:
        os.mkdir(os.path.join(base, "real"), 0o711)
        os.symlink(os.path.join(base, "real"), os.path.join(base, "link"))
        os.lchown(os.path.join(base, "link"), JOB_UID, JOB_GID)
        captures = os.path.join(base, "link", "captures")
    node = Node(base, cgroups, 4242, f"CAPTURES={captures}\n")
    prolog = node.run("prolog.sh", "prolog_slurmd")
    assert prolog.returncode == 0
    assert f"{captures} is not root's alone (or has a symbolic link in it): not recorded" in prolog.stderr
    assert not os.path.exists(node.state(".pid"))


def test_settings_others_may_write_are_ignored(node_base):
    base, cgroups = node_base
    if os.path.exists("/usr/local/bin/slotscope"):
        pytest.skip("the defaults would record for real: /usr/local/bin/slotscope is installed here")
    node = Node(base, cgroups, 4243, "")
    conf = os.path.join(node.etc, "slotscope-slurm.conf")
    os.chmod(conf, 0o666)
    prolog = node.run("prolog.sh", "prolog_slurmd")
    assert prolog.returncode == 0
    assert f"{conf} is not root's alone: ignored, defaults used" in prolog.stderr
    assert "no /usr/local/bin/slotscope (SLOTSCOPE in slotscope-slurm.conf): not recorded" in prolog.stderr
