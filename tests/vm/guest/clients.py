"""A real checkpointing job: one rank of it, launched by torchrun as users launch theirs
(`torchrun --standalone --nproc-per-node N clients.py ...`, gloo backend; over two nodes
`torchrun --nnodes 2 --node-rank K ...`), so RANK, LOCAL_RANK and WORLD_SIZE come from torchrun.

Each rank holds a model-like state dict of --state-mb (layers of weights and biases) and
saves it --saves times into DIR/step_<n>/, computing --save-every seconds between saves
as a training loop does. With several --client, one job saves with each in turn, into
DIR/<client>/step_<n>/ (a job's start, torch's import above all, is minutes under TCG).
The clients, one per checkpoint library:

  torch-save   every rank torch.save()s its shard to its own file
  dcp          torch.distributed.checkpoint.save(), FileSystemWriter(thread_count=4,
               sync_files=True), of DTensors sharded across the ranks
  dcp-async    the same through async_save(), the rank computing while it writes; the
               save ends at future.result()
  safetensors  safetensors.torch.save_file() per rank

Each rank writes RESULTS/rank<r>.json: its rank, local rank and world size as torchrun gave
them, its host, and per save the time it measured around its save call
(CLOCK_MONOTONIC, as the capture's) and the files it produced, relative to DIR (their sizes
are read afterwards, from the server's side: a stat here would be NFS traffic of its own).
"""

import argparse
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

LAYERS = 8
COLS = 1024         # float32: 4 KiB per row


def state_dict(rank, world, state_mb, dtensors):
    """LAYERS weights of state_mb/LAYERS each on this rank, and their biases; with dtensors
    (for DCP) as this rank's shards of DTensors split across the ranks, else plain tensors."""
    rows = max(1, int(state_mb * 2**20) // (LAYERS * COLS * 4))
    gen = torch.Generator().manual_seed(rank)
    local = {}
    for i in range(LAYERS):
        local[f"layers.{i}.weight"] = torch.rand(rows, COLS, generator=gen)
        local[f"layers.{i}.bias"] = torch.rand(rows, generator=gen)
    if not dtensors:
        return local
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (world,))
    return {"model": {k: DTensor.from_local(t, mesh, [Shard(0)], run_check=False) for k, t in local.items()}}


def compute(seconds):
    """A training step's worth of CPU, for `seconds`."""
    a = torch.rand(64, 64)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = a @ a
        a /= a.norm()


def save(client, state, where, rank):
    """One save by this rank; returns the file names it produced in `where`."""
    if not client.startswith("dcp"):    # DCP's writer makes its directory itself
        os.makedirs(where, exist_ok=True)
    if client == "torch-save":
        name = f"model_rank{rank}.pt"
        torch.save(state, os.path.join(where, name))
        return [name]
    if client == "safetensors":
        from safetensors.torch import save_file
        name = f"model_rank{rank}.safetensors"
        save_file(state, os.path.join(where, name))
        return [name]
    import torch.distributed.checkpoint as dcp
    writer = dcp.FileSystemWriter(where, thread_count=4, sync_files=True)
    if client == "dcp":
        dcp.save(state, storage_writer=writer)
    else:
        future = dcp.async_save(state, storage_writer=writer)
        while not future.done():
            compute(0.05)
        future.result()
    # DCP names each rank's shards __<rank>_<n>.distcp; the coordinator (rank 0) adds .metadata
    return sorted(p.name for p in Path(where).glob(f"__{rank}_*.distcp")) + ([".metadata"] if rank == 0 else [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", choices=("torch-save", "dcp", "dcp-async", "safetensors"), action="append",
                    required=True, help="repeatable: the job saves with each in turn")
    ap.add_argument("--dir", required=True, help="the checkpoint directory (on the traced mount)")
    ap.add_argument("--state-mb", type=float, required=True, help="each rank's state dict")
    ap.add_argument("--saves", type=int, default=1)
    ap.add_argument("--save-every", type=float, default=0, help="seconds of computing between saves")
    ap.add_argument("--results", required=True, help="directory for rank<r>.json (not on the mount)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    states = {dcp: state_dict(rank, world, a.state_mb, dcp) for dcp in {c.startswith("dcp") for c in a.client}}
    saves = []
    for client in a.client:
        for n in range(1, a.saves + 1):
            if saves:
                compute(a.save_every)
            step = os.path.join(client if len(a.client) > 1 else "", f"step_{n}")
            where = os.path.join(a.dir, step)
            dist.barrier()          # the ranks reach the save together, as after a training step
            t0 = time.monotonic()
            names = save(client, states[client.startswith("dcp")], where, rank)
            t1 = time.monotonic()
            saves.append({"client": client, "step": n, "dir": where, "start": t0, "end": t1,
                          "wall_s": round(t1 - t0, 4),
                          "files": [os.path.join(step, f) for f in names]})
    result = {"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "world_size": world,
              "host": socket.gethostname(), "pid": os.getpid(), "uid": os.getuid(), "clients": a.client, "saves": saves}
    Path(a.results, f"rank{rank}.json").write_text(json.dumps(result, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
