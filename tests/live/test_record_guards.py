"""What a careless or hostile user meets when `record` runs as root (issue 18): a second agent,
a planted link on the way to the output, an output it cannot write, options that mean nothing,
a write storm against the capture's size. Each answered in one line, nothing lost."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest
from livehelp import slotscope, start_slotscope, wait_recording

from slotscope.capture.reader import Capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _one_line_error(res, *wanted):
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in wanted), res.stderr


def test_a_second_agent_is_refused_from_the_first_instant(tmp_path):
    """The second starts while the first is still compiling (before its meta.json): refused
    with the first's pid, with or without --force, and the first's capture is whole."""
    cap = tmp_path / "cap"
    first = start_slotscope("record", "-o", str(cap), "--path", str(tmp_path / "none"), "-q")
    try:
        deadline = time.monotonic() + 30
        while not (cap / ".lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for extra in ([], ["--force"]):
            second = slotscope("record", "-o", str(cap), "--duration", "1", *extra)
            _one_line_error(second, f"another slotscope (pid {first.pid}) is recording into it")
        wait_recording(first)
        first.send_signal(signal.SIGINT)
        assert first.wait(60) == 0
    finally:
        first.kill()
    assert Capture.open(str(cap)).meta["stop_reason"] == "SIGINT"
    # the lock goes with the agent: a later recording into it (with --force) is let in
    res = slotscope("record", "-o", str(cap), "--duration", "1", "--force", "-q")
    assert res.returncode == 0, res.stderr


@pytest.fixture
def shared_tmp():
    """A sticky world-writable directory, as /tmp is, that an ordinary user can plant links in."""
    d = Path(tempfile.mkdtemp(prefix="slotscope-shared-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d)


def test_a_link_an_ordinary_user_planted_on_the_way_is_not_followed(shared_tmp):
    """`record -o /tmp/evilp/cap`, /tmp/evilp a link another user planted (to a directory of
    theirs here; to /etc in an attack): refused, and nothing is written where it points."""
    subprocess.run([*NOBODY, "mkdir", str(shared_tmp / "theirs")], check=True)
    subprocess.run([*NOBODY, "ln", "-s", str(shared_tmp / "theirs"), str(shared_tmp / "evilp")], check=True)
    res = slotscope("record", "-o", str(shared_tmp / "evilp" / "cap"), "--duration", "1")
    _one_line_error(res, f"{shared_tmp}/evilp is a symbolic link owned by uid 65534")
    assert os.listdir(shared_tmp / "theirs") == []
    # the same link made by root (as /var/run -> /run is) is followed
    os.symlink(shared_tmp / "mine", shared_tmp / "ours")
    (shared_tmp / "mine").mkdir()
    res = slotscope("record", "-o", str(shared_tmp / "ours" / "cap"), "--duration", "1", "-q")
    assert res.returncode == 0, res.stderr
    assert (shared_tmp / "mine" / "cap" / "meta.json").exists()


def test_outputs_it_cannot_write_are_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        _one_line_error(slotscope("record", "-o", str(ro / "cap"), "--duration", "1"),
                        "cannot create the capture there: Read-only file system")
        _one_line_error(slotscope("record", "-o", str(ro), "--duration", "1"),
                        "cannot write the capture there: Read-only file system")
    finally:
        subprocess.run(["umount", str(ro)], check=False)
    _one_line_error(slotscope("record", "-o", str(tmp_path / "no" / "such" / "cap"), "--duration", "1"),
                    f"cannot create the capture there: no such directory: {tmp_path}/no/such")


@pytest.mark.parametrize("value", ["0", "nan", "-5", "inf", "soon"])
def test_a_duration_that_is_not_a_positive_number_is_refused(tmp_path, value):
    res = slotscope("record", "-o", str(tmp_path / "cap"), f"--duration={value}")
    assert res.returncode == 2 and "want a positive number of seconds" in res.stderr
    assert not (tmp_path / "cap").exists()


def test_filters_that_match_nothing_are_said(tmp_path):
    res = slotscope("record", "-o", str(tmp_path / "cap"), "--fs", "bogus", "--path", "/does/not/exist",
                    "--duration", "1", "-q")
    assert res.returncode == 0, res.stderr
    assert "--path /does/not/exist: does not exist (yet)" in res.stderr
    assert "--fs bogus: the kernel knows no such filesystem type" in res.stderr


def test_the_default_filter_without_an_nfs_mount_is_said(tmp_path):
    """By default only files on NFS mounts are recorded: on a machine without one, a line at the
    start says that nothing can match and how to widen the filter; with --path, no such line."""
    from slotscope.agent.files import mount_tables
    if any(m.is_nfs for table in mount_tables() for m in table.by_point.values()):
        pytest.skip("this machine has an NFS mount")
    res = slotscope("record", "-o", str(tmp_path / "cap"), "--duration", "1", "-q")
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if "no NFS mount" in line]
    assert len(said) == 1 and "nothing can match" in said[0], res.stderr
    assert "--path DIR" in said[0] and "--fs any" in said[0]
    assert res.stderr.index("no NFS mount") < res.stderr.index("recording to")
    res = slotscope("record", "-o", str(tmp_path / "cap2"), "--path", str(tmp_path), "--duration", "1", "-q")
    assert res.returncode == 0 and "no NFS mount" not in res.stderr, res.stderr


def test_a_command_that_is_not_executable_is_named_so(tmp_path):
    script = tmp_path / "save.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    _one_line_error(slotscope("record", "-o", str(tmp_path / "cap"), "--", str(script)),
                    f"cannot run {script}: not an executable file")
    _one_line_error(slotscope("record", "-o", str(tmp_path / "cap2"), "--", "no-such-command-here"),
                    "cannot run no-such-command-here: command not found")


def test_max_size_bounds_a_write_storm_and_counts_the_rest_as_lost(tmp_path):
    """One process writing 1-byte chunks as fast as it can (today ~65 MiB of capture a
    second here): --max-size 1M holds the capture near 1 MiB, and the rows past it are in
    the loss table, as the analysis counts any loss."""
    d = tmp_path / "d"
    d.mkdir()
    code = ("import os,sys,time\nfd=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT,0o600)\n"
            "end=time.time()+float(sys.argv[2])\nwhile time.time()<end: os.write(fd,b'x')\n")
    agent = start_slotscope("record", "-o", str(tmp_path / "cap"), "--path", str(d), "--max-size", "1M", "-q")
    wait_recording(agent)
    subprocess.run([sys.executable, "-c", code, str(d / "f"), "3"], check=True)
    agent.send_signal(signal.SIGINT)
    assert agent.wait(60) == 0
    err = agent.stderr.read()
    assert err.count("reached its size limit (1 MiB, --max-size)") == 1, err
    size = sum(f.stat().st_size for f in (tmp_path / "cap").rglob("*.arrow"))
    assert size <= 2**20 + 64 * 2**10, size      # the limit, and the loss and agent rows past it
    cap = Capture.open(str(tmp_path / "cap"))
    loss = cap.read("loss")
    over = loss.filter(pc.equal(loss["counter"], "max_size_rows"))
    assert pc.sum(over["lost"]).as_py() > 10_000
    assert cap.read("syscall").num_rows > 1000       # the storm's start, up to the limit
    assert cap.meta["totals"]["rows_over_max_size"]["syscall"] >= pc.sum(over["lost"]).as_py()


def test_reports_and_exports_written_as_root_follow_no_planted_link(shared_tmp):
    """analyze --html, export --parquet and demo --keep, run as root: not through a link another
    user planted on the way, not over another user's file."""
    from slotscope.cli.demo import sample_path
    subprocess.run([*NOBODY, "mkdir", str(shared_tmp / "theirs")], check=True)
    subprocess.run([*NOBODY, "ln", "-s", str(shared_tmp / "theirs"), str(shared_tmp / "evilp")], check=True)
    subprocess.run([*NOBODY, "sh", "-c", f"echo theirs > {shared_tmp}/report.html"], check=True)
    for args in (["analyze", sample_path(), "--html", str(shared_tmp / "evilp" / "r.html")],
                 ["export", sample_path(), "--parquet", str(shared_tmp / "evilp" / "out")]):
        _one_line_error(slotscope(*args), f"{shared_tmp}/evilp is a symbolic link owned by uid 65534")
    res = slotscope("demo", "--keep", str(shared_tmp / "evilp" / "cap"))    # its capture, kept where asked
    assert res.returncode == 1 and f"{shared_tmp}/evilp is a symbolic link owned by uid 65534" in res.stderr
    assert "Traceback" not in res.stderr
    assert os.listdir(shared_tmp / "theirs") == []
    res = slotscope("analyze", sample_path(), "--html", str(shared_tmp / "report.html"))
    assert res.returncode == 1 and "belongs to uid 65534; not replacing it" in res.stderr
    assert (shared_tmp / "report.html").read_text() == "theirs\n"


