"""`slotscope watch` on this machine's kernel: real BPF, a write blocked on a full FIFO as the
incident, and Debian's real Prometheus server scraping the metrics endpoint."""
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import prom
from dashboard import SOURCES, panel_queries, promql
from slotscope.capture.reader import Capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]

# A process that writes steadily to a file, then blocks writing into a full FIFO until killed.
WRITER = """
import os, sys, time
data, fifo, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(data, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
end = time.monotonic() + seconds
while time.monotonic() < end:
    os.write(fd, b"w" * 4096)
    time.sleep(0.01)
print("blocking", flush=True)
p = os.open(fifo, os.O_RDWR)          # O_RDWR: the open does not wait for a reader
while True:
    os.write(p, b"x" * 65536)         # the pipe's 64 KiB fill: the second write blocks for good
"""


class Watch:
    """The watch daemon as a user starts it, its log read line by line by a thread of its own
    (select() on the pipe missed lines that came in one read with the line before: they sat in
    the stream's buffer while select() waited for more)."""

    def __init__(self, *args, prefix: tuple[str, ...] = ()):
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "slotscope.cli", "watch", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self._lines.put(line)
        self._lines.put(None)       # the log's end: the daemon exited

    def wait_for(self, words: str, timeout: float = 120.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.log.append(line)
            if words in line:
                return line
        raise AssertionError(f"no '{words}' in the watch's log: {''.join(self.log)}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        finally:
            self.proc.kill()
        self._reader.join(10)
        while not self._lines.empty():
            line = self._lines.get()
            if line is not None:
                self.log.append(line)
        return rc


def _writer(tmp_path, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "data" / "f.bin"),
                             str(tmp_path / "data" / "pipe"), str(seconds)], stdout=subprocess.PIPE, text=True)


def _setup(tmp_path):
    (tmp_path / "data").mkdir()
    os.mkfifo(tmp_path / "data" / "pipe")
    return tmp_path / "out"


def _the_incident(out) -> str:
    names = sorted(os.listdir(out))
    assert len(names) == 1 and names[0].endswith("-blocked_s"), names
    return str(out / names[0])


def test_a_blocked_write_makes_one_incident_with_the_seconds_before(tmp_path):
    """A write blocked on a full FIFO past blocked_s=2 makes one incident: it holds the writes
    made before the block, and its report names the blocked call. A second block while the
    first incident is open (collecting its --after window, written, analysed) makes no second
    incident, although --rearm 1 would re-arm the trigger a second after the first cleared.
    Watch leaves the machine's BPF statistics off (record turns them on): its agent rows carry
    no BPF run time."""
    out = _setup(tmp_path)
    watch = Watch("--out", str(out), "--path", str(tmp_path / "data"), "--trigger", "blocked_s=2",
                  "--after", "20", "--rearm", "1")
    first = second = None
    try:
        watch.wait_for("watching")
        first = _writer(tmp_path, 3)
        assert first.stdout.readline().strip() == "blocking"
        opened = watch.wait_for(" opened: ")
        assert f"write on {tmp_path / 'data' / 'pipe'} by pid {first.pid} blocked" in opened
        first.kill()            # the FIFO's last opener gone, its contents go: the next writer blocks anew
        first.wait()
        second = _writer(tmp_path, 0)
        assert second.stdout.readline().strip() == "blocking"
        done = watch.wait_for("written and", timeout=180)
        assert "analysed" in done, done
        second.kill()
        second.wait()
        time.sleep(3)           # a second incident, were one opened now, would be in the log
        assert watch.stop() == 0, "".join(watch.log)
    finally:
        for p in (first, second, watch.proc):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    assert sum(" opened: " in line for line in watch.log) == 1, "".join(watch.log)
    assert any("stopped (SIGTERM)" in line for line in watch.log), "".join(watch.log)
    path = _the_incident(out)
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    assert {oct(os.stat(os.path.join(path, f)).st_mode & 0o777) for f in ("meta.json", "report.txt")} == {"0o600"}

    cap = Capture.open(path)
    incident = cap.meta["incident"]
    assert incident["trigger"] == "blocked_s" and incident["seen"]["call"]["tgid"] == first.pid
    rows = cap.read("syscall")
    mine = rows.filter(pc.equal(rows["tgid"], first.pid))
    blocked_at = incident["seen"]["call"]["ts_enter"]
    before = mine.filter(pc.and_(pc.equal(mine["path"], str(tmp_path / "data" / "f.bin")),
                                 pc.less(mine["ts_exit"], blocked_at)))
    assert before.num_rows >= 100          # 3 s of writes every 10 ms before the block
    assert incident["before_s"] >= 3
    assert cap.read("agent")["bpf_run_ns"].null_count == cap.read("agent").num_rows > 0

    report = json.loads(open(os.path.join(path, "report.json")).read())
    [hung] = [f for f in report["findings"] if f["kind"] == "hung_tasks"]
    assert hung["syscalls"] == ["write"]
    text = open(os.path.join(path, "report.txt")).read()
    assert f"pid {first.pid}, syscall write, file {tmp_path / 'data' / 'pipe'}" in " ".join(text.split())
    assert open(os.path.join(path, "report.html")).read().startswith("<!DOCTYPE html>")


