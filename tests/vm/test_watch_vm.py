"""`slotscope watch` on a real NFS client (issue 24), the `watched` scenario (vmrig/scenarios.py):
watch runs across a saturating storm and, once the storm's incident is written and analysed, a
healthy save, while Debian's Prometheus on the host scrapes its metrics through the guest's one
forwarded port. Exactly one incident comes of it, the storm's, whose report says slot_saturation;
and Prometheus' answers are what that incident's capture holds."""
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import prom
from dashboard import panel_queries, promql
from slotscope.analyzer.transports import occupancy
from slotscope.capture.reader import Capture

pytestmark = pytest.mark.vm

SERVER = "10.0.0.1:2049"


def the_incident(out):
    """The scenario's one incident: the storm's (every incident watch kept is in incidents/)."""
    names = sorted(p.name for p in (out / "incidents").iterdir())
    assert len(names) == 1 and names[0].endswith("-slot_full_s"), names
    return out / "incidents" / names[0]


def saves(out):
    """(the storm's ranks, the healthy save's) of scenario.json: the healthy one starts late (after_s)."""
    rec = json.loads((out / "scenario.json").read_text())
    late = {int(r) for r, o in rec["spec"]["rank_overrides"].items() if "after_s" in o}
    return [r for r in rec["ranks"] if r["rank"] not in late], [r for r in rec["ranks"] if r["rank"] in late]


def test_one_incident_the_storms(watched):
    """One incident, opened by slot_full_s on the NFS server's transport while the storm ran: it
    holds every byte the storm's ranks wrote, from before the trigger, and none of the healthy
    save's (which ran once watch watched again, slot_full_s armed: it opened nothing); its report
    says slot_saturation for the storm's ranks."""
    storm, healthy = saves(watched)
    path = the_incident(watched)
    cap = Capture.open(str(path))
    incident = cap.meta["incident"]
    assert incident["trigger"] == "slot_full_s" and incident["seen"]["server"] == SERVER
    rows = cap.read("syscall")
    written = rows.filter(pc.equal(pc.cast(rows["syscall"], pa.string()), "write"))
    by_pid = {r["tgid"]: r["bytes"] for r in written.group_by("tgid").aggregate([("bytes", "sum")])
              .rename_columns(["tgid", "bytes"]).to_pylist()}
    assert {r["pid"]: by_pid.get(r["pid"]) for r in storm} == {r["pid"]: r["bytes"] for r in storm}
    assert not {r["pid"] for r in healthy} & set(rows["tgid"].to_pylist())
    # the storm's calls (its mkdirs and creates filled the table first) from at least slot_full_s
    # before the trigger: the table was full that long
    fired = incident["fired"]["monotonic_ns"]
    mine = rows.filter(pc.is_in(rows["tgid"], pa.array([r["pid"] for r in storm], rows["tgid"].type)))
    first = pc.min(mine["ts_enter"]).as_py()
    assert fired - first >= incident["threshold"] * 1e9 and incident["before_s"] >= (fired - first) / 1e9

    # the records kept as read (nfs_io, xprt: flight.py) became the rows the RPCs point to
    rpcs = cap.read("rpc")
    writes = rpcs.filter(pc.and_(pc.equal(rpcs["procname"], "WRITE"), pc.equal(rpcs["complete"], 1)))
    nfs = cap.read("nfs_io")
    done = nfs.filter(pc.equal(nfs["kind"], "write_done"))
    completed = set(zip(done["fileid"].to_pylist(), done["offset"].to_pylist()))
    # every 4 KiB WRITE of the storm (0.25 MiB a rank), with its completion
    assert len(set(zip(writes["fileid"].to_pylist(), writes["io_offset"].to_pylist())) & completed) >= len(storm) * 64
    assert set(writes["xprt_id"].to_pylist()) <= set(cap.read("xprt")["xprt_id"].to_pylist())

    report = json.loads((path / "report.json").read_text())
    assert report["verdict"] == "slot_saturation", [(f["kind"], f["severity"]) for f in report["findings"]]
    [f] = [f for f in report["findings"] if f["kind"] == "slot_saturation"]
    assert f["ranks"] == sorted(r["rank"] for r in storm)
    assert (path / "report.txt").read_text().startswith("verdict: slot_saturation")
    assert (path / "report.html").read_text().startswith("<!DOCTYPE html>")
    log = (watched / "agent.log").read_text()
    assert log.count(" opened: ") == 1 and "stopped (SIGTERM)" in log, log


