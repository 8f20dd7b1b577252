"""torch's side of bench/python/train_vs_torch.py: transformers' Gemma 4 under torch's FSDP2 over Gloo.

The model: ``transformers.Gemma4ForCausalLM`` built from the *text* config of ``<model_dir>/config.json``
(``Gemma4ForConditionalGeneration`` wraps it; text only here), eager attention, ``use_cache=False``, fp32,
weights from ``<model_dir>/model.safetensors`` with ``model.language_model.X`` renamed to ``model.X`` and
the tied ``lm_head`` re-tied to ``embed_tokens`` (the loading of tests/oracles/fsdp2_gemma_oracle.py,
which models/gemma's oracle tests already check against our C++ model). Final logit softcapping (30)
and the shifted causal-LM loss are transformers' own (``model(input_ids, labels=input_ids).loss``).

Sharding (the same plan as our side, bench/train_vs_torch.cc):
  layers  ``fully_shard(layer)`` for every decoder layer, then ``fully_shard(model)`` (torchtitan)
  mlp     ``fully_shard(layer.mlp)`` for every layer, then the root (the fine-tune's plan)
With ``freeze_ple`` the PLE table is frozen and passed as the root's ``ignored_params``.
torch's defaults otherwise (reshard after forward, no mixed precision); ``torch.optim.AdamW`` on the
trainable parameters with the same lr / betas / eps / weight decay as ours.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers
from safetensors.torch import load_file

PLE = "model.embed_tokens_per_layer.weight"


def load_hf_gemma(model_dir: Path) -> torch.nn.Module:
    """transformers' Gemma4ForCausalLM with model_dir's weights (fp32, eager attention, tied head)."""
    config = transformers.AutoConfig.from_pretrained(model_dir).text_config
    config._attn_implementation = "eager"
    config.use_cache = False
    model = transformers.Gemma4ForCausalLM(config)
    sd = {k.replace("model.language_model.", "model."): v
          for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise RuntimeError(f"{model_dir}: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.float().train()


def global_ids(cfg: dict[str, Any], vocab: int) -> torch.Tensor:
    """[global_batch, seq] ids in [3, vocab): the draw our side makes with at::randint (same seed)."""
    gen = torch.Generator().manual_seed(cfg["seed"])
    return torch.randint(3, vocab, (cfg["global_batch"], cfg["seq"]), generator=gen, dtype=torch.int64)


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def rank_main(rank: int, world: int, init_file: str, cfg: dict[str, Any], model: torch.nn.Module,
              out: str) -> None:
    """One rank (a forked child of the driver, which built `model`); rank 0 writes `out` (JSON)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    load_before = _load()
    model_class = type(model).__name__  # before fully_shard swaps in FSDP<class>
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg["timeout_s"]))
    try:
        mesh = init_device_mesh("cpu", (world,))
        ple = model.model.embed_tokens_per_layer.weight
        if cfg["freeze_ple"]:
            ple.requires_grad_(False)
        for layer in model.model.layers:
            fully_shard(layer if cfg["plan"] == "layers" else layer.mlp, mesh=mesh)
        fully_shard(model, mesh=mesh, ignored_params={ple} if cfg["freeze_ple"] else None)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"],
                                betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                                weight_decay=cfg["weight_decay"])
        ids_all = global_ids(cfg, model.config.vocab_size)
        per = cfg["global_batch"] // world
        ids = ids_all[rank * per:(rank + 1) * per].contiguous()

        def step() -> torch.Tensor:
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            return loss.detach()

        loss0 = step()
        for _ in range(1, cfg["warmup"]):
            step()
        dist.barrier()
        ms: list[float] = []
        last = loss0
        start = time.perf_counter()
        cpu_start = time.process_time()  # this process, every thread (Gloo's included)
        for _ in range(cfg["steps"]):
            t0 = time.perf_counter()
            last = step()
            ms.append((time.perf_counter() - t0) * 1e3)
        total_ms = (time.perf_counter() - start) * 1e3
        cpu_s = time.process_time() - cpu_start
        # loss0, last loss, CPU seconds of the timed steps; summed over ranks (as ours).
        losses = torch.cat([torch.stack([loss0, last]).double(), torch.tensor([cpu_s], dtype=torch.float64)]).float()
        dist.all_reduce(losses)
        cpu_ms_all_ranks = float(losses[2]) * 1e3 / cfg["steps"]
        losses[:2] /= world
        dist.barrier()
        if rank == 0:
            mean = total_ms / cfg["steps"]
            row = dict(side="torch", backend="gloo", plan=cfg["plan"], world=world,
                       global_batch=cfg["global_batch"], seq=cfg["seq"], warmup=cfg["warmup"],
                       steps=cfg["steps"], step_ms=ms, step_ms_mean=mean, step_ms_min=min(ms),
                       tokens_per_s=cfg["global_batch"] * cfg["seq"] * 1e3 / mean,
                       loss0=float(losses[0]), loss_last=float(losses[1]),
                       cpu_ms_per_step=cpu_ms_all_ranks, load_before=load_before,
                       load_after=_load(), transformers=transformers.__version__,
                       torch=torch.__version__, model_class=model_class)
            Path(out).write_text(json.dumps(row, indent=1) + "\n")
    finally:
        dist.destroy_process_group()