UNIT = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "slotscope-watch.service")


def _unit_keys() -> dict[str, str]:
    return dict(line.split("=", 1) for line in open(UNIT).read().splitlines() if re.match(r"^[A-Za-z]+=", line))


def _unit_sandbox() -> tuple[str, ...]:
    """setpriv giving what deploy/'s systemd unit gives watch: its capability bounding set (root's
    capabilities after exec are those alone) and no new privileges."""
    keys = _unit_keys()
    caps = ",".join("+" + c.removeprefix("CAP_").lower() for c in keys["CapabilityBoundingSet"].split())
    no_new_privs = ("--no-new-privs",) if keys["NoNewPrivileges"] == "yes" else ()
    return ("setpriv", f"--bounding-set=-all,{caps}", *no_new_privs)


def _bounding_set(*prefix: str) -> set[str]:
    dump = subprocess.run([*prefix, "setpriv", "--dump"], capture_output=True, text=True, check=True).stdout
    return set(re.search(r"^Capability bounding set: (.*)$", dump, re.M)[1].split(","))


def test_the_units_capabilities_are_enough(tmp_path):
    """watch with only the unit's capabilities loads its probes, makes an incident of a blocked
    write and has it analysed (the analysis a child process, under the same bounds)."""
    out = _setup(tmp_path)
    watch = Watch("--out", str(out), "--path", str(tmp_path / "data"), "--trigger", "blocked_s=2", "--after", "1",
                  prefix=_unit_sandbox())
    writer = None
    try:
        watch.wait_for("watching")
        writer = _writer(tmp_path, 1)
        assert writer.stdout.readline().strip() == "blocking"
        done = watch.wait_for("written and", timeout=180)
        assert "analysed" in done, done
        assert watch.stop() == 0, "".join(watch.log)
    finally:
        for p in (writer, watch.proc):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    # What watch had: the unit's set, less what this machine's own bounding set lacks.
    unit = {c.removeprefix("CAP_").lower() for c in _unit_keys()["CapabilityBoundingSet"].split()}
    assert _bounding_set(*_unit_sandbox()) == unit & _bounding_set()
    report = json.loads(open(os.path.join(_the_incident(out), "report.json")).read())
    assert [f["syscalls"] for f in report["findings"] if f["kind"] == "hung_tasks"] == [["write"]]


SERVER = "10.0.0.2:2049"
SLOT_WAIT_S, EXECUTE_S = 0.030, 0.045


def _saturated_transport(metrics, stop: threading.Event) -> None:
    """What the kernel's aggregates hold of a 2-slot transport full with 6 tasks waiting from the
    start, swept every 0.25 s, each sweep after one more WRITE that waited 30 ms of its 45 ms for
    a slot (the map contents as aggregates.read_maps reads them: this kernel has no sunrpc)."""
    from slotscope.agent.aggregates import Aggregator, Raw
    from slotscope.agent.metrics import BOUNDS_NS

    def hist(ns: int) -> tuple[list[int], int]:
        at = int(np.searchsorted(BOUNDS_NS, ns, side="left"))
        return [n if i == at else 0 for i in range(len(BOUNDS_NS) + 1)], n * ns

    agg = Aggregator(lambda cid: SERVER, lambda *_: None)
    agg.clients([1])
    start, n = time.clock_gettime_ns(time.CLOCK_MONOTONIC), 0
    while not stop.wait(0.25):
        n += 1
        raw = Raw(servers={0: (2, 6, -2 * start, -6 * start, 0, start)},
                  rpcs={(1, "WRITE"): {"slot_wait": hist(int(SLOT_WAIT_S * 1e9)), "rtt": hist(10_000_000),
                                       "execute": hist(int(EXECUTE_S * 1e9))}})
        metrics.sweep(agg.sweep(raw, time.clock_gettime_ns(time.CLOCK_MONOTONIC))[0])


