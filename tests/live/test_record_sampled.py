"""`record` for those who cannot load BPF (issue 22): run as an ordinary user (setpriv to nobody),
it says in one line why it samples /proc and mountstats instead, and records a job that writes a
file and then blocks writing into a FIFO nobody reads yet: its rank, the thread blocked in write on
the FIFO's path, its bytes written growing, the command's end; files the user's own, 0600/0700.
And `--no-bpf` as root records the same, without the line."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pyarrow.compute as pc
import pytest

from slotscope.analyzer.job import Job
from slotscope.capture.reader import Capture

pytestmark = pytest.mark.live

NOBODY_UID = 65534
NOBODY = ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_UID}", "--clear-groups"]
FALLBACK = "BPF cannot be used here"
RANK_ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
# The wait channels of a writer blocked on a full pipe, across kernels.
PIPE_WAITS = ("pipe_write", "anon_pipe_write", "pipe_wait", "pipe_wait_writable")


def _runs_as_nobody(python: str) -> bool:
    return subprocess.run([*NOBODY, python, "-c", "pass"], capture_output=True).returncode == 0


def _python_for_nobody() -> str:
    """An interpreter `nobody` may run, of this one's version (this one may live under /root):
    it loads this checkout's packages from the venv's site-packages."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(python) and _runs_as_nobody(python):
            return python
    pytest.skip(f"no {version} that the user nobody may run")


def _boot() -> str:
    """`python -c` code that runs slotscope's CLI from the venv's site-packages (the checkout's
    editable install), for an interpreter outside the venv."""
    site = sysconfig.get_paths()["purelib"]
    return (f"import runpy, site, sys; site.addsitedir({site!r}); sys.argv[0] = 'slotscope'; "
            f"runpy.run_module('slotscope.cli', run_name='__main__')")


def _slotscope_as(user: list[str], *args: str, cwd: str) -> subprocess.CompletedProcess:
    python = _python_for_nobody() if user else sys.executable
    return subprocess.run([*user, python, "-c", _boot(), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, **RANK_ENV, "HOME": cwd})


@pytest.fixture
def home():
    """A directory of nobody's own, which nobody can reach (pytest's tmp_path is root's 0700)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to become an ordinary user")
    d = Path(tempfile.mkdtemp(prefix="slotscope-sampled-", dir="/tmp"))
    os.chown(d, NOBODY_UID, NOBODY_UID)
    yield d
    shutil.rmtree(d)


def _job(home: Path) -> list[str]:
    """Writes a file line by line, then blocks writing 300 kB into a FIFO whose reader holds it
    open without reading for 1.5 s."""
    fifo, out = home / "fifo", home / "out"
    return ["sh", "-c", f"i=0; while [ $i -lt 10 ]; do echo line $i >> {out}; i=$((i+1)); sleep 0.05; done; "
                        f"mkfifo {fifo}; (exec 3<{fifo}; sleep 1.5; cat <&3 >/dev/null) & "
                        f"head -c 300000 /dev/zero > {fifo}; wait"]


def _check_capture(cap: Path, fifo: Path, uid: int, reason: str) -> None:
    c = Capture.open(str(cap))
    assert c.meta["sampled"]["reason"] == reason and c.meta["sampled"]["interval_ns"] == 100_000_000
    assert c.meta["stop_reason"] == "command exited"
    procs = c.read("procs").to_pylist()
    assert {p["rank"] for p in procs if p["comm"] == "head"} == {3}
    assert {(p["local_rank"], p["world_size"]) for p in procs if p["comm"] == "head"} == {(1, 8)}
    [head] = [p["tgid"] for p in procs if p["comm"] == "head"]
    samples = c.read("thread_samples").to_pylist()
    blocked = [s for s in samples if s["tgid"] == head and s["syscall"] == "write"]
    assert len(blocked) >= 5, samples
    assert {s["path"] for s in blocked} == {str(fifo)}
    assert all(s["wchan"] in PIPE_WAITS and s["state"] == "S" and s["read_ok"] and s["fd"] == 1 for s in blocked)
    # the shell's own writes into the file (echo is a builtin) grow its wchar
    io = c.read("proc_io")
    [shell] = [p["tgid"] for p in procs if p["comm"] == "sh" and p["ppid"] not in {q["tgid"] for q in procs}]
    wchar = io.filter(pc.equal(io["tgid"], shell))["wchar"].to_pylist()
    assert wchar == sorted(wchar) and wchar[-1] > wchar[0], wchar
    for folder, dirs, files in os.walk(cap):
        assert os.stat(folder).st_uid == uid and stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        for f in files:
            st = os.stat(os.path.join(folder, f))
            assert st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o600, f


def test_an_ordinary_user_records_sampled(home):
    cap = home / "cap"
    res = _slotscope_as(NOBODY, "record", "-o", str(cap), "--", *_job(home), cwd=str(home))
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if FALLBACK in line]
    assert len(said) == 1 and "needs root (CAP_BPF and CAP_PERFMON)" in said[0], res.stderr
    _check_capture(cap, home / "fifo", NOBODY_UID, Capture.open(str(cap)).meta["sampled"]["reason"])
    assert "CAP_BPF" in Capture.open(str(cap)).meta["sampled"]["reason"]


def test_an_ordinary_user_who_insists_on_bpf_gets_the_failure(home):
    res = _slotscope_as(NOBODY, "record", "--bpf", "-o", str(home / "cap"), "--", "true", cwd=str(home))
    assert res.returncode == 1 and FALLBACK not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "slotscope record: cannot trace syscalls: needs root (CAP_BPF and CAP_PERFMON): run with sudo"]


def test_no_bpf_as_root_records_the_same(home):
    if os.geteuid() != 0:
        pytest.skip("this one is root's")
    cap = home / "cap"
    res = _slotscope_as([], "record", "--no-bpf", "-o", str(cap), "--", *_job(home), cwd=str(home))
    assert res.returncode == 0 and FALLBACK not in res.stderr, res.stderr
    _check_capture(cap, home / "fifo", 0, "--no-bpf")


def test_short_lived_ranks_keep_their_rank(home):
    """Processes of the job that live 0.7 s: each is found by a look at /proc (every 0.5 s) and
    read at once, not at the recorder's next second, by when it was gone (a VM rig save of 1 s
    lost every rank's). Six ranks, started 0.3 s apart, each `sleep` with its RANK."""
    cap = home / "cap"
    job = "sleep 1; for r in 0 1 2 3 4 5; do env RANK=$r WORLD_SIZE=6 sleep 0.7 & sleep 0.3; done; wait"
    res = _slotscope_as([], "record", "--no-bpf", "-o", str(cap), "--", "sh", "-c", job, cwd=str(home))
    assert res.returncode == 0, res.stderr
    # as the readers see them: a process read again (its identity incomplete at first, or across
    # its exec from env to sleep) has several rows, the best of which counts (Job.identities)
    procs = Job.open([str(cap)]).identities().to_pylist()
    assert sorted(p["rank"] for p in procs if p["comm"] == "sleep" and p["world_size"] == 6) == list(range(6)), procs


