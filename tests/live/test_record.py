"""The agent on this machine's kernel: real BCC, real processes, real Arrow files."""
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.compute as pc
import pytest
from cgroups import cgroup2_root
from livehelp import slotscope, start_slotscope, wait_recording

from slotscope.agent.clock import sync_state
from slotscope.capture.reader import Capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]

CHECKED_SYSCALLS = ("write", "pwrite64", "writev", "fsync", "close", "openat")


def _writer_loop(path, seconds, chunk=4096):
    """A process that appends to `path` until told to stop (or `seconds` pass)."""
    code = ("import os,sys,time\n"
            "fd=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT|os.O_APPEND,0o600)\n"
            "end=time.time()+float(sys.argv[2])\n"
            "while time.time()<end:\n"
            "    os.write(fd,b'u'*int(sys.argv[3])); time.sleep(0.002)\n")
    return subprocess.Popen([sys.executable, "-c", code, path, str(seconds), str(chunk)])


def test_ranks_bytes_and_syscalls_exact(tmp_path):
    """Four ranks, one writing from a thread and one from a child without rank variables:
    the analysis charges each rank exactly what it wrote, through which syscalls. A process
    writing under the same directory at the same time, not part of the command, is absent."""
    ckpt, cap, manifest = tmp_path / "ckpt", tmp_path / "cap", tmp_path / "manifest.json"
    ckpt.mkdir()
    intruder = _writer_loop(str(ckpt / "intruder.bin"), 30)
    try:
        res = slotscope("record", "-o", str(cap), "--path", str(ckpt), "-q", "--",
                        sys.executable, "-m", "slotscope.cli.workload", "--dir", str(ckpt),
                        "--ranks", "4", "--manifest", str(manifest))
    finally:
        intruder.kill()
        intruder.wait()
    assert res.returncode == 0, res.stderr
    truth = {r["rank"]: r for r in json.loads(manifest.read_text())["ranks"]}

    out = slotscope("analyze", "--json", str(cap))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    ranked = {r["rank"]: r for r in result["ranks"] if r["rank"] is not None}
    assert sorted(ranked) == [0, 1, 2, 3]
    for rank, want in truth.items():
        got = ranked[rank]
        assert got["bytes_written"] == want["bytes_written"], rank
        for name in CHECKED_SYSCALLS:
            assert got["syscalls"].get(name, {}).get("count", 0) == want["syscalls"].get(name, 0), (rank, name)
        assert want["pid"] in got["pids"]
    # rank 1's writer subprocess has no RANK of its own: inherited, in rank 1's pids
    assert len(ranked[1]["pids"]) == 2
    assert all(intruder.pid not in r["pids"] for r in result["ranks"])
    rows = Capture.open(str(cap)).read("syscall").to_pylist()
    assert not any(r["path"].endswith("intruder.bin") for r in rows)
    # files opened while recording are named with their inode and device too
    for r in rows:
        if r["syscall"] in ("write", "pwrite64", "writev"):
            st = os.stat(r["path"])
            assert (r["ino"], r["dev"], r["fstype"]) == (st.st_ino, st.st_dev, "ext4"), r


def test_unrelated_files_and_processes_filtered(tmp_path):
    """Tracing every process with a --path filter: rows only for files under the prefix."""
    inside, outside, cap = tmp_path / "in", tmp_path / "out", tmp_path / "cap"
    inside.mkdir()
    outside.mkdir()
    agent = start_slotscope("record", "-o", str(cap), "--path", str(inside), "-q")
    wait_recording(agent)
    a = _writer_loop(str(inside / "a.bin"), 1.0)
    b = _writer_loop(str(outside / "b.bin"), 1.0)
    a.wait()
    b.wait()
    time.sleep(0.3)
    agent.send_signal(signal.SIGINT)
    assert agent.wait(30) == 0, agent.stderr.read()
    t = Capture.open(str(cap)).read("syscall")
    paths = set(t["path"].to_pylist())
    assert str(inside / "a.bin") in paths
    assert not any(p.startswith(str(outside)) for p in paths if p)
    assert set(t["tgid"].to_pylist()) == {a.pid}