def test_short_lived_ranks_are_named(tmp_path):
    """200 rank processes, each writing one file and exiting at once (gone before /proc can be
    read): each carries its rank, read from its environment at execve."""
    d = tmp_path / "d"
    d.mkdir()
    script = f'i=0; while [ $i -lt 200 ]; do RANK=$i WORLD_SIZE=200 sh -c \'echo x > "$0"\' {d}/f$i; i=$((i+1)); done'
    res = slotscope("record", "-o", str(tmp_path / "cap"), "--path", str(d), "-q", "--", "sh", "-c", script,
                    timeout=300)
    assert res.returncode == 0, res.stderr
    out = slotscope("analyze", "--json", str(tmp_path / "cap"))
    ranks = {r["rank"]: r for r in json.loads(out.stdout)["ranks"] if r["rank"] is not None}
    assert sorted(ranks) == list(range(200)), sorted(ranks)
    wrong = {k: r["bytes_written"] for k, r in ranks.items() if r["bytes_written"] != 2}
    assert not wrong, (wrong, json.loads(out.stdout)["notes"])


def test_secrets_in_a_traced_shell_command_are_redacted(tmp_path):
    """The command line of the agent and of a traced process, as a shell string with secrets in
    it: neither meta.json nor the procs table keeps them."""
    d = tmp_path / "d"
    d.mkdir()
    script = (f"echo x > {d}/f --password hunter2 token=abcd; "
              f"export AWS_SECRET_ACCESS_KEY=wJalrXUtn; mysql -pS3cr3t 2>/dev/null; true")
    res = slotscope("record", "-o", str(tmp_path / "cap"), "--path", str(d), "-q", "--", "sh", "-c", script)
    assert res.returncode == 0, res.stderr
    cap = Capture.open(str(tmp_path / "cap"))
    stored = cap.meta["command"] + " ".join(p["cmdline"] for p in cap.read("procs").to_pylist())
    assert "echo x" in stored and "--password" in stored
    for secret in ("hunter2", "abcd", "wJalrXUtn", "S3cr3t"):
        assert secret not in stored, stored
    raw = (tmp_path / "cap" / "meta.json").read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "cap" / "procs").glob("*.arrow"))
    assert b"hunter2" not in raw and b"wJalrXUtn" not in raw