def test_an_ordinary_users_saves_and_ranks(home):
    """What the reports and the TUI show of a sampled capture (analyzer/sampled_activity.py), on
    a real one recorded as nobody: three ranks each write two saves of 4 MiB (in 64 KiB writes,
    fsync'd), 4 s apart, and stay a second after each (a trainer goes on): two saves of 12 MiB
    (parted at 1.5 s: a sleeping rank's counters are read once a second, so its first write after
    a sleep is placed within that second),
    each rank's 8 MiB, none of it counted again for the shell, which gains its children's counters
    when it reaps them."""
    ckpt = home / "ckpt"
    (home / "writer.py").write_text(
        "import os, sys, time\n"
        "for save in (1, 2):\n"
        "    with open(f'{sys.argv[1]}/s{save}-r{os.environ[\"RANK\"]}', 'wb') as f:\n"
        "        for _ in range(64):\n"
        "            f.write(b'x' * 65536); os.fsync(f.fileno()); time.sleep(0.01)\n"
        "    time.sleep(4 if save == 1 else 1)\n")
    # the system's interpreter: the writer needs only the standard library, and nobody may run it
    job = f"mkdir {ckpt}; for r in 0 1 2; do RANK=$r WORLD_SIZE=3 /usr/bin/python3 {home}/writer.py {ckpt} & done; wait"
    cap = home / "cap"
    res = _slotscope_as(NOBODY, "record", "-o", str(cap), "--path", str(ckpt), "--", "sh", "-c", job, cwd=str(home))
    assert res.returncode == 0, res.stderr
    got = subprocess.run([sys.executable, "-m", "slotscope.cli", "analyze", "--json", "--threshold",
                          "save_gap_s=1.5", str(cap)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout)
    mib = 1 << 20
    ranks = {r["rank"]: r for r in result["ranks"] if r["bytes_written"] >= mib}
    # the shell (RANK 3 from the recorder's environment) may keep a page or so of a short-lived child
    # (mkdir) that no sample saw: the rule is that what a child wrote after its last sample is its parent's
    assert sorted(ranks) == [0, 1, 2] and all(r["from_samples"] for r in ranks.values()), \
        [(r["rank"], r["comm"], r["bytes_written"]) for r in result["ranks"]]
    for r in ranks.values():            # write_bytes counts pages dirtied: a page or so more is the file's
        assert 8 * mib <= r["bytes_written"] < 8.5 * mib, r
    saves = result["saves"]
    assert [s["number"] for s in saves] == [1, 2], saves
    for s in saves:
        assert 12 * mib <= s["bytes"] < 12.5 * mib, s
        assert sorted(b["rank"] for b in s["by_rank"] if b["bytes"] >= mib) == [0, 1, 2], s
        # the files are those a sample found a rank writing or syncing: which, is the samples' luck
        assert s["directory"] in (None, str(ckpt)) and s["files"] <= 3, s
    assert saves[1]["start"] > saves[0]["end"]