@pytest.fixture(scope="module")
def prometheus(watched, tmp_path_factory):
    """Prometheus on a copy of the TSDB the boot's scrapes filled, scraping nothing: -> its port."""
    if prom.PROMETHEUS is None:
        pytest.skip("no prometheus (apt-get install prometheus; dev.sh setup does)")
    tsdb = tmp_path_factory.mktemp("prometheus") / "tsdb"
    shutil.copytree(watched / "prometheus", tsdb)
    proc, port = prom.start(tsdb)
    try:
        prom.wait_ready(proc, port)
        yield port
    finally:
        prom.stop(proc)


def scraped(out):
    """The boot's Prometheus: its target, and the host's UTC s it scraped from and to."""
    return json.loads((out / "scenario.json").read_text())["boot"]["prometheus"]


def scrapes(out, port, expr):
    """Every scrape of the boot of the one series `expr` selects: [(host UTC s, value)]."""
    boot = scraped(out)
    [series] = prom.query(port, f"{expr}[{int(boot['to'] - boot['from']) + 1}s]", boot["to"])
    return [(t, float(v)) for t, v in series["values"]]


def total(port, expr, at):
    return sum(prom.values(prom.query(port, expr, at)).values())


def test_prometheus_saw_what_the_incident_holds(watched, prometheus):
    """Prometheus scraped watch every second for the boot. The bytes written stood still at the
    storm's between the two saves and ended at both saves': there, in the quiet gap (found in the
    scrapes, so no clock of the guest's is needed), one incident, slot_full_s, and the storm's RPC
    counts, slot wait and execute time and the transport's full seconds exactly what the
    incident's capture holds (the counters count the same rows the incident keeps); the
    dashboard's slot-wait share over the storm that of the capture. At the end, still one
    incident; over the healthy save, the table never full and next to no slot wait."""
    port = prometheus
    storm, healthy = saves(watched)
    written = scrapes(watched, port, "slotscope_written_bytes_total")     # one mount: one series
    storm_bytes = sum(r["bytes"] for r in storm)
    gap = [t for t, v in written if v == storm_bytes]
    assert gap and written[-1][1] == storm_bytes + sum(r["bytes"] for r in healthy), written
    between, end = gap[len(gap) // 2], written[-1][0]
    instance = scraped(watched)["target"]
    incidents = panel_queries()["Incidents, by trigger"]
    for at in (between, end):
        assert prom.values(prom.query(port, promql(incidents, 1, instance), at)) == {"trigger=slot_full_s": 1}

    cap = Capture.open(str(the_incident(watched)))
    rpc = cap.read("rpc")
    done = rpc.filter(pc.equal(rpc["complete"], 1))
    slots = cap.read("slots")
    slots = slots.filter(pc.equal(slots["server"], SERVER))
    occ = occupancy(slots, 0)
    held = np.diff(occ.ts) / 1e9        # each sample holds until the next, as the metrics count it
    full_s = float((held * (occ.cols["backlog"][:-1] > 0)).sum())
    slot_wait_s = pc.sum(done["slot_wait_ns"].fill_null(0)).as_py() / 1e9
    execute_s = pc.sum(done["execute_ns"].fill_null(0)).as_py() / 1e9
    assert total(port, "slotscope_rpc_slot_wait_seconds_count", between) == done.num_rows
    assert total(port, "slotscope_rpc_slot_wait_seconds_sum", between) == pytest.approx(slot_wait_s, rel=1e-9)
    assert total(port, "slotscope_rpc_execute_seconds_sum", between) == pytest.approx(execute_s, rel=1e-9)
    full = f'slotscope_transport_full_seconds_total{{server="{SERVER}"}}'
    assert total(port, full, between) == pytest.approx(full_s, rel=1e-9)
    # saturated: the table full for most of the storm, a large share of RPC time spent waiting for a slot
    span_s = (int(occ.ts[-1]) - int(occ.ts[0])) / 1e9
    assert full_s / span_s > 0.5 and slot_wait_s / execute_s > 0.3

    # the dashboard's share over the storm (a window from the boot's start to the gap): rate()'s
    # extrapolation is the same above and below the line, but for what the first scrape held
    share = panel_queries()["Share of RPC time spent waiting for a slot, by node and server"]
    window = int(between - scraped(watched)["from"]) + 1
    over_storm = prom.values(prom.query(port, promql(share, window, instance), between))
    assert over_storm[f"instance={instance},server={SERVER}"] == pytest.approx(slot_wait_s / execute_s, rel=0.05)

    # the healthy save: nothing waited for a slot, and its RPCs next to no time
    assert total(port, full, end) == pytest.approx(full_s, rel=1e-9)
    added = {name: total(port, f"slotscope_rpc_{name}_seconds_sum", end) - total(port, f"slotscope_rpc_{name}_seconds_sum",
                                                                                   between)
             for name in ("slot_wait", "execute")}
    assert added["execute"] > 0 and added["slot_wait"] / added["execute"] < 0.05, added
