"""The causes named without BPF: on a sampled capture (mountstats counters per interval and
samples of the ranks, as record --no-bpf writes them) and on copies of /proc/self/mountstats
(analyze --mountstats), both made by tests/synth.py's model of a save. Expected values come
from the model's manifest, not from the counters."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from unit_helpers import assert_one_line_error, run_slotscope

from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job, utc_ns
from slotscope.analyzer.mountstats_report import analyze_copies, copies
from slotscope.analyzer.waits import wait_kind

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synth  # noqa: E402

pytestmark = pytest.mark.unit

S = 1_000_000_000
SERIOUS = ("critical", "warning")
SCENARIOS = {
    # 16 ranks of 4 KiB O_SYNC writes through 4 slots at 20 ms (test_findings' storm)
    "storm": dict(ranks=16, slots=4, rtt_ms=20.0, write_bytes=4096, file_bytes=64 * 4096, stagger_ms=25),
    # the server answers nothing for 25 s
    "freeze": dict(ranks=8, slots=16, rtt_ms=20.0, file_bytes=64 * 4096, freeze=(1.0, 26.0), timeo_ds=20, retrans=1),
    # large buffered writes flushed by fsync / close; only the server's COMMIT is slow (3 s)
    "fsync": dict(mode="fsync", ranks=8, write_bytes=1 << 20, file_bytes=64 << 20, slots=65536, rtt_ms=1.0,
                  commit_ms=3000),
    "close": dict(mode="buffered", ranks=8, write_bytes=1 << 20, file_bytes=64 << 20, slots=65536, rtt_ms=1.0,
                  commit_ms=3000),
    # 4 KiB O_SYNC writes, no slot limit, 1 ms RTT
    "small": dict(ranks=8, slots=65536, rtt_ms=1.0, write_bytes=4096, file_bytes=128 * 4096),
    "healthy": dict(ranks=8, mode="buffered", write_bytes=1 << 20, file_bytes=64 << 20, slots=65536, rtt_ms=0.5),
}
VERDICT = {"storm": "slot_saturation", "freeze": "server_unresponsive", "fsync": "flush_commit_stall",
           "close": "flush_commit_stall", "small": "small_sync_writes", "healthy": "healthy"}


@pytest.fixture(scope="module")
def saves(tmp_path_factory):
    """name -> (manifest, analysis of the sampled capture), sampled every 0.1 s."""
    out = {}
    for name, model in SCENARIOS.items():
        man = synth.save(tmp_path_factory.mktemp(name) / "cap", sampled_s=0.1, **model)
        out[name] = man, analyze(Job.open([man["path"]]), "0")
    return out


def finding(result, kind):
    [f] = [f for f in result["findings"] if f["kind"] == kind]
    return f


def kinds(result, severities=SERIOUS):
    return {f["kind"] for f in result["findings"] if f["severity"] in severities}


def write_copies(path, texts, every=1, iso=False):
    """The output of `while :; do date +%s.%N; cat /proc/self/mountstats; sleep 1; done`
    (or of date -Ins), one copy in `every`."""
    from datetime import datetime, timezone
    with open(path, "w") as f:
        for t, text in texts[::every]:
            stamp = (datetime.fromtimestamp(t // S, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
                     + f",{t % S:09d}+00:00") if iso else f"{t // S}.{t % S:09d}"
            f.write(f"{stamp}\n{text}\n")
    return str(path)


@pytest.mark.parametrize("name", SCENARIOS)
def test_verdict_of_a_sampled_capture(saves, name):
    _, result = saves[name]
    assert result["verdict"] == VERDICT[name]
    if name == "healthy":
        assert kinds(result) == set()
        return
    f = finding(result, VERDICT[name])
    assert f["confidence"].startswith("medium: from 10 Hz samples")
    assert f["bpf_would_add"]
    assert f["evidence"]["shortest_stall_visible_s"] == 0.1
    assert f["ranks"] == list(range(SCENARIOS[name]["ranks"]))


def test_saturation_from_counters(saves):
    man, result = saves["storm"]
    f = finding(result, "slot_saturation")
    ev = f["evidence"]
    assert f["severity"] == "critical"
    assert ev["peak_in_use"] == ev["max_slots"] == 4
    # the slot wait the model implies: a WRITE holds its slot one RTT, the rest of write() waits for one
    writes = sum(r["bytes"] // man["write_bytes"] for r in man["ranks"])
    in_write = sum(r["write_end"] - r["write_start"] for r in man["ranks"])
    assert ev["queue_share"] == pytest.approx(1 - writes * man["rtt_ns"] / in_write, abs=0.05)
    assert ev["write_rpcs"] == writes
    assert ev["mean_backlog_per_send"] > 4        # 16 ranks, 4 slots: most wait at every send
    assert ev["mean_rtt_ms"] == pytest.approx(20, rel=0.05)
    assert 0.8 < ev["throughput_vs_ceiling"] <= 1.05
    # who was blocked in what: every rank mostly waiting on its pages' writeback (the O_SYNC
    # write's WRITEs, queued for slots), in write(), on its own file
    waits = result["sampled"]["waits"]
    assert [w["rank"] for w in waits] == list(range(16))
    for w, r in zip(waits, man["ranks"]):
        assert w["waits"]["writeback"] > 0.5 and w["syscall"] == "write" and w["path"] == r["file"]


def test_freeze_from_counters(saves):
    man, result = saves["freeze"]
    f = finding(result, "server_unresponsive")
    ev = f["evidence"]
    f0, f1 = man["freeze_utc_ns"]
    assert f["severity"] == "critical"
    assert ev["longest_silence_s"] == pytest.approx((f1 - f0) / S, abs=0.3)
    assert ev["timeouts"] == ev["retransmits"] == man["timeouts"] > 0


@pytest.mark.parametrize("name,call", [("fsync", "fsync"), ("close", "close")])
def test_flush_stall_from_samples(saves, name, call):
    man, result = saves[name]
    f = finding(result, "flush_commit_stall")
    ev = f["evidence"]
    assert f["severity"] == "warning" and f["syscalls"] == [call]
    wire_s = sum(r["bytes"] for r in man["ranks"]) * 8 / 10e9
    assert ev["median_flush_s"] == pytest.approx(3.0 + wire_s, abs=0.2)
    assert ev["commit_rpcs"] == 8
    assert ev["commit_mean_rtt_ms"] == pytest.approx(3000, rel=0.01)
    assert "stable storage is slow" in f["fix"]


def test_a_flush_that_fills_the_link_is_not_a_stall(tmp_path):
    """As with BPF (findings.flush_commit_stall): ranks fsync'ing over a 100 Mb/s link they keep
    full wait for the link's speed, not in a stall; the sampled capture's NIC counters tell the two
    apart, and the BPF capture of the same save agrees (before, the sampled one made an 'info'
    finding that said it could not tell)."""
    model = dict(mode="fsync", ranks=4, write_bytes=1 << 20, file_bytes=16 << 20, slots=65536, rtt_ms=1.0,
                 link_bps=100e6)
    for sampled_s in (0.1, None):
        (tmp_path / f"s{sampled_s}").mkdir()
        man = synth.save(tmp_path / f"s{sampled_s}" / "cap", sampled_s=sampled_s, **model)
        result = analyze(Job.open([man["path"]]), "0")
        assert "flush_commit_stall" not in kinds(result, ("critical", "warning", "info")), result["findings"]


def test_a_flush_stall_on_an_idle_link_is_a_warning(saves):
    """The link's use known (NIC counters): the flush is judged as BPF judges it, a warning whose
    summary gives the link's use (over the save: the ranks' sampled activity; 13% of 10 Gb/s here,
    the 3 s COMMITs leaving it idle)."""
    _, result = saves["fsync"]
    f = finding(result, "flush_commit_stall")
    assert f["severity"] == "warning" and f["evidence"]["link_mean_util"] < 0.2
    assert "with the link at" in f["summary"]


def test_small_writes_from_counters(saves):
    _, result = saves["small"]
    assert kinds(result) == {"small_sync_writes"}
    ev = finding(result, "small_sync_writes")["evidence"]
    assert ev["small_sync_rpcs"] == ev["write_rpcs"] == 8 * 128
    assert ev["mean_write_bytes"] < 4096 + 512         # headers included


def test_sampled_report_text_and_html(saves):
    from slotscope.analyzer.report_html import render_html
    from slotscope.analyzer.report_text import render_text
    man, result = saves["storm"]
    text = render_text(result)
    assert "confidence medium" in text and "a BPF recording would add" in text
    assert "where the ranks were (a sample every 0.100 s)" in text
    assert "writeback: pages being written back" in text                  # the wait kinds explained
    assert "(no traced syscalls on matching files)" not in text
    html = render_html(Job.open([man["path"]]), result)
    assert 'class="confidence">confidence medium' in html
    assert '<section id="waits">' in html and man["ranks"][3]["file"] in html


@pytest.mark.parametrize("name", SCENARIOS)
def test_verdict_from_mountstats_copies(saves, tmp_path, name):
    """Copies every second, as the shell loop takes them: the same verdict from counters alone."""
    man, _ = saves[name]
    path = write_copies(tmp_path / "ms.txt", man["mountstats"], every=10, iso=name == "freeze")
    result = analyze_copies(copies([path], None), [path], "0")
    assert result["verdict"] == VERDICT[name]
    assert result["interval_s"] == 1.0
    if name != "healthy":
        f = finding(result, VERDICT[name])
        assert f["confidence"].startswith("low: from mountstats counters every 1 s alone")
        assert f["ranks"] == []
    if name == "freeze":
        f0, f1 = man["freeze_utc_ns"]
        assert finding(result, "server_unresponsive")["evidence"]["longest_silence_s"] == \
            pytest.approx((f1 - f0) / S, abs=1.5)
    if name == "fsync":
        f = finding(result, "flush_commit_stall")
        assert f["evidence"]["commit_mean_rtt_ms"] == pytest.approx(3000, rel=0.01)
        # its window: the intervals in which COMMITs ended (3 s into the save), not every copy's COMMIT line
        assert utc_ns(f["start"]) >= man["save_utc_ns"][0] + 2 * S


def test_mountstats_columns_and_two_copies(saves, tmp_path):
    man, _ = saves["storm"]
    (t0, first), (t1, last) = man["mountstats"][0], man["mountstats"][-1]
    (tmp_path / "a").write_text(first)
    (tmp_path / "b").write_text(last)
    res = run_slotscope("analyze", "--mountstats", str(tmp_path / "a"), str(tmp_path / "b"),
                        "--interval", str((t1 - t0) / S))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("verdict: slot_saturation")
    for head in ("ops/s", "kB/s", "kB/op", "retrans", "avg RTT", "avg exe", "avg queue"):
        assert f"{head}: " in out                   # each column explained
    [write] = [line.split() for line in out.splitlines() if line.startswith("  WRITE ")]
    seconds = (t1 - t0) / S
    writes = sum(r["bytes"] // man["write_bytes"] for r in man["ranks"])
    assert float(write[1]) == pytest.approx(writes / seconds, rel=0.01)      # ops/s
    assert float(write[6]) == pytest.approx(20.0, abs=0.5)                   # avg RTT
    assert "high-water mark since the mount 4" in out
    res = run_slotscope("analyze", "--json", "--mountstats", str(tmp_path / "a"), str(tmp_path / "b"),
                        "--interval", str(seconds))
    result = json.loads(res.stdout)
    assert result["verdict"] == "slot_saturation" and result["mounts"][0]["ops"]["WRITE"]["ops"] == writes


def test_mountstats_one_line_errors(saves, tmp_path):
    man, _ = saves["storm"]
    (tmp_path / "one").write_text(man["mountstats"][-1][1])
    (tmp_path / "notes").write_text("hello\nworld\n")
    (tmp_path / "local").write_text("1.0\ndevice proc mounted on /proc with fstype proc\n"
                                    "2.0\ndevice proc mounted on /proc with fstype proc\n")
    one, notes, local = (str(tmp_path / n) for n in ("one", "notes", "local"))
    assert_one_line_error(run_slotscope("analyze", "--mountstats", notes), "not a copy of /proc/self/mountstats")
    assert_one_line_error(run_slotscope("analyze", "--mountstats", one), "one copy", "--interval")
    assert_one_line_error(run_slotscope("analyze", "--mountstats", one, one), "need --interval")
    assert_one_line_error(run_slotscope("analyze", "--mountstats", local), "no NFS mount")
    assert_one_line_error(run_slotscope("analyze", "--mountstats", "/dev/zero"), "not a regular file")


@pytest.mark.parametrize("old,new", [("wait_on_page_bit_common", "folio_wait_bit_common"),
                                     ("wait_on_page_writeback", "folio_wait_writeback"),
                                     ("futex_wait_queue_me", "futex_wait_queue")])
def test_wait_names_of_older_and_newer_kernels_mean_the_same(old, new):
    assert wait_kind("D", old) == wait_kind("D", new) != "other"


def test_each_node_has_its_own_counters(tmp_path):
    """Node a cannot reach the server for 25 s while node b, saving meanwhile, gets its replies:
    a's silence is a's own (the nodes' counters are not added up), and names a's ranks only."""
    a = synth.save(tmp_path / "a", host="node-a", sampled_s=0.1, **SCENARIOS["freeze"])
    b = synth.save(tmp_path / "b", host="node-b", first_rank=8, lead_s=5.0, sampled_s=0.1, **SCENARIOS["small"])
    result = analyze(Job.open([a["path"], b["path"]]), "0")
    f = finding(result, "server_unresponsive")
    f0, f1 = a["freeze_utc_ns"]
    assert f["evidence"]["longest_silence_s"] == pytest.approx((f1 - f0) / S, abs=0.3)
    assert f["ranks"] == list(range(8))


def test_copies_of_a_kernel_that_counts_no_errors(saves, tmp_path):
    """Per-op lines of 8 numbers (no errors column, older kernels) read the same."""
    import re
    man, _ = saves["storm"]
    path = write_copies(tmp_path / "ms.txt", [(t, re.sub(r"(?m)^(\t +[A-Z]+:(?: \d+){8}) \d+$", r"\1", text))
                                               for t, text in man["mountstats"]], every=10)
    assert "WRITE: 0 0 0 0 0 0 0 0\n" in Path(path).read_text()
    result = analyze_copies(copies([path], None), [path], "0")
    assert result["verdict"] == "slot_saturation"
    assert result["mounts"][0]["ops"]["WRITE"]["errors"] == 0
