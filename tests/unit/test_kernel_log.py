"""Kernel log reading (dmesg / journalctl formats) and the NFS/RPC fingerprints found in it."""
from __future__ import annotations

import datetime as dt
import gzip
import os

import pyarrow as pa
import pytest

from slotscope.analyzer.kernel_log import KernelLogError, fingerprints, read_kernel_log

pytestmark = pytest.mark.unit

S = 1_000_000_000


def utc_ns(*args, tz=dt.timezone.utc) -> int:
    return int(dt.datetime(*args, tzinfo=tz).timestamp()) * S


def write(tmp_path, text: str, name: str = "kern.log") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# A kernel 6.1 hung-task report: a rank stuck in fsync waiting for NFS writeback, as plain dmesg.
DMESG_FSYNC = """\
[ 4200.000100] nfs: server 10.0.0.1 not responding, still trying
[ 4321.123456] INFO: task python:4321 blocked for more than 120 seconds.
[ 4321.123470]       Not tainted 6.1.0-18-amd64 #1 Debian 6.1.76-1
[ 4321.123475] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[ 4321.123480] task:python          state:D stack:0     pid:4321  ppid:4300   flags:0x00004002
[ 4321.123484] Call Trace:
[ 4321.123486]  <TASK>
[ 4321.123490]  __schedule+0x34d/0x9e0
[ 4321.123495]  schedule+0x5a/0xd0
[ 4321.123498]  io_schedule+0x42/0x70
[ 4321.123500]  folio_wait_bit_common+0x12d/0x390
[ 4321.123503]  ? filemap_invalidate_unlock_two+0x50/0x50
[ 4321.123506]  folio_wait_writeback+0x28/0x80
[ 4321.123509]  __filemap_fdatawait_range+0x90/0x100
[ 4321.123512]  file_write_and_wait_range+0x85/0xc0
[ 4321.123515]  nfs_file_fsync+0x77/0x1d0 [nfs]
[ 4321.123518]  do_fsync+0x38/0x70
[ 4321.123520]  __x64_sys_fsync+0x10/0x20
[ 4321.123523]  do_syscall_64+0x58/0xc0
[ 4321.123526]  entry_SYSCALL_64_after_hwframe+0x64/0xce
[ 4321.123530] RIP: 0033:0x7f3b2c3e5b5b
[ 4321.123532] RSP: 002b:00007ffd8d3bb128 EFLAGS: 00000246 ORIG_RAX: 000000000000004a
[ 4321.123535] RAX: ffffffffffffffda RBX: 0000000000000003 RCX: 00007f3b2c3e5b5b
[ 4321.123537] RDX: 0000000000000000 RSI: 0000000000000000 RDI: 0000000000000003
[ 4321.123539] RBP: 00007f3b2c2b6740 R08: 0000000000000000 R09: 0000000000000000
[ 4321.123541] R10: 0000000000000000 R11: 0000000000000246 R12: 0000000000000003
[ 4321.123543] R13: 0000000000000000 R14: 0000000000000000 R15: 0000000000000000
[ 4321.123545]  </TASK>
[ 4330.000001] nfs: server 10.0.0.1 OK
"""
FSYNC_FUNCTIONS = ["__schedule", "schedule", "io_schedule", "folio_wait_bit_common",
                   "filemap_invalidate_unlock_two", "folio_wait_writeback", "__filemap_fdatawait_range",
                   "file_write_and_wait_range", "nfs_file_fsync", "do_fsync", "__x64_sys_fsync",
                   "do_syscall_64", "entry_SYSCALL_64_after_hwframe"]