@pytest.mark.skipif(prom.PROMETHEUS is None, reason="no prometheus (apt-get install prometheus; dev.sh setup does)")
def test_prometheus_scrapes_what_the_incident_holds(tmp_path):
    """Debian's Prometheus scrapes watch's endpoint every second while a process writes 4 KiB
    every 10 ms for 12 s, then blocks (the incident: it holds the whole run). PromQL's answers
    match the incident's rows: the bytes written exactly (both count the same rows, and nothing
    is written after the block); the Grafana dashboard's write rate over 6 s in the middle of the
    run, the counter's own slope there within 10% (Prometheus' extrapolation at the window's
    edges); one incident.

    Every query of the dashboard (deploy/grafana) runs, each on the target tests/dashboard.py
    names, and returns finite values >= 0 where that target has series. Its NFS panels read a
    second target, watch's Metrics fed the sweeps of a saturated 2-slot transport's aggregates
    (this kernel has no NFS to trace), and answer what those hold: 2 slots in use, 6 waiting,
    always full, slot wait 2/3 of RPC time.

    The syscall histograms, which the kernel's aggregates feed (the calls on fds, a call before
    its fd was known held back until it was) or the rows (the opens), count exactly the
    incident's rows: per syscall, the calls, their time to the ns and their buckets."""
    from slotscope.agent.metrics import Metrics, serve

    out = _setup(tmp_path)
    targets = {"watch": f"127.0.0.1:{prom.free_port()}", "nfs": f"127.0.0.1:{prom.free_port()}"}
    transport, stop = Metrics(), threading.Event()
    server = serve(transport, targets["nfs"])
    feeder = threading.Thread(target=_saturated_transport, args=(transport, stop), daemon=True)
    feeder.start()
    prometheus, web = prom.start(tmp_path / "tsdb", targets.values())
    watch = Watch("--out", str(out), "--path", str(tmp_path / "data"), "--trigger", "blocked_s=2",
                  "--after", "2", "--metrics", targets["watch"])
    writer = None
    try:
        watch.wait_for("watching")
        time.sleep(3)       # a few scrapes before the writes: the counter's start is seen
        began = time.time()
        writer = _writer(tmp_path, 12)
        assert writer.stdout.readline().strip() == "blocking"
        watch.wait_for("written and", timeout=180)
        time.sleep(3)       # the last rows scraped
        now = time.time()
        total = prom.query(web, 'sum(slotscope_written_bytes_total)', now)
        swept = {what: prom.values(prom.query(web, f"sum by (syscall) (slotscope_syscall_duration_seconds_{what})",
                                              now)) for what in ("count", "sum")}
        under_ms = prom.values(prom.query(web, 'sum by (syscall) (slotscope_syscall_duration_seconds_bucket'
                                               '{le="0.001"})', now))
        # Each panel as Grafana asks for it over the run, of the target its series come from.
        run = int(now - began) + 1
        panels = {title: prom.values(prom.query(
                      web, promql(expr, run, targets["nfs" if SOURCES[title] == "nfs" else "watch"]), now))
                  for title, expr in panel_queries().items()}
        cap = Capture.open(_the_incident(out))
        rows = cap.read("syscall")
        start = cap.meta["start"]
        utc_s = (rows["ts_exit"].to_numpy() - start["monotonic_ns"] + start["realtime_ns"]) / 1e9
        ours = (rows["path"].to_numpy(zero_copy_only=False) == str(tmp_path / "data" / "f.bin"))
        written = rows["bytes"].fill_null(0).to_numpy()
        mid = utc_s[ours].min() + 9
        rate = prom.query(web, promql(panel_queries()["Bytes written per second, by mount"], 6, targets["watch"]), mid)
        raw = prom.query(web, "slotscope_written_bytes_total[6s]", mid)
        assert watch.stop() == 0, "".join(watch.log)
    finally:
        for p in (writer, watch.proc, prometheus):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        stop.set()
        server.shutdown()
        server.server_close()
    assert float(total[0]["value"][1]) == written.sum()     # f.bin's writes and the FIFO's first
    rows = rows.set_column(rows.schema.get_field_index("syscall"), "syscall", pc.cast(rows["syscall"], pa.string()))
    calls = rows.group_by("syscall").aggregate([("latency_ns", "count"), ("latency_ns", "sum")]).to_pylist()
    assert {"write", "openat"} <= {str(c["syscall"]) for c in calls}
    assert swept["count"] == {f"syscall={c['syscall']}": c["latency_ns_count"] for c in calls}
    for c in calls:
        assert swept["sum"][f"syscall={c['syscall']}"] == pytest.approx(c["latency_ns_sum"] / 1e9, rel=1e-12)
        fast = pc.sum(pc.less_equal(rows.filter(pc.equal(rows["syscall"], c["syscall"]))["latency_ns"], 1_000_000))
        assert under_ms[f"syscall={c['syscall']}"] == fast.as_py()
    assert written[ours].sum() >= 12 * 4096 * 50               # the 12 s run is in the incident
    # the panel's rate is the counter's own slope in the middle of the run (it grows while the rows
    # come, not at the end); against the rows themselves it drifted 18% on a loaded host (the counter
    # trails them by a drain and a scrape)
    slope = sum((float(r["values"][-1][1]) - float(r["values"][0][1])) / (r["values"][-1][0] - r["values"][0][0])
                for r in raw if len(r["values"]) > 1)
    assert slope > 0 and sum(prom.values(rate).values()) == pytest.approx(slope, rel=0.1)
    assert panels["Incidents, by trigger"] == {"trigger=blocked_s": 1}
    for title, values in panels.items():
        if SOURCES[title] != "none":
            assert values and all(math.isfinite(v) and v >= 0 for v in values.values()), (title, values)
    transport = f"instance={targets['nfs']},server={SERVER}"
    assert panels["Slots in use (mean), by node and server"][transport] == pytest.approx(2, rel=0.1)
    assert panels["Tasks waiting for a slot (mean), by node and server"][transport] == pytest.approx(6, rel=0.1)
    assert panels["Share of time the slot table was full, by node and server"][transport] == pytest.approx(1, rel=0.1)
    assert (panels["Share of RPC time spent waiting for a slot, by node and server"][transport]
            == pytest.approx(SLOT_WAIT_S / EXECUTE_S, rel=0.01))
    [p99] = panels["RPC slot wait p99, by server and procedure"].values()
    assert 0.025 < p99 <= 0.05          # the histogram's bucket holding 30 ms


