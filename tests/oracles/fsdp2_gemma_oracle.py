#!/usr/bin/env python3
"""torch FSDP2 oracle for our C++ FullyShard: the fine-tune's plan on the bundled tiny Gemma 4.

torch's own ``fully_shard`` (``torch.distributed.fsdp``) on CPU over Gloo, the seed's plan
(ray_train_llm_finetune.py): PLE table frozen, ``fully_shard(layer.mlp)`` for every decoder layer,
then ``fully_shard(model, ignored_params={PLE})``; reshard_after_forward (torch's default); AdamW.
The model is transformers' ``Gemma4ForCausalLM`` with the ``data/tiny_gemma`` safetensors init.
Every rank runs on its own process (torch.multiprocessing spawn, gloo_ranks.py), one thread each.

Runs (``RUNS``), each 20 steps on the same global batches (4 rows x 16 tokens, right padding in
rows 1 and 2; rank r takes rows [r*B/W, (r+1)*B/W)), weight decay 0.01, world size 2:

  fp32       no mixed precision, lr 1e-4                -> fp32.safetensors
  bf16       MixedPrecisionPolicy(bf16, fp32), lr 1e-4  -> bf16.safetensors
  fp32_seed  as fp32 at the seed's lr 2e-5              -> fp32_seed.safetensors
  bf16_seed  as bf16 at the seed's lr 2e-5              -> bf16_seed.safetensors

(lr 1e-4 moves the weights ~10% of their scale in 20 steps; at 1e-3 this model on random tokens
is chaotic: torch against itself at 1 and 2 ranks ends 28% of the distance trained apart in fp32.)
Each file holds ``input_ids`` / ``attention_mask`` / ``labels`` [steps, B, S] int64, ``losses``
[steps, W] float64 (each rank's local loss), ``lr`` [] float64, ``world_size`` [] int64,
``trained.<name>`` [] float64 (||final - init||_2 per trainable parameter); the lr-1e-4 files also
hold ``grad0.<name>`` (the full step-0 gradient: rank r's Shard(0) piece is its torch.chunk) and
``final.<name>`` (full final weights), in fp32 for fp32 and rounded to bf16 for bf16 (fixtures stay
small; the bf16 bounds are far above bf16 rounding).

In the mixed runs the tensors FSDP does not manage but the forward reads next to the gathered bf16
weights (the ignored PLE table, the layer_scalar buffers) are cast to bf16 up front, as
models/gemma/parallelize_gemma.cc does.

Issue 14's world-size question: ``world_size_study`` trains torch FSDP2 at 1 and 2 ranks without
padding (equal token counts per rank: the same math) for fp32 and bf16 at lr 1e-3, 1e-4, 2e-5 and
writes ``world_size.json`` (per case: ||w1 - w2|| / ||w1 - w0||, the largest loss gap, the step-0
gradient gap, the largest final-weight gap of a tensor relative to its largest element) and
``world_size_batches.safetensors`` (the ids); models/gemma/fsdp2_oracle_test.cc
runs our FullyShard the same way and must not be further apart than torch is from itself.

Deterministic: fixed seeds, one thread per rank. Run through regenerate.sh.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers
from safetensors.torch import load_file, save_file

import gloo_ranks

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "data" / "tiny_gemma"
PLE = "model.embed_tokens_per_layer.weight"
STEPS = 20
BATCH = 4  # global rows per step
SEQ = 16
WORLD = 2
WD = 0.01
STUDY_LRS = (1e-3, 1e-4, 2e-5)
RUNS: dict[str, dict[str, Any]] = {
    "fp32": dict(bf16=False, lr=1e-4, full=True),
    "bf16": dict(bf16=True, lr=1e-4, full=True),
    "fp32_seed": dict(bf16=False, lr=2e-5, full=False),
    "bf16_seed": dict(bf16=True, lr=2e-5, full=False),
}


def make_batches(pad: bool) -> dict[str, torch.Tensor]:
    """[STEPS, BATCH, SEQ] ids in [3, V), right padding (pad id 0, mask 0, label -100) in rows 1 and 2."""
    gen = torch.Generator().manual_seed(20260514)
    vocab = json.loads((MODEL_DIR / "config.json").read_text())["text_config"]["vocab_size"]
    ids = torch.randint(3, vocab, (STEPS, BATCH, SEQ), generator=gen, dtype=torch.int64)
    mask = torch.ones_like(ids)
    if pad:
        for s in range(STEPS):
            mask[s, 1, SEQ - 1 - s % 5:] = 0  # 1..5 pads
            mask[s, 2, SEQ - 3:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def load_model() -> torch.nn.Module:
    """transformers' Gemma4ForCausalLM with data/tiny_gemma's weights (fp32, eager attention)."""
    config = transformers.AutoConfig.from_pretrained(MODEL_DIR).text_config
    config._attn_implementation = "eager"
    config.use_cache = False
    model = transformers.Gemma4ForCausalLM(config)
    sd = {k.replace("model.language_model.", "model."): v for k, v in load_file(str(MODEL_DIR / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model


def train(rank: int, world: int, run: dict[str, Any], batches: dict[str, torch.Tensor], out: str) -> None:
    """One run; rank 0 writes `out` (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(42)
    model = load_model().train()
    init = {n: p.detach().clone() for n, p in model.named_parameters() if n != PLE}
    ple = model.model.embed_tokens_per_layer.weight
    ple.requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    policy = MixedPrecisionPolicy()
    if run["bf16"]:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # What FSDP does not manage but the bf16 forward reads next to the gathered weights, as
        # ParallelizeGemma casts it: the ignored PLE table and layer_scalar (not RoPE's inv_freq,
        # which transformers keeps in fp32 also in a bf16 model).
        with torch.no_grad():
            ple.data = ple.data.to(torch.bfloat16)
            for name, b in model.named_buffers():
                if name.endswith("layer_scalar"):
                    b.data = b.data.to(torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer.mlp, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True, ignored_params={ple})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=run["lr"], weight_decay=WD)
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    losses, grad0 = [], {}
    for s in range(STEPS):
        opt.zero_grad()
        loss = model(input_ids=batches["input_ids"][s, rows], attention_mask=batches["attention_mask"][s, rows],
                     labels=batches["labels"][s, rows]).loss
        loss.backward()
        if s == 0:
            for n, p in model.named_parameters():
                if p.grad is not None:
                    assert p.grad.to_local().shape[0] == torch.chunk(torch.empty(p.shape[0]), world)[rank].shape[0]
                    grad0[n] = p.grad.full_tensor().detach().clone()
        opt.step()
        losses.append(loss.item())
    final = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters() if n in init}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, losses)
    if rank == 0:
        tensors: dict[str, torch.Tensor] = {k: v.clone() for k, v in batches.items()}
        tensors["losses"] = torch.tensor(gathered, dtype=torch.float64).t().contiguous()
        for n in sorted(init):
            tensors[f"trained.{n}"] = (final[n].double() - init[n].double()).norm()
            if run["full"]:
                dtype = run.get("store_dtype", torch.bfloat16 if run["bf16"] else torch.float32)
                tensors[f"grad0.{n}"] = grad0[n].to(dtype).contiguous()
                tensors[f"final.{n}"] = final[n].to(dtype).contiguous()
        # One metadata key only: safetensors writes a map's keys in no fixed order.
        tensors["lr"] = torch.tensor(run["lr"], dtype=torch.float64)
        tensors["world_size"] = torch.tensor(world, dtype=torch.int64)
        meta = {"format": "pt"}
        save_file(tensors, out, metadata=meta)
    dist.barrier()