# The flusher waiting on a WRITE RPC (sunrpc frames), then a hung ext4 journal thread (no NFS).
RPC_TRACE = """\
 __schedule+0x34d/0x9e0
 schedule+0x5a/0xd0
 rpc_wait_bit_killable+0x11/0x70 [sunrpc]
 __wait_on_bit+0x41/0x110
 ? __rpc_sleep_on_priority_timeout+0x80/0x80 [sunrpc]
 out_of_line_wait_on_bit+0x91/0xb0
 __rpc_execute+0x119/0x330 [sunrpc]
 rpc_execute+0xd5/0xf0 [sunrpc]
 rpc_run_task+0x148/0x190 [sunrpc]
 nfs_initiate_pgio+0xba/0x120 [nfs]
 nfs_generic_pg_pgios+0x79/0xb0 [nfs]
 nfs_pageio_doio+0x3a/0x80 [nfs]
 nfs_writepages+0x152/0x1f0 [nfs]
 do_writepages+0xc1/0x1d0
 __writeback_single_inode+0x3d/0x360
 writeback_sb_inodes+0x1ed/0x4a0
 wb_workfn+0x2bf/0x4d0
 process_one_work+0x1c7/0x380
 worker_thread+0x4d/0x380
 kthread+0xd7/0x100
 ret_from_fork+0x1f/0x30
""".splitlines()
RPC_FUNCTIONS = ["__schedule", "schedule", "rpc_wait_bit_killable", "__wait_on_bit",
                 "__rpc_sleep_on_priority_timeout", "out_of_line_wait_on_bit", "__rpc_execute", "rpc_execute",
                 "rpc_run_task", "nfs_initiate_pgio", "nfs_generic_pg_pgios", "nfs_pageio_doio",
                 "nfs_writepages", "do_writepages", "__writeback_single_inode", "writeback_sb_inodes",
                 "wb_workfn", "process_one_work", "worker_thread", "kthread", "ret_from_fork"]
EXT4_TRACE = """\
 __schedule+0x34d/0x9e0
 schedule+0x5a/0xd0
 io_schedule+0x42/0x70
 bit_wait_io+0xd/0x60
 __wait_on_bit+0x41/0x110
 out_of_line_wait_on_bit+0x91/0xb0
 jbd2_journal_commit_transaction+0x16a5/0x1ab0 [jbd2]
 kjournald2+0xa9/0x280 [jbd2]
 kthread+0xd7/0x100
 ret_from_fork+0x1f/0x30
""".splitlines()


# ---- formats -----------------------------------------------------------------------------------

def test_plain_dmesg_hung_task_in_fsync_with_nfs_frames(tmp_path):
    log = read_kernel_log(write(tmp_path, DMESG_FSYNC))
    assert log.schema.names == ["ts_mono_ns", "ts_utc_ns", "host", "message"]
    assert log["ts_mono_ns"][0].as_py() == 4200 * S + 100_000
    assert log["ts_utc_ns"].null_count == log.num_rows and log["host"].null_count == log.num_rows
    # the frame keeps the kernel's leading space, as /dev/kmsg stores it
    assert " __schedule+0x34d/0x9e0" in log["message"].to_pylist()

    fp = fingerprints(log).to_pylist()
    assert [r["kind"] for r in fp] == ["not_responding", "hung_task", "responding"]
    down, hung, up = fp
    assert (down["server"], down["ts_mono_ns"]) == ("10.0.0.1", 4200 * S + 100_000)
    assert (up["server"], up["ts_mono_ns"]) == ("10.0.0.1", 4330 * S + 1_000)
    assert (hung["task"], hung["pid"], hung["blocked_s"]) == ("python", 4321, 120)
    assert hung["ts_mono_ns"] == 4321 * S + 123_456_000
    assert hung["functions"] == FSYNC_FUNCTIONS
    assert hung["nfs_related"] is True
    assert hung["message"] == "INFO: task python:4321 blocked for more than 120 seconds."


def test_dmesg_T_is_utc_unless_a_zone_is_given(tmp_path):
    path = write(tmp_path, "[Wed Dec  2 19:30:38 2026] nfs: server filer-1.example.com not responding, timed out\n"
                           "[Wed Dec 12 09:05:01 2026] nfs: server filer-1.example.com OK\n")
    log = read_kernel_log(path)
    assert log["ts_utc_ns"].to_pylist() == [utc_ns(2026, 12, 2, 19, 30, 38), utc_ns(2026, 12, 12, 9, 5, 1)]
    assert log["ts_mono_ns"].null_count == 2
    east = dt.timezone(dt.timedelta(hours=2))
    assert read_kernel_log(path, tz=east)["ts_utc_ns"][0].as_py() == utc_ns(2026, 12, 2, 17, 30, 38)
    fp = fingerprints(log)
    assert fp["kind"].to_pylist() == ["timed_out", "responding"]
    assert fp["server"].to_pylist() == ["filer-1.example.com"] * 2