SAVES = """
import os, sys, time
for n, seconds in enumerate([1, 1, 1, 4]):
    fd = os.open(os.path.join(sys.argv[1], f"ckpt{n}.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
    for i in range(20):
        os.write(fd, b"c" * 4096)
        time.sleep(seconds / 20)
    os.fsync(fd)
    os.close(fd)
    time.sleep(12)          # more than save_gap_s (10): the next save is another
"""


def test_a_slow_save_makes_an_incident(tmp_path):
    """Three saves of a second, then one of four: slow_save (3 times the median) fires once the
    fourth has ended, and the incident's report finds the same four saves the watch timed."""
    (tmp_path / "data").mkdir()
    out = tmp_path / "out"
    watch = Watch("--out", str(out), "--path", str(tmp_path / "data"), "--after", "1")
    try:
        watch.wait_for("watching")
        subprocess.run([sys.executable, "-c", SAVES, str(tmp_path / "data")], check=True, timeout=120)
        opened = watch.wait_for(" opened: ", timeout=60)
        watch.wait_for("written and", timeout=180)
        assert watch.stop() == 0, "".join(watch.log)
    finally:
        if watch.proc.poll() is None:
            watch.proc.kill()
            watch.proc.wait()
    [name] = os.listdir(out)
    assert name.endswith("-slow_save") and "a save took" in opened and "of the 3 before" in opened
    seen = Capture.open(str(out / name)).meta["incident"]["seen"]
    report = json.loads((out / name / "report.json").read_text())
    took = [s["duration_s"] for s in report["saves"]]
    assert len(took) == 4 and took[-1] == pytest.approx(seen["save_s"], abs=0.01)
    assert seen["median_s"] == pytest.approx(sorted(took[:3])[1], abs=0.01)