def worker(rank: int, world: int, jobs: list[tuple[dict[str, Any], dict[str, torch.Tensor], str]]) -> None:
    for run, batches, out in jobs:
        train(rank, world, run, batches, out)


def run_fsdp2(world: int, jobs: list[tuple[dict[str, Any], dict[str, torch.Tensor], Path]]) -> None:
    """All `jobs` in one spawn of `world` Gloo ranks (imports dominate the time; gloo_ranks.py)."""
    jobs_s = [(run, batches, str(out)) for run, batches, out in jobs]
    gloo_ranks.spawn(worker, world, jobs_s)


def world_size_study(out: Path | None) -> dict[str, Any]:
    """Issue 14's question under torch FSDP2: the same training at 1 and 2 ranks, no padding (equal
    token counts per rank, so the two are the same math), per precision and lr: how far apart the
    runs end relative to the distance trained, the largest loss gap, the step-0 gradient gap."""
    batches = make_batches(pad=False)
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(name, lr) for name in ("fp32", "bf16") for lr in STUDY_LRS]
        for world in (1, 2):
            run_fsdp2(world, [(dict(RUNS[name], lr=lr, full=True, store_dtype=torch.float32), batches,
                               Path(tmp) / f"{name}_{lr!r}_{world}.safetensors") for name, lr in cases])
        for name, lr in cases:
            a, b = (load_file(str(Path(tmp) / f"{name}_{lr!r}_{w}.safetensors")) for w in (1, 2))
            apart = sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a if k.startswith("final."))
            trained = sum(a[k] ** 2 for k in a if k.startswith("trained."))
            report[f"{name}_lr{lr!r}"] = {
                "lr": lr,
                "mixed_precision": RUNS[name]["bf16"],
                "apart_over_trained": float(apart.sqrt() / trained.sqrt()),
                "max_loss_gap": float((a["losses"].mean(1) - b["losses"].mean(1)).abs().max()),
                "step0_grad_max_rel": max(float((a[k].double() - b[k].double()).abs().max() / a[k].double().abs().max())
                                          for k in a if k.startswith("grad0.")),
                "final_max_rel": max(float((a[k].double() - b[k].double()).abs().max() / a[k].double().abs().max())
                                     for k in a if k.startswith("final.")),
            }
    if out is not None:
        save_file({"input_ids": batches["input_ids"].contiguous()}, str(out / "world_size_batches.safetensors"),
                  metadata={"format": "pt"})
        (out / "world_size.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="fixture directory (fixtures/fsdp2)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = make_batches(pad=True)
    run_fsdp2(WORLD, [(run, batches, args.out / f"{name}.safetensors") for name, run in RUNS.items()])
    for key, r in world_size_study(args.out).items():
        print(f"torch FSDP2 world 1 vs 2, {key}: ||w1 - w2|| / ||w1 - w0|| = {r['apart_over_trained']:.3g}, "
              f"max loss gap {r['max_loss_gap']:.3g}, step-0 grad max rel {r['step0_grad_max_rel']:.3g}")


if __name__ == "__main__":
    sys.exit(main())
