"""One torchrun job over two nodes (the two_nodes_torch scenario: a pair of VMs, node 2's link held
to 5 Mbit/s): `torchrun --nnodes 2 --node-rank K` puts ranks 0-3 on node 1 and 4-7 on node 2, gloo
across the link, and `slotscope analyze CAP1 CAP2` reports the one job: its eight ranks, as torchrun
numbered them, on their hosts; its torch.save and DCP saves, each a save of the job with every rank
charged its files byte for byte; and node 2 the straggler node of the torch.save (DCP's
collective save ends on every rank at once)."""

import pytest

from test_clients import check_saves, scenario
from test_two_nodes import analyze_nodes

pytestmark = pytest.mark.vm

CAPTURES = ("capture", "node2/capture")
NODE = {**{r: "node1" for r in range(4)}, **{r: "node2" for r in range(4, 8)}}


@pytest.fixture(scope="module")
def report(two_nodes_torch):
    return analyze_nodes(two_nodes_torch)


def test_torchrun_numbers_the_ranks_across_both_nodes(two_nodes_torch, report):
    """The ranks' RANK, LOCAL_RANK and WORLD_SIZE are torchrun's (the rig sets none for a real job),
    and the report finds each rank's process on its host under that rank."""
    ranks = scenario(two_nodes_torch)["ranks"]
    assert [(r["rank"], r["local_rank"], r["world_size"], r["host"]) for r in ranks] == \
        [(i, i % 4, 8, NODE[i]) for i in range(8)]
    assert [(r["rank"], r["host"]) for r in report["ranks"]] == list(NODE.items())
    pids = {r["rank"]: r["pids"] for r in report["ranks"]}
    assert all(r["pid"] in pids[r["rank"]] for r in ranks), (pids, [r["pid"] for r in ranks])
    # each node's transport, to its own server address
    assert {(t["host"], t["server"]) for t in report["transports"]} == \
        {("node1", "10.0.0.1:2049"), ("node2", "10.0.1.1:2049")}


def test_each_library_saves_as_a_save_of_the_job(two_nodes_torch, report):
    """torch.save, then DCP: each one save of the report, of all eight ranks on both hosts, within
    the ranks' own timings (each on its node's clock), every rank charged the bytes of its files."""
    expected = check_saves(two_nodes_torch, report, CAPTURES)
    assert [client for client, _, _ in expected] == ["torch-save", "dcp"]
    for save in report["saves"]:
        assert save["ranks"] == 8 and {(r["rank"], r["host"]) for r in save["by_rank"]} == set(NODE.items()), \
            save["by_rank"]


def test_the_rate_limited_node_is_the_straggler_of_the_torch_save(report):
    """torch.save: each rank saves on its own, so node 2's ranks, whose 4 MiB go through 5 Mbit/s,
    end late together: straggler_node, with node 2's ranks and server."""
    torch_save, dcp = report["saves"]
    assert torch_save["verdict"] == "straggler_node", [f["kind"] for f in torch_save["findings"]]
    [f] = [f for f in torch_save["findings"] if f["kind"] == "straggler_node"]
    assert f["ranks"] == [4, 5, 6, 7] and [n["host"] for n in f["evidence"]["nodes"]] == ["node2"]
    assert f["servers"] == ["10.0.1.1:2049"]
    print(f"{torch_save['what']}: {f['summary']}")


def test_no_node_is_named_late_in_the_collective_dcp_save(report):
    """DCP's save is collective: every rank's ends with the job's (after the coordinator's
    .metadata, each rank opens the directory last), and under TCG node 1's ranks' own writes took
    about as long as node 2's through its link (8 s against 5-10 s). No node ends late, and none
    is named: a straggler_node here would be a wrong one."""
    dcp = report["saves"][1]
    ends = [r["seconds"] for r in dcp["by_rank"]]
    assert not [f for f in dcp["findings"] if f["kind"] == "straggler_node"], dcp["findings"]
    print(f"{dcp['what']}: verdict {dcp['verdict']}; rank save times {min(ends):.1f}-{max(ends):.1f} s")