def test_dmesg_raw_and_dev_kmsg_lines(tmp_path):
    log = read_kernel_log(write(tmp_path, (
        "<4>[  123.456789] nfs: server 10.0.0.1 not responding, still trying\n"
        "4,1234,5678901,-;lockd: server 10.0.0.2 not responding, still trying\n"
        " SUBSYSTEM=net\n"                 # /dev/kmsg dictionary line: not a message
        "6,1235,5679000,-,caller=T42;lockd: server 10.0.0.2 OK\n")))
    assert log["ts_mono_ns"].to_pylist() == [123_456_789_000, 5_678_901_000, 5_679_000_000]
    assert log["message"].to_pylist()[1] == "lockd: server 10.0.0.2 not responding, still trying"
    fp = fingerprints(log)
    assert fp["kind"].to_pylist() == ["not_responding", "not_responding", "responding"]
    assert fp["server"].to_pylist() == ["10.0.0.1", "10.0.0.2", "10.0.0.2"]


def test_journalctl_short_without_a_year(tmp_path):
    path = write(tmp_path, (
        "-- Logs begin at Mon 2025-12-01 08:00:01 UTC, end at Thu 2026-01-01 00:10:00 UTC. --\n"
        "Dec 31 23:59:58 gpu-node-07 kernel: nfs: server 10.0.0.1 not responding, still trying\n"
        "Dec 31 23:59:59 gpu-node-07 systemd[1]: Starting Rotate log files...\n"   # not the kernel's
        "Jan 01 00:00:05.250000 gpu-node-07 kernel: nfs: server 10.0.0.1 OK\n"))
    log = read_kernel_log(path, year=2025)
    assert log["host"].to_pylist() == ["gpu-node-07", "gpu-node-07"]
    # the year turns over with the month: Dec 2025 then Jan 2026
    assert log["ts_utc_ns"].to_pylist() == [utc_ns(2025, 12, 31, 23, 59, 58),
                                           utc_ns(2026, 1, 1, 0, 0, 5) + 250_000_000]
    assert log["message"][1].as_py() == "nfs: server 10.0.0.1 OK"
    this_year = dt.datetime.now(dt.timezone.utc).year
    assert read_kernel_log(path)["ts_utc_ns"][0].as_py() == utc_ns(this_year, 12, 31, 23, 59, 58)


def test_journalctl_short_iso_and_precise(tmp_path):
    log = read_kernel_log(write(tmp_path, (
        "2026-12-02T19:30:38+0000 node-a kernel: nfs: server 10.0.0.1 not responding, still trying\n"
        "2026-12-02T20:30:40.123456+0100 node-b kernel: nfs: server 10.0.0.1 not responding, still trying\n"
        "2026-12-02T14:31:00-05:00 node-a kernel: nfs: server 10.0.0.1 OK\n")))
    assert log["host"].to_pylist() == ["node-a", "node-b", "node-a"]
    assert log["ts_utc_ns"].to_pylist() == [utc_ns(2026, 12, 2, 19, 30, 38),
                                           utc_ns(2026, 12, 2, 19, 30, 40) + 123_456_000,
                                           utc_ns(2026, 12, 2, 19, 31, 0)]
    assert fingerprints(log)["host"].to_pylist() == ["node-a", "node-b", "node-a"]


def test_journalctl_short_monotonic_with_a_hung_flusher(tmp_path):
    lines = ["[ 9876.543210] node-a kernel: INFO: task kworker/u16:2:187 blocked for more than 241 seconds.",
             "[ 9876.543300] node-a kernel:       Not tainted 6.1.0-18-amd64 #1 Debian 6.1.76-1",
             "[ 9876.543400] node-a kernel: Call Trace:",
             "[ 9876.543410] node-a kernel:  <TASK>"]
    lines += [f"[ 9876.5435{i:02d}] node-a kernel: {f}" for i, f in enumerate(RPC_TRACE)]
    lines += ["[ 9876.543999] node-a kernel:  </TASK>",
              "[ 9900.000000] node-a kernel: RPC: Could not send backchannel reply error: -32"]
    log = read_kernel_log(write(tmp_path, "\n".join(lines) + "\n"))
    assert log["ts_mono_ns"][0].as_py() == 9876 * S + 543_210_000
    assert set(log["host"].to_pylist()) == {"node-a"}
    fp = fingerprints(log).to_pylist()
    assert [r["kind"] for r in fp] == ["hung_task", "rpc_error"]
    hung = fp[0]
    # the comm holds a colon: the pid is the number after the last one
    assert (hung["task"], hung["pid"], hung["blocked_s"], hung["host"]) == ("kworker/u16:2", 187, 241, "node-a")
    assert hung["functions"] == RPC_FUNCTIONS and hung["nfs_related"] is True
    assert fp[1]["message"] == "RPC: Could not send backchannel reply error: -32"
    assert fp[1]["server"] is None and fp[1]["functions"] is None


