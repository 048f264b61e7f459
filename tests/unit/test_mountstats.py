"""The kernel's own NFS counters in meta.json (mountstats at start and stop), and the
analyzer's check of a capture against their difference."""
import pyarrow as pa
import pytest
from unit_helpers import meta

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import RPC
from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job
from slotscope.analyzer.mountstats import capture_deltas, parse

pytestmark = pytest.mark.unit

SECTION = """device 10.0.0.1:/export mounted on /mnt/nfs with fstype nfs statvers=1.1
\topts:\trw,vers=3,rsize=262144,wsize=262144,hard,proto=tcp,timeo=600,retrans=2
\tRPC iostats version: 1.1  p/v: 100003/3 (nfs)
\txprt:\ttcp 754 1 2 0 7 303 303 0 330 107 2 7 24
\tper-op statistics
\t        NULL: 1 1 0 44 24 58 12 70 0
\t     GETATTR: {getattr} {getattr} 0 160 224 0 27 28 0
\t       WRITE: {write} {write} 0 4223248 36448 1358 4507 5924 0
\t      COMMIT: 3 3 0 300 384 80 68 149 0
"""


def section(write, getattr_=2):
    return SECTION.format(write=write, getattr=getattr_)


def test_parse_one_mount_of_a_whole_file():
    text = "device proc mounted on /proc with fstype proc\n" + section(268)
    got = parse(text)
    assert got["ops"]["WRITE"]["ops"] == 268 and got["ops"]["COMMIT"]["execute_ms"] == 149
    assert got["xprt"][0]["max_slots"] == 2 and got["xprt"][0]["bklog_u"] == 107
    with pytest.raises(ValueError, match="no NFS mount on /mnt/other"):
        parse(text, "/mnt/other")


def rpc_row(procname, n):
    row = {f.name: 0 for f in RPC if pa.types.is_integer(f.type)}
    row.update(procname=procname, progname="nfs", server="10.0.0.1:2049", complete=1, attempts=1,
               ts_begin=2_000 + n, ts_end=3_000 + n)
    return row


@pytest.fixture
def capture(tmp_path):
    def build(captured_writes):
        path = str(tmp_path / f"cap{captured_writes}")
        m = meta(mountstats_start={"/mnt/nfs": section(100)}, mountstats_stop={"/mnt/nfs": section(110, 5)})
        w = CaptureWriter(path)
        w.write_meta(m)
        rows = [rpc_row("WRITE", i) for i in range(captured_writes)] + [rpc_row("GETATTR", i) for i in range(3)]
        w.append("rpc", pa.Table.from_pylist(rows, schema=RPC))
        w.close()
        return path
    return build


def test_deltas_over_the_recording(capture):
    d = capture_deltas(Job.open([capture(10)]).captures[0].meta)
    assert {op: c["ops"] for op, c in d["/mnt/nfs"]["ops"].items()} == {
        "NULL": 0, "GETATTR": 3, "WRITE": 10, "COMMIT": 0}


def test_capture_agrees_with_the_kernel(capture):
    result = analyze(Job.open([capture(10)]), "0")
    assert [(k["procedure"], k["kernel_ops"], k["captured"]) for k in result["kernel_check"]] == [
        ("GETATTR", 3, 3), ("WRITE", 10, 10)]
    assert not any("disagree" in n for n in result["notes"])


def test_a_capture_that_missed_rpcs_says_so(capture):
    result = analyze(Job.open([capture(7)]), "0")
    [note] = [n for n in result["notes"] if "disagree" in n]
    assert "WRITE (7 captured, 10 counted on node-a)" in note


def test_no_check_on_a_window_of_the_recording(capture):
    """mountstats cover the whole recording: a window of it (--since/--until, the TUI's time
    cursor) is not compared with them."""
    from slotscope.analyzer.job import between
    from unit_helpers import START_NS
    job = between(Job.open([capture(7)]), START_NS, START_NS + 10**9)
    result = analyze(job, "0")
    assert result["kernel_check"] == [] and not any("disagree" in n for n in result["notes"])
