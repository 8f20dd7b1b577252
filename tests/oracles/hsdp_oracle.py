#!/usr/bin/env python3
"""torch FSDP2 HSDP oracle for our C++ FullyShard on a 2-D ("dp_replicate", "dp_shard") mesh.

torch's own ``fully_shard(module, mesh=init_device_mesh("cpu", (R, S), mesh_dim_names=("dp_replicate",
"dp_shard")))`` on CPU over Gloo (gloo_ranks.py: one process per rank, one thread each). torch shards
over dp_shard (placements (Replicate(), Shard(0))) and in backward reduce-scatters AVG over dp_shard,
then all-reduces AVG over dp_replicate (foreach_reduce, fp32: sum / (R * S)).

The model is testing/fsdp_util.h's MlpStack (b0 5->7->6, b1 6->9->6, b2 6->3->6, head 6->3, tanh,
biases; torch.manual_seed(7) init, saved in full so the C++ side starts from the same weights):
``fully_shard`` on b0, b1, b2, then the root; AdamW lr 1e-2, wd 0.01; MSE loss; STEPS steps on fixed
global batches of BATCH rows (flat rank k = r * S + s takes rows [k * B / W, (k + 1) * B / W)).

Per mesh shape (R, S) in SHAPES, ``hsdp_<R>x<S>.safetensors`` holds ``x`` [STEPS, BATCH, 5],
``y`` [STEPS, BATCH, 3], ``losses`` [STEPS, W] float64 (each rank's local loss), ``shape`` [2] int64,
``init.<name>`` / ``grad0.<name>`` (full step-0 gradient) / ``final.<name>`` (full final weights), fp32.
Deterministic; run through regenerate.sh (or ``--out DIR``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gloo_ranks  # noqa: E402
from dcp_oracle import MlpStack  # noqa: E402

SHAPES = ((2, 2), (2, 1), (1, 4), (2, 4))
STEPS = 5
BATCH = 8
LR = 1e-2
WD = 0.01


def make_batches() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(20261206)
    return {"x": torch.randn(STEPS, BATCH, 5, generator=gen), "y": torch.randn(STEPS, BATCH, 3, generator=gen)}


def train(rank: int, world: int, shape: tuple[int, int], batches: dict[str, torch.Tensor], out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard

    torch.manual_seed(7)
    model = MlpStack()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp_replicate", "dp_shard"))
    for block in (model.b0, model.b1, model.b2):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for p in model.parameters():
        assert p.placements == (Replicate(), Shard(0)), p.placements
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    losses, grad0 = [], {}
    for s in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batches["x"][s, rows]), batches["y"][s, rows])
        loss.backward()
        if s == 0:
            grad0 = {n: p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    final = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, losses)
    if rank == 0:
        tensors = {k: v.contiguous() for k, v in batches.items()}
        tensors["losses"] = torch.tensor(gathered, dtype=torch.float64).t().contiguous()
        tensors["shape"] = torch.tensor(shape, dtype=torch.int64)
        for n in sorted(init):
            tensors[f"init.{n}"] = init[n].contiguous()
            tensors[f"grad0.{n}"] = grad0[n].contiguous()
            tensors[f"final.{n}"] = final[n].contiguous()
        save_file(tensors, out, metadata={"format": "pt"})
    dist.barrier()


def worker(rank: int, world: int, shape: tuple[int, int], batches: dict[str, torch.Tensor], out: str) -> None:
    train(rank, world, shape, batches, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="fixture directory (fixtures/hsdp)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = make_batches()
    for shape in SHAPES:
        gloo_ranks.spawn(worker, shape[0] * shape[1], shape, batches,
                         str(args.out / f"hsdp_{shape[0]}x{shape[1]}.safetensors"))


if __name__ == "__main__":
    sys.exit(main())