def test_hung_task_without_nfs_frames_then_next_report(tmp_path):
    text = "[  500.000000] INFO: task jbd2/sda1-8:312 blocked for more than 122 seconds.\n"
    text += "".join(f"[  500.0000{i:02d}] {f}\n" for i, f in enumerate(EXT4_TRACE))
    text += "[  501.000000] INFO: task python:7001 blocked for more than 122 seconds.\n"
    text += "".join(f"[  501.0000{i:02d}] {f}\n" for i, f in enumerate(RPC_TRACE[:6]))
    text += "[  502.000000] e1000e 0000:00:19.0 eth0: NIC Link is Down\n"       # ends the report
    text += "[  503.000000]  nfs_file_fsync+0x77/0x1d0 [nfs]\n"                 # a stray frame: no report
    fp = fingerprints(read_kernel_log(write(tmp_path, text))).to_pylist()
    assert [(r["task"], r["pid"], r["blocked_s"]) for r in fp] == [("jbd2/sda1-8", 312, 122), ("python", 7001, 122)]
    assert fp[0]["functions"] == ["__schedule", "schedule", "io_schedule", "bit_wait_io", "__wait_on_bit",
                                  "out_of_line_wait_on_bit", "jbd2_journal_commit_transaction", "kjournald2",
                                  "kthread", "ret_from_fork"]
    assert fp[0]["nfs_related"] is False
    assert fp[1]["functions"] == RPC_FUNCTIONS[:6] and fp[1]["nfs_related"] is True


def test_rpc_and_nfs_error_lines(tmp_path):
    log = read_kernel_log(write(tmp_path, (
        "[  10.0] NFS: nfs4_reclaim_open_state: Lock reclaim failed!\n"
        "[  11.0] xs_tcp_setup_socket: connect returned unhandled error -107\n"
        "[  12.0] NFS: server 10.0.0.1 error: fileid changed\n"
        "[  13.0] NFSD: client 10.0.0.9 testing state ID with incorrect client ID\n"
        "[  14.0] EXT4-fs (sda1): mounted filesystem with ordered data mode\n")))
    fp = fingerprints(log)
    assert fp["kind"].to_pylist() == ["rpc_error"] * 4
    assert fp["ts_mono_ns"].to_pylist() == [10 * S, 11 * S, 12 * S, 13 * S]


def test_mixed_formats_keep_unrecognized_lines_without_timestamps(tmp_path):
    log = read_kernel_log(write(tmp_path, (
        "$ dmesg | tail\r\n"
        "\r\n"
        "[  42.000001] nfs: server 10.0.0.1 not responding, still trying\r\n"
        "Dec 02 19:30:38 node-a kernel: nfs: server 10.0.0.1 OK\r\n")), year=2026)
    assert log["message"].to_pylist() == ["$ dmesg | tail", "nfs: server 10.0.0.1 not responding, still trying",
                                          "nfs: server 10.0.0.1 OK"]
    assert log["ts_mono_ns"].to_pylist() == [None, 42 * S + 1_000, None]
    assert log["ts_utc_ns"].to_pylist() == [None, None, utc_ns(2026, 12, 2, 19, 30, 38)]


# ---- errors ------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.log")
    with pytest.raises(KernelLogError, match="nope.log") as exc:
        read_kernel_log(path)
    assert "\n" not in str(exc.value) and isinstance(exc.value, ValueError)


@pytest.mark.timeout(10)        # a FIFO opened for reading the plain way waits for a writer forever
@pytest.mark.parametrize("make,kind", [
    (lambda d: d, "a directory"),
    (lambda d: os.mkfifo(d / "log") or d / "log", "a FIFO"),
    (lambda d: os.symlink("/dev/zero", d / "log") or d / "log", "a character device"),   # it never ends
], ids=["directory", "fifo", "dev_zero"])
def test_only_a_regular_file_is_a_log(tmp_path, make, kind):
    with pytest.raises(KernelLogError, match=rf"cannot read kernel log \({kind}, not a regular file\)"):
        read_kernel_log(str(make(tmp_path)))


