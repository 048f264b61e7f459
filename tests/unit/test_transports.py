"""Per transport: the kernel's own slot counters, one table per connection (nconnect)."""
import pyarrow as pa
import pytest
from unit_helpers import meta

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import XPRT
from slotscope.analyzer.analysis import analyze
from slotscope.analyzer.job import Job
from slotscope.analyzer.report_html import write_html
from slotscope.analyzer.report_text import render_text
from slotscope.analyzer.transports import transport_table

pytestmark = pytest.mark.unit

S = 1_000_000_000
SERVER = "10.0.0.1:2049"


def sample(t, xprt, num, backlog=0, limit=2):
    return {"ts": t, "xprt_id": xprt, "client_id": 3, "num_reqs": num, "max_reqs": limit, "min_reqs": 2,
            "backlog": backlog, "sending": 0, "pending": num, "alloc": 1, "server": SERVER}


@pytest.fixture
def job(tmp_path):
    """nconnect=2, 2 slots each (both preallocated): tasks wait for a slot on transport 0
    from 2 s to 6 s of a 10 s recording, never on transport 1."""
    path = str(tmp_path / "cap")
    w = CaptureWriter(path)
    w.write_meta(meta("node-a", nfs_mounts=[{"server": "10.0.0.1", "vers": "3", "proto": "tcp", "nconnect": "2"}],
                      sunrpc={"tcp_max_slot_table_entries": "128"}))
    w.append("xprt", pa.Table.from_pylist([
        sample(0, 0, 2), sample(0, 1, 2), sample(2 * S, 0, 2, backlog=3), sample(3 * S, 1, 1),
        sample(6 * S, 0, 1), sample(10 * S, 0, 1), sample(10 * S, 1, 1)], schema=XPRT))
    w.close()
    return Job.open([path])


def test_each_connection_has_its_own_limit_and_fill(job):
    (t,) = transport_table(job, None)
    assert t["xprts"] == [
        {"id": 0, "max_reqs": 2, "min_reqs": 2, "peak_num_reqs": 2, "backlog_peak": 3,
         "saturated_fraction": pytest.approx(0.4)},       # waiters 2-6 s
        {"id": 1, "max_reqs": 2, "min_reqs": 2, "peak_num_reqs": 2, "backlog_peak": 0,
         "saturated_fraction": 0.0}]                      # all slots allocated at 0-3 s, nobody waiting
    # the kernel's limit (2 connections x 2), not the sysctl's 128 x 2
    assert t["max_slots"] == 4


def test_the_report_lists_the_connections(job):
    text = render_text(analyze(job, "0"))
    assert ("transport 0: 2 slots, peak 2 allocated (2 preallocated), tasks waiting for one 40% of the save, "
            "up to 3") in text
    assert "transport 1: 2 slots, peak 2 allocated (2 preallocated), tasks waiting for one 0% of the save" in text


def test_the_html_report_lists_the_connections(job, tmp_path):
    out = tmp_path / "r.html"
    write_html(job, analyze(job, "0"), str(out))
    html = out.read_text()
    assert "transport 0" in html and "transport 1" in html and "2 preallocated" in html