def test_fd_opened_before_recording_is_named(tmp_path):
    """A file opened before the agent started: its writes still name path, dev and inode."""
    target, go, cap = tmp_path / "early.bin", tmp_path / "go", tmp_path / "cap"
    code = ("import os,sys,time\n"
            "fd=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT,0o600)\n"
            "while not os.path.exists(sys.argv[2]): time.sleep(0.01)\n"
            "for i in range(5): os.write(fd,b'e'*1000)\n"
            "os.dup2(fd, 40); os.write(40, b'd'*10)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(target), str(go)])
    time.sleep(0.5)
    agent = start_slotscope("record", "-o", str(cap), "--pid", str(proc.pid), "--fs", "any", "-q")
    wait_recording(agent)
    go.touch()
    proc.wait()
    time.sleep(0.3)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(30) == 0, agent.stderr.read()
    t = Capture.open(str(cap)).read("syscall")
    writes = t.filter(pc.equal(t["syscall"].cast("string"), "write"))
    st = os.stat(target)
    assert writes.num_rows == 6
    assert set(writes["path"].to_pylist()) == {str(target)}
    assert set(writes["ino"].to_pylist()) == {st.st_ino}
    assert set(writes["dev"].to_pylist()) == {st.st_dev}
    assert pc.sum(writes["bytes"]).as_py() == 5010
    assert writes["fd"].to_pylist().count(40) == 1   # the write through the dup2'ed fd


def test_rename_and_open_rows_name_both_paths(tmp_path):
    cap, d = tmp_path / "cap", tmp_path / "d"
    d.mkdir()
    code = ("import os,sys\n"
            "p=os.path.join(sys.argv[1],'x.tmp')\n"
            "fd=os.open(p,os.O_WRONLY|os.O_CREAT,0o600); os.write(fd,b'1'); os.close(fd)\n"
            "os.rename(p, os.path.join(sys.argv[1],'x.final'))\n")
    res = slotscope("record", "-o", str(cap), "--path", str(d), "-q", "--", sys.executable, "-c", code, str(d))
    assert res.returncode == 0, res.stderr
    t = Capture.open(str(cap)).read("syscall").to_pylist()
    ren = [r for r in t if r["syscall"] == "rename"]
    assert len(ren) == 1
    assert ren[0]["path"] == str(d / "x.tmp") and ren[0]["path2"] == str(d / "x.final")
    opens = [r for r in t if r["syscall"] == "openat"]
    assert opens and opens[0]["fd"] == -100 and opens[0]["ret"] >= 0


def test_command_exit_status_and_clean_stop(tmp_path):
    res = slotscope("record", "-o", str(tmp_path / "cap"), "--fs", "any", "-q", "--", "sh", "-c", "exit 3")
    assert res.returncode == 3
    cap = Capture.open(str(tmp_path / "cap"))
    assert cap.meta["stop_reason"] == "command exited"
    assert "stop" in cap.meta
    # the kernel's NTP state at the start, as the analyzer states each capture's clock from it
    assert cap.meta["clock_sync"] == {**cap.meta["clock_sync"], "synchronized": sync_state()["synchronized"]}


def test_duration_and_sigterm_stop(tmp_path):
    t0 = time.monotonic()
    res = slotscope("record", "-o", str(tmp_path / "c1"), "--duration", "2", "-q", "--bpf-stats")
    assert res.returncode == 0, res.stderr
    c1 = Capture.open(str(tmp_path / "c1"))
    assert c1.meta["stop_reason"] == "duration reached"
    # with --bpf-stats, the agent's own row: its programs ran (every process's syscalls hit them),
    # as their fdinfo says
    last = c1.read("agent").to_pylist()[-1]
    assert last["bpf_run_cnt"] > 0 and last["bpf_run_ns"] > 0
    # and meta.json has each program's share, read after that row: at least as much
    runtime = c1.meta["probes"]["runtime"]
    assert runtime["tracepoint__syscalls__sys_enter_write"]["run_cnt"] > 0   # the agent's own writes run it
    assert sum(p["run_cnt"] for p in runtime.values()) >= last["bpf_run_cnt"]
    assert sum(p["run_ns"] for p in runtime.values()) >= last["bpf_run_ns"]
    assert time.monotonic() - t0 < 60
    agent = start_slotscope("record", "-o", str(tmp_path / "c2"))
    wait_recording(agent)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(30) == 0
    assert "stopped (SIGTERM)" in agent.stderr.read()
    assert Capture.open(str(tmp_path / "c2")).meta["stop_reason"] == "SIGTERM"


def test_sigkill_keeps_finished_segments(tmp_path):
    """SIGKILL mid-capture: every finished segment reads back, and at most about a
    second of rows (the open segment) is lost."""
    d, cap = tmp_path / "d", tmp_path / "cap"
    d.mkdir()
    writer = _writer_loop(str(d / "w.bin"), 60)
    agent = start_slotscope("record", "-o", str(cap), "--path", str(d), "-q")
    try:
        wait_recording(agent)
        time.sleep(4)
        killed_at = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        agent.kill()
        agent.wait()
    finally:
        writer.kill()
        writer.wait()
    c = Capture.open(str(cap))
    assert c.live  # no stop record: it was killed
    segments = c.segments("syscall")
    assert len(segments) >= 2
    t = c.read("syscall")
    assert c.problems == []
    newest = pc.max(t["ts_exit"]).as_py()
    assert killed_at - newest < 2.5e9, (killed_at - newest) / 1e9


def test_refuses_bad_output_paths(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    res = slotscope("record", "-o", str(tmp_path / "link"), "--duration", "1")
    assert res.returncode == 1 and "symbolic link" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    res = slotscope("record", "-o", str(tmp_path / "full"), "--duration", "1")
    assert res.returncode == 1 and "not empty" in res.stderr
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def test_disk_full_stops_cleanly(tmp_path):
    """A full disk: exit 1 with a clear message; the finished segments stay readable."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    d = tmp_path / "d"
    d.mkdir()
    writer = _writer_loop(str(d / "w.bin"), 60, chunk=64)
    try:
        res = slotscope("record", "-o", str(mnt / "cap"), "--path", str(d), "--duration", "60", "-q",
                        "--max-size", "1G", timeout=120)
        assert res.returncode == 1
        assert "disk full" in res.stderr and "Traceback" not in res.stderr
        c = Capture.open(str(mnt / "cap"))
        assert c.read("syscall").num_rows > 0
        # nothing half-written is left behind: no temporary meta.json, no partial segment
        left = [p.name for p in (mnt / "cap").rglob(".*") if p.name not in (".lock", ".checksums")]
        assert left == [], left
    finally:
        writer.kill()
        writer.wait()
        subprocess.run(["umount", str(mnt)], check=False)


def test_cgroup_filter(tmp_path):
    """--cgroup: only tasks in that cgroup v2 directory."""
    root = cgroup2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    group = os.path.join(root, f"slotscope-test-{os.getpid()}")
    os.mkdir(group)
    d, cap = tmp_path / "d", tmp_path / "cap"
    d.mkdir()
    inside = outside = None
    try:
        inside = _writer_loop(str(d / "in.bin"), 30)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(inside.pid))
        outside = _writer_loop(str(d / "out.bin"), 30)
        agent = start_slotscope("record", "-o", str(cap), "--cgroup", group, "--path", str(d), "-q")
        wait_recording(agent)
        time.sleep(1.0)
        agent.send_signal(signal.SIGINT)
        assert agent.wait(30) == 0
    finally:
        for p in (inside, outside):
            if p:
                p.kill()
                p.wait()
        os.rmdir(group)
    t = Capture.open(str(cap)).read("syscall")
    assert t is not None and set(t["tgid"].to_pylist()) == {inside.pid}


def _wait_blocked(cap, tgid: int, age_ns: int, timeout: float, agent) -> None:
    """Until a `blocked` snapshot of the capture being written shows `tgid` blocked `age_ns`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            rows = Capture.open(str(cap)).read("blocked")
        except Exception:   # meta.json or the first segment not written yet
            rows = None
        if rows is not None and any(r["tgid"] == tgid and r["ts"] - r["ts_enter"] >= age_ns
                                    for r in rows.to_pylist()):
            return
        time.sleep(0.5)
    agent.send_signal(signal.SIGINT)
    agent.wait(60)
    calls = Capture.open(str(cap)).read("syscall")
    mine = calls and calls.filter(pc.equal(calls["tgid"], tgid)).select(["syscall", "fd", "ret", "path"]).to_pylist()
    raise AssertionError(f"no blocked call of {tgid} for {age_ns / 1e9} s within {timeout} s; its rows: {mine}; "
                         f"agent: {agent.stderr.read()}")


def test_blocked_syscalls_are_snapshotted(tmp_path):
    """A write that never returns (into a FIFO nobody reads) shows in the `blocked` table while
    it lasts and in the final snapshot at stop, with its file; the analyzer calls it a hung
    task once it has been blocked longer than the threshold."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = ("import os,sys\n"
            "fd=os.open(sys.argv[1],os.O_RDWR)\n"       # O_RDWR: the open itself does not wait
            "os.write(fd,b'x'*4096)\n"
            "print('ready',flush=True)\n"
            "os.write(fd,b'y'*(1<<20))\n")              # a full pipe: blocks for good
    agent = start_slotscope("record", "-o", str(tmp_path / "cap"), "--path", str(tmp_path))
    stuck = None
    try:
        wait_recording(agent)
        stuck = subprocess.Popen([sys.executable, "-c", code, str(fifo)], stdout=subprocess.PIPE, text=True)
        assert stuck.stdout.readline().strip() == "ready"
        # Stop once the growing capture shows the call blocked long enough (not after a fixed
        # time: on a loaded machine the interpreter's start alone can take seconds).
        _wait_blocked(tmp_path / "cap", stuck.pid, age_ns=2_500_000_000, timeout=120, agent=agent)
        agent.send_signal(signal.SIGINT)
        assert agent.wait(60) == 0, agent.stderr.read()
    finally:
        agent.kill()
        if stuck:
            stuck.kill()
            stuck.wait()
    cap = Capture.open(str(tmp_path / "cap"))
    blocked = cap.read("blocked")
    assert blocked is not None, "no blocked rows"
    mine = blocked.filter(pc.equal(blocked["tgid"], stuck.pid)).to_pylist()
    assert {r["syscall"] for r in mine} == {"write"} and {r["path"] for r in mine} == {str(fifo)}
    assert len({r["ts"] for r in mine}) >= 2                 # seen in several snapshots
    assert len({r["ts_enter"] for r in mine}) == 1           # ... as one call
    ages = [r["ts"] - r["ts_enter"] for r in mine]
    assert max(ages) >= 2e9 and max(ages) - min(ages) >= 1e9
    assert max(r["ts"] for r in mine) >= cap.meta["stop"]["monotonic_ns"] - 1e9   # the final snapshot
    res = slotscope("analyze", "--json", "--threshold", "hung_s=2", str(tmp_path / "cap"))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["verdict"] == "hung_tasks", out["findings"]
    [hung] = [f for f in out["findings"] if f["kind"] == "hung_tasks"]
    assert hung["syscalls"] == ["write"]


def test_sigusr1_ends_the_capture_and_starts_the_next(tmp_path):
    """-o with {n}: each SIGUSR1 ends a capture and starts the next with the programs already
    loaded. Each capture is whole on its own: its own meta and stop reason, and exactly the
    writes made while it was recording, to the file opened before it started as well."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    agent = start_slotscope("record", "-o", str(tmp_path / "cap-{n}"), "--path", str(ckpt), "-q")
    counts = []
    try:
        wait_recording(agent)
        code = ("import os,sys\n"
                "fd=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT|os.O_APPEND,0o600)\n"
                "for line in sys.stdin:\n"
                "    for _ in range(int(line)): os.write(fd,b'x')\n"
                "    print('done',flush=True)\n")
        writer = subprocess.Popen([sys.executable, "-c", code, str(ckpt / "f.bin")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for n in (7, 11, 13):
            writer.stdin.write(f"{n}\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "done"
            counts.append(n)
            agent.send_signal(signal.SIGUSR1 if n != 13 else signal.SIGINT)
            if n != 13:
                wait_recording(agent)
        writer.stdin.close()
        writer.wait()
        assert agent.wait(60) == 0
        err = agent.stderr.read()
    finally:
        agent.kill()
    for number, (n, reason) in enumerate(zip(counts, ("SIGUSR1", "SIGUSR1", "SIGINT")), 1):
        cap = Capture.open(str(tmp_path / f"cap-{number}"))
        assert cap.meta["stop_reason"] == reason
        rows = cap.read("syscall")
        assert rows is not None, (number, cap.meta["totals"], err)
        writes = [r for r in rows.to_pylist() if r["syscall"] == "write"]
        assert len(writes) == n, (number, cap.meta["totals"], err)
        assert {r["path"] for r in writes} == {str(ckpt / "f.bin")}
    assert not (tmp_path / "cap-4").exists()


def _sigusr1_then_sigint(output: str, path) -> str:
    """SIGUSR1 to an agent recording to `output`, then Ctrl-C once it is clear that it went on:
    -> its stderr."""
    agent = start_slotscope("record", "-o", output, "--path", str(path), "-q")
    wait_recording(agent)
    agent.send_signal(signal.SIGUSR1)
    time.sleep(1.5)
    assert agent.poll() is None
    agent.send_signal(signal.SIGINT)
    assert agent.wait(60) == 0
    return agent.stderr.read()


def test_sigusr1_without_a_number_is_ignored(tmp_path):
    assert "SIGUSR1 ignored: -o has no {n}" in _sigusr1_then_sigint(str(tmp_path / "cap"), tmp_path)
    assert Capture.open(str(tmp_path / "cap")).meta["stop_reason"] == "SIGINT"


def test_a_next_capture_that_cannot_be_created_keeps_the_current_one(tmp_path):
    (tmp_path / "cap-2").mkdir()
    (tmp_path / "cap-2" / "notes.txt").write_text("someone's file")
    err = _sigusr1_then_sigint(str(tmp_path / "cap-{n}"), tmp_path)
    assert f"no next capture: {tmp_path}/cap-2" in err
    assert Capture.open(str(tmp_path / "cap-1")).meta["stop_reason"] == "SIGINT"
    assert os.listdir(tmp_path / "cap-2") == ["notes.txt"]



PROBE = b"TRACEPOINT_PROBE(syscalls, sys_enter_getppid) { return 0; }"


def _measured(probe) -> bool:
    """Whether the kernel's BPF run-time statistics are on: our probe's run count grows."""
    fd = next(iter(probe.funcs.values())).fd

    def runs() -> int:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            return int(next(line for line in f if line.startswith("run_cnt:")).split()[1])
    before = runs()
    for _ in range(10):
        os.getppid()
    return runs() > before


def test_bpf_statistics_only_when_asked_and_while_any_agent_lives(tmp_path):
    """The kernel's BPF statistics slow every BPF program on the machine: record leaves them off
    (its capture has no run times), and turns them on with --bpf-stats. Two such records overlapping
    keep them on until the last ends, and one killed -9 leaves them off as it found them: the
    kernel counts the holders of their fds (writing kernel.bpf_stats_enabled instead, the second
    would have restored the first's "on")."""
    from bcc import BPF
    probe = BPF(text=PROBE)
    assert not _measured(probe), "the statistics are on before the test (another agent?)"
    plain = start_slotscope("record", "-o", str(tmp_path / "plain"), "--path", str(tmp_path), "-q")
    wait_recording(plain)
    assert not _measured(probe)
    plain.send_signal(signal.SIGINT)
    assert plain.wait(60) == 0
    cap = Capture.open(str(tmp_path / "plain"))
    assert cap.meta["probes"]["runtime"] == {}
    assert cap.read("agent")["bpf_run_ns"].null_count == cap.read("agent").num_rows > 0
    agents = []
    try:
        for name in ("a", "b"):
            agents.append(start_slotscope("record", "-o", str(tmp_path / name), "--path", str(tmp_path), "-q",
                                          "--bpf-stats"))
            wait_recording(agents[-1])
            assert _measured(probe)
        agents[0].send_signal(signal.SIGINT)
        assert agents[0].wait(60) == 0
        assert _measured(probe)         # b still measures
        agents[1].kill()
        agents[1].wait(60)
        assert not _measured(probe)
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
        probe.cleanup()