def test_a_log_too_big_is_refused(tmp_path, monkeypatch):
    from slotscope.analyzer import kernel_log
    monkeypatch.setattr(kernel_log, "LOG_MAX_BYTES", 1 << 20)
    with pytest.raises(KernelLogError, match="larger than 1 MiB"):
        read_kernel_log(write(tmp_path, DMESG_FSYNC * ((2 << 20) // len(DMESG_FSYNC))))


def test_binary_and_compressed_files(tmp_path):
    png = tmp_path / "shot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)) * 4)
    with pytest.raises(KernelLogError, match=r"shot\.png: binary file"):
        read_kernel_log(str(png))
    gz = tmp_path / "kern.log.gz"
    gz.write_bytes(gzip.compress(DMESG_FSYNC.encode()))
    with pytest.raises(KernelLogError, match=r"kern\.log\.gz: compressed"):
        read_kernel_log(str(gz))


def test_empty_file_and_no_kernel_lines(tmp_path):
    with pytest.raises(KernelLogError, match="no kernel log lines found in .*empty.log"):
        read_kernel_log(write(tmp_path, "", "empty.log"))
    with pytest.raises(KernelLogError, match="no kernel log lines found in .*notes.txt"):
        read_kernel_log(write(tmp_path, "the save hung again at 19:30\nsee ticket 123\n", "notes.txt"))
    only_user = "Dec 02 19:30:38 node-a systemd[1]: Started Session 4 of user root.\n-- No entries --\n"
    with pytest.raises(KernelLogError, match="no kernel log lines found"):
        read_kernel_log(write(tmp_path, only_user, "journal.txt"))


# ---- the agent's kmsg table --------------------------------------------------------------------

def test_kmsg_table_as_the_agent_records_it():
    from slotscope.agent.samplers import KmsgFilter
    from slotscope.capture.tables import KMSG
    report = ["INFO: task python:4321 blocked for more than 120 seconds.",
              "      Not tainted 6.1.0-18-amd64 #1 Debian 6.1.76-1", "Call Trace:", " <TASK>"]
    report += RPC_TRACE + [" </TASK>"]
    records = ["nfs: server 10.0.0.1 not responding, still trying"] + report + ["nfs: server 10.0.0.1 OK"]
    # the agent's filter keeps NFS lines and the whole hung-task report
    keep = KmsgFilter().keep
    kept = [m for m in records + ["usb 1-1: new high-speed USB device"] if keep(m)]
    assert kept == records
    table = pa.Table.from_pylist([{"ts": 7_000_000_000 + i * 1000, "level": 4, "message": m}
                                  for i, m in enumerate(kept)], schema=KMSG)
    fp = fingerprints(table).to_pylist()
    assert [r["kind"] for r in fp] == ["not_responding", "hung_task", "responding"]
    assert [r["ts_mono_ns"] for r in fp] == [7_000_000_000, 7_000_001_000, 7_000_000_000 + (len(kept) - 1) * 1000]
    assert fp[1]["functions"] == [f.split("+")[0].split()[-1] for f in RPC_TRACE]   # every frame
    assert fp[1]["nfs_related"] is True
    assert fp[0]["ts_utc_ns"] is None and fp[0]["host"] is None


def test_hung_task_without_any_trace_is_unknown():
    fp = fingerprints(pa.table({"message": ["INFO: task dd:99 blocked for more than 480 seconds."]})).to_pylist()
    assert (fp[0]["pid"], fp[0]["blocked_s"], fp[0]["functions"], fp[0]["nfs_related"]) == (99, 480, None, None)


def test_interleaved_hosts_keep_their_own_reports():
    msgs = [("a", "INFO: task python:1 blocked for more than 120 seconds."),
            ("b", "INFO: task python:2 blocked for more than 120 seconds."),
            ("a", " rpc_wait_bit_killable+0x11/0x70 [sunrpc]"),
            ("b", " jbd2_log_wait_commit+0xac/0x120 [jbd2]"),
            ("a", " nfs_file_fsync+0x77/0x1d0 [nfs]")]
    fp = fingerprints(pa.table({"host": [h for h, _ in msgs], "message": [m for _, m in msgs]})).to_pylist()
    assert [(r["host"], r["functions"], r["nfs_related"]) for r in fp] == [
        ("a", ["rpc_wait_bit_killable", "nfs_file_fsync"], True), ("b", ["jbd2_log_wait_commit"], False)]
