#!/usr/bin/env python3
"""torch FSDP2 HSDP oracle on the tiny Gemma: the 1-D oracle's plan on a 2-D mesh.

torch's own ``fully_shard(module, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate",
"dp_shard")))`` over 4 Gloo ranks (gloo_ranks.py: one process per rank, one thread each) on
``data/tiny_gemma`` in transformers' ``Gemma4ForCausalLM`` with fsdp2_gemma_oracle.py's plan (PLE frozen
and ignored, ``fully_shard(layer.mlp)`` per decoder layer then the root, reshard after forward), its
batches (20 steps x 4 rows x 16 tokens, right padding in rows 1 and 2) and AdamW (lr 1e-4, wd 0.01).
Flat rank k = r * 2 + s takes row k. torch shards over dp_shard (placements (Replicate(), Shard(0))),
reduce-scatters over dp_shard and then all-reduces over dp_replicate.

Runs (``RUNS``), one spawn of 4 ranks:

  fp32   no mixed precision                  -> hsdp_2x2_fp32.safetensors
  bf16   MixedPrecisionPolicy(bf16, fp32)    -> hsdp_2x2_bf16.safetensors

Each file holds ``input_ids`` / ``attention_mask`` / ``labels`` [steps, B, S] int64, ``losses``
[steps, W] float64 (each rank's local loss), ``lr`` [] float64, ``shape`` [2] int64 (R, S),
``trained.<name>`` [] float64 (||final - init||_2) and ``final.<name>`` (full final weights; fp32 for
fp32, rounded to bf16 for bf16). No step-0 gradients: fsdp2_gemma_oracle.py covers those at 2 ranks
and the fixtures stay small. Read by models/gemma/hsdp_oracle_test.cc. Deterministic; run through
regenerate.sh (or ``--out DIR``). The 2 x 4 mesh is not generated here: it needs 8 rows per step
(other batches than the 1-D oracle's) and 8 ranks, too slow for CI's budget on 2 cores;
hsdp_oracle.py covers (2, 4) on the MLP stack.
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
from fsdp2_gemma_oracle import BATCH, PLE, STEPS, WD, load_model, make_batches  # noqa: E402

SHAPE = (2, 2)
LR = 1e-4
RUNS: dict[str, bool] = {"fp32": False, "bf16": True}  # name -> bf16 compute


def train(rank: int, world: int, bf16: bool, batches: dict[str, torch.Tensor], out: str) -> None:
    """One run; rank 0 writes `out` (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Replicate, Shard

    torch.manual_seed(42)
    model = load_model().train()
    init = {n: p.detach().clone() for n, p in model.named_parameters() if n != PLE}
    ple = model.model.embed_tokens_per_layer.weight
    ple.requires_grad_(False)
    mesh = init_device_mesh("cpu", SHAPE, mesh_dim_names=("dp_replicate", "dp_shard"))
    policy = MixedPrecisionPolicy()
    if bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # As fsdp2_gemma_oracle.py (and ParallelizeGemma): the ignored PLE table and layer_scalar in bf16.
        with torch.no_grad():
            ple.data = ple.data.to(torch.bfloat16)
            for name, b in model.named_buffers():
                if name.endswith("layer_scalar"):
                    b.data = b.data.to(torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer.mlp, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True, ignored_params={ple})
    for n, p in model.named_parameters():
        if n != PLE:
            assert p.placements == (Replicate(), Shard(0)), (n, p.placements)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=WD)
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = model(input_ids=batches["input_ids"][s, rows], attention_mask=batches["attention_mask"][s, rows],
                     labels=batches["labels"][s, rows]).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    final = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters() if n in init}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, losses)
    if rank == 0:
        tensors: dict[str, torch.Tensor] = {k: v.clone() for k, v in batches.items()}
        tensors["losses"] = torch.tensor(gathered, dtype=torch.float64).t().contiguous()
        dtype = torch.bfloat16 if bf16 else torch.float32
        for n in sorted(init):
            tensors[f"trained.{n}"] = (final[n].double() - init[n].double()).norm()
            tensors[f"final.{n}"] = final[n].to(dtype).contiguous()
        tensors["lr"] = torch.tensor(LR, dtype=torch.float64)
        tensors["shape"] = torch.tensor(SHAPE, dtype=torch.int64)
        save_file(tensors, out, metadata={"format": "pt"})
    dist.barrier()


def worker(rank: int, world: int, jobs: list[tuple[bool, dict[str, torch.Tensor], str]]) -> None:
    for bf16, batches, out in jobs:
        train(rank, world, bf16, batches, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="fixture directory (fixtures/hsdp_gemma)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = make_batches(pad=True)
    tag = f"{SHAPE[0]}x{SHAPE[1]}"
    jobs = [(bf16, batches, str(args.out / f"hsdp_{tag}_{name}.safetensors")) for name, bf16 in RUNS.items()]
    gloo_ranks.spawn(worker, SHAPE[0] * SHAPE[1], jobs)


if __name__ == "__main__":
    sys.exit(main())
