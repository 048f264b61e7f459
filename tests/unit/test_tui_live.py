"""`slotscope record --tui`: the recorder in a child process, the TUI in the foreground on the
capture it writes; quitting the TUI stops the recorder cleanly. The real recorder needs root
and BCC (tests/live); here a stand-in writes a capture the way the agent does, so the process
plumbing is tested: fork, waiting for meta.json, the stop on quit, the exit status, the log."""
from __future__ import annotations

import os
import signal
import time

import pytest

from slotscope.capture.writer import CaptureWriter
from slotscope.agent.recorder import RecordError, RecordOptions

from slotscope.analyzer.job import Job
from slotscope.analyzer.timeline import JobSource
from slotscope.cli.record_tui import record_with_tui
from unit_helpers import meta, sc, syscall_table

pytestmark = pytest.mark.unit


def fake_record(opts, argv) -> int:
    """Writes a segment every 50 ms until the quit signal, then the stop record; exit status 3."""
    stop = []
    signal.signal(opts.quit_signal, lambda *_: stop.append(1))
    w = CaptureWriter(opts.output)
    m = meta()
    del m["stop"]
    w.write_meta(m)
    print("slotscope: recording (fake)", flush=True)
    i = 0
    while not stop and i < 400:
        w.append("syscall", syscall_table([sc(100 + i, "write", 1000, 10, ts=1000 + i * 10**8)]))
        w.tables["syscall"].close_segment()
        i += 1
        time.sleep(0.05)
    w.write_meta(dict(meta(), stop_reason="q" if stop else "done"))
    w.close()
    print(f"slotscope: stopped after {i} segments (fake)", flush=True)
    return 3


def test_quitting_the_tui_stops_the_recorder_cleanly(tmp_path, capfd):
    out = str(tmp_path / "cap")
    seen = {}

    def ui(path):
        source = JobSource(Job.open([path]))
        end = time.monotonic() + 20
        while time.monotonic() < end:
            source.refresh()
            sc_ = source.views[0].full("syscall")
            if sc_ is not None and sc_.num_rows >= 3:
                seen["rows"], seen["live"] = sc_.num_rows, source.live
                return                                   # the user pressed q
            time.sleep(0.05)

    code = record_with_tui(RecordOptions(output=out), ["slotscope", "record", "--tui"], record=fake_record,
                           run_ui=ui)
    assert code == 3                                     # the recorder's own exit status
    assert seen["rows"] >= 3 and seen["live"]            # the UI followed the capture as it grew
    job = Job.open([out])
    assert not job.captures[0].live and job.captures[0].meta["stop_reason"] == "q"
    err = capfd.readouterr().err
    assert "stopping the recorder" in err and "recording (fake)" in err and "stopped after" in err


def test_a_recorder_that_fails_to_start_is_reported(tmp_path, capfd):
    def failing(opts, argv):
        raise RecordError("cannot trace syscalls: no BPF here")

    def ui(path):                                        # never reached
        raise AssertionError("the UI ran")

    def record_error_like_cli(opts, argv):
        try:
            return failing(opts, argv)
        except RecordError as exc:
            print(f"slotscope record: {exc}", flush=True)
            return 1

    code = record_with_tui(RecordOptions(output=str(tmp_path / "cap")), ["x"], record=record_error_like_cli,
                           run_ui=ui)
    assert code == 1
    assert "slotscope record: cannot trace syscalls: no BPF here" in capfd.readouterr().err


def test_ctrl_c_in_the_ui_still_stops_the_recorder(tmp_path):
    out = str(tmp_path / "cap")

    def ui(path):
        time.sleep(0.3)
        raise KeyboardInterrupt

    assert record_with_tui(RecordOptions(output=out), ["x"], record=fake_record, run_ui=ui) == 3
    assert Job.open([out]).captures[0].meta["stop_reason"] == "q"


def test_record_tui_needs_a_terminal(tmp_path, capfd):
    # pytest's stdin/stdout are not a terminal: refused before anything is forked
    code = record_with_tui(RecordOptions(output=str(tmp_path / "cap")), ["x"], record=fake_record)
    assert code == 1 and not os.path.exists(tmp_path / "cap")
    assert "--tui needs a terminal" in capfd.readouterr().err


def test_cli_has_record_tui():
    from slotscope.cli.main import parser
    args = parser().parse_args(["record", "-o", "x", "--tui", "--", "sleep", "1"])
    assert args.tui and args.command == ["--", "sleep", "1"]
    assert parser().parse_args(["top", "c1", "c2", "--poll", "0.2"]).poll == 0.2


