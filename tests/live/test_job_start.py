"""A real checkpointing job recorded from its first instruction (`record -- torchrun ...`) on
this machine's kernel (live tier): four ranks importing torch stat and open tens of thousands
of files, none of which the recording wants. The kernel drops the stats of devices that hold
no traced file (FILTER_DEVS), so no event is lost, and the job's saves are found whole.

This machine has no NFS: the checkpoint directory is a tmpfs of its own, traced with
--fs tmpfs, as a shared filesystem would be."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from livehelp import slotscope

from slotscope.capture.reader import Capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready"),
              pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="no torch: ./dev.sh setup installs its CPU build where pip finds one")]

CLIENTS = Path(__file__).resolve().parent.parent / "vm" / "guest" / "clients.py"


@pytest.fixture
def shared_dir(tmp_path):
    """A filesystem of its own for the checkpoints: a tmpfs mounted for the test."""
    mnt = tmp_path / "shared"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "slotscope-test", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_job_recorded_from_its_start_loses_nothing(shared_dir, tmp_path):
    ckpt, cap, results = shared_dir / "ckpt", tmp_path / "cap", tmp_path / "results"
    ckpt.mkdir()
    results.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    res = slotscope("record", "-o", str(cap), "--fs", "tmpfs", "--path", str(ckpt), "--",
                    str(torchrun), "--standalone", "--nproc-per-node", "4", str(CLIENTS), "--client", "dcp",
                    "--client", "safetensors", "--dir", str(ckpt), "--state-mb", "4", "--save-every", "12",
                    "--results", str(results), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    loss = Capture.open(str(cap)).read("loss")
    assert loss is None or pc.sum(loss["lost"]).as_py() == 0, loss.to_pylist()
    # The agent's share: each of the 5 processes (torchrun and 4 ranks) stats ~27,000 paths while
    # importing torch, a syscall and a path event each, ~300,000 in all when every stat reaches
    # the agent (so many that the path ring overflowed here); without them, ~45,000 remain.
    events = pc.max(Capture.open(str(cap)).read("agent")["events"]).as_py()
    assert events < 120_000, events

    ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(4)]
    analysis = json.loads(slotscope("analyze", "--json", str(cap)).stdout)
    saves = analysis["saves"]
    assert [s["formats"] for s in saves] == [["dcp"], ["safetensors"]], [s["what"] for s in saves]
    assert saves[0]["what"] == "DCP checkpoint step_1/: 4 ranks x 4 shards + .metadata"
    assert saves[1]["renamed"] == 4     # safetensors writes a temporary file and renames it
    for i, save in enumerate(saves):
        mine = {r["rank"]: sum((ckpt / f).stat().st_size for f in r["saves"][i]["files"]) for r in ranks}
        assert {r["rank"]: r["bytes"] for r in save["by_rank"]} == mine, (save["what"], save["by_rank"])
    # the stats of the traced files are kept (DCP looks for .metadata before it writes)
    sc = Capture.open(str(cap)).read("syscall")
    stats = sc.filter(pc.equal(pc.cast(sc["syscall"], "string"), "newfstatat"))
    assert pc.any(pc.match_substring(stats["path"], "/ckpt/")).as_py()
