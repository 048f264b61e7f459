"""Real checkpoint libraries on NFS (slow tier): torch.save, torch.distributed.checkpoint (sync
and async) and safetensors, run by torchrun as users run them (tests/vm/guest/clients.py). Each
library's save is found as a save of its own, named after its layout, charged to the ranks
byte for byte against the server's files, timed within the clients' own measurements, and
given its verdict: healthy on a healthy mount, slot_saturation where 2 slots limit it."""
import json

import pyarrow.compute as pc
import pytest

from slotscope.analyzer.attribution import attributed_rpcs
from slotscope.analyzer.job import Job, utc_ns
from slotscope.capture.meta import utc_offset_ns

from test_verdicts import analyze

pytestmark = pytest.mark.vm

FORMAT = {"torch-save": "torch", "dcp": "dcp", "dcp-async": "dcp", "safetensors": "safetensors"}
EDGE_S = 0.25       # the save's file events lie within the ranks' own timings, this much either side


def scenario(out):
    return json.loads((out / "scenario.json").read_text())


def client_saves(rec):
    """[(client, step, {rank: save record})] in the order the job saved."""
    order = []
    for r in rec["ranks"]:
        for i, s in enumerate(r["saves"]):
            if len(order) <= i:
                order.append((s["client"], s["step"], {}))
            order[i][2][r["rank"]] = s
    return order


def check_saves(out, result, captures=("capture",)):
    """Each save of the job is one save of the analysis, in order, with the client's format,
    within the ranks' own measurements (each on its host's clock: the capture of that host),
    with the bytes of the files each rank made (their sizes on the server) charged to it: DCP's
    writer threads are its threads, and no other process writes."""
    rec = scenario(out)
    metas = [json.loads((out / c / "meta.json").read_text()) for c in captures]
    offset = {m["host"]: utc_offset_ns(m) for m in metas}
    host = {r["rank"]: r["host"] for r in rec["ranks"]}
    expected = client_saves(rec)
    assert [s["number"] for s in result["saves"]] == list(range(1, len(expected) + 1)), \
        [(s["what"], s["start"], s["duration_s"]) for s in result["saves"]]
    for (client, step, by_rank), save in zip(expected, result["saves"]):
        assert save["formats"] == [FORMAT[client]], (client, save["what"])
        start = min(s["start"] * 1e9 + offset[host[rank]] for rank, s in by_rank.items())
        end = max(s["end"] * 1e9 + offset[host[rank]] for rank, s in by_rank.items())
        assert start - EDGE_S * 1e9 <= utc_ns(save["start"]) and utc_ns(save["end"]) <= end + EDGE_S * 1e9, \
            (client, save["start"], save["end"], start, end)
        files = {f: n for s in by_rank.values() for f, n in s["files"].items()}
        assert all(rec["server_files"][f] == n for f, n in files.items()), client
        assert save["bytes"] == sum(files.values()) and save["files"] == len(files), (client, save)
        assert {r["rank"]: r["bytes"] for r in save["by_rank"]} == \
            {rank: sum(s["files"].values()) for rank, s in by_rank.items()}, (client, save["by_rank"])
    return expected


def check_charged(out):
    """Every WRITE RPC is charged to a rank, and to the one that wrote its file."""
    rec = scenario(out)
    job = Job.open([str(out / "capture")])
    rank_of_pid = {r["pid"]: r["rank"] for r in rec["ranks"]}
    sc = job.table("syscall")
    writer_of_ino = {r["ino"]: r["tgid"] for r in sc.filter(pc.fill_null(pc.greater(sc["bytes"], 0), False))
                     .select(["ino", "tgid"]).to_pylist() if r["ino"]}
    writes = attributed_rpcs(job).filter(pc.equal(attributed_rpcs(job)["procname"], "WRITE")).to_pylist()
    methods = {}
    for w in writes:
        m = methods.setdefault(w["attribution"], [0, 0])
        m[0] += rank_of_pid.get(w["attributed_tgid"]) is not None and \
            writer_of_ino.get(w["fileid"], w["attributed_tgid"]) == w["attributed_tgid"]
        m[1] += 1
    assert writes and all(right == n for right, n in methods.values()), methods
    return methods


def test_each_library_saves_healthy_on_a_healthy_mount(clients_healthy):
    """No slot limit, 10 ms round trip: every library's save is healthy."""
    result = analyze(clients_healthy)
    expected = check_saves(clients_healthy, result)
    assert [s["verdict"] for s in result["saves"]] == ["healthy"] * len(expected), \
        [(s["what"], s["verdict"], [f["kind"] for f in s["findings"]]) for s in result["saves"]]
    check_charged(clients_healthy)


def test_each_library_saturates_two_slots(clients_saturated):
    """2 slots of 32 KiB per 20 ms round trip: every library's save is slot_saturation, its
    throughput while WRITEs are sent (DCP plans before) at the Little's-law ceiling, so the
    slot table, not the emulated CPU, is the limit."""
    result = analyze(clients_saturated)
    check_saves(clients_saturated, result)
    for save in result["saves"]:
        assert save["verdict"] == "slot_saturation", (save["what"], [f["kind"] for f in save["findings"]])
        # the ranks' time in close/fsync, where there is enough of it, is the full table's doing
        assert all(f["explained_by"] == "slot_saturation" for f in save["findings"]
                   if f["kind"] == "flush_commit_stall"), save["findings"]
        [f] = [f for f in save["findings"] if f["kind"] == "slot_saturation"]
        ev = f["evidence"]
        assert ev["max_slots"] == 2 and ev["peak_in_use"] == 2 and ev["mean_write_bytes"] <= 32768
        assert 0.6 < ev["throughput_vs_ceiling"] < 1.2, (save["what"], ev)
    check_charged(clients_saturated)


def test_the_saves_of_one_job_are_named_and_compared(clients_healthy):
    """The job's four saves, 12 s of computing apart, are four saves in the report, each named for
    its library and files, and compared (the trend names the slowest and the fastest)."""
    result = analyze(clients_healthy)
    assert [s["what"] for s in result["saves"]] == [
        "torch.save checkpoint step_1/: 2 files (model_rank0.pt, model_rank1.pt)",
        *["DCP checkpoint step_1/: 2 ranks x 4 shards + .metadata"] * 2,
        "safetensors checkpoint step_1/: 2 files (model_rank0.safetensors, model_rank1.safetensors)"]
    trend = result["save_trend"]
    assert len(trend["durations_s"]) == 4 and {trend["slowest"], trend["fastest"]} <= {1, 2, 3, 4}
    assert trend["durations_s"][trend["slowest"] - 1] == max(trend["durations_s"])
    assert trend["text"].startswith(f"save {trend['slowest']} took") or "none slower" in trend["text"]
