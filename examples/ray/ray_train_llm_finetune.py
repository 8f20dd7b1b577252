"""The seed's Ray Train FSDP2 fine-tune (ray_train_llm_finetune.py) over tpu_dist.

Run it as a Ray driver on a cluster of (emulated) TPU hosts:

    tools/ray_cluster.sh up v6e-4x4
    tools/ray_cluster.sh exec -- python examples/ray/ray_train_llm_finetune.py \\
        --storage-path /tmp/ray_results
    tools/ray_cluster.sh down

    tools/ray_cluster.sh up v4-2x2x2 --num-slices 2         # 2 slices x 2 hosts x 4
    tools/ray_cluster.sh exec -- python examples/ray/ray_train_llm_finetune.py \\
        --topology 2x2x2 --accelerator-type TPU-V4 --num-workers 8 --num-slices 2 \\
        --storage-path /tmp/ray_results

The seed's steps, one for one (../shared/reference/seed-ray-programs.md,
"Program 2"): the driver calls `ray.init()`, names the run
torchtpu_gemma4_fsdp2_sft_<unix time> and runs
`TorchTrainer(train_func, torch_config=TorchConfig(backend="tpu_dist"),
scaling_config=ScalingConfig(use_tpu=True, num_workers, topology,
accelerator_type, resources_per_worker={"TPU": 1}), run_config=RunConfig(
name, storage_path, checkpoint_config=CheckpointConfig(num_to_keep=1,
checkpoint_score_attribute="loss", checkpoint_score_order="min")))`. Each
worker: seed 42; the Dolly split as `f"Instruction: {instruction}\\nResponse:
{response}"`, tokenizer(truncation=True, max_length=512,
padding="max_length"), DataLoader(shuffle=True, drop_last=True,
DataCollatorForLanguageModeling(mlm=False)) through Ray's
prepare_data_loader; AutoModelForCausalLM.from_pretrained(dtype,
attn_implementation="eager", vision_config=None, audio_config=None),
use_cache=False; the per-layer-embedding table frozen; torch's FSDP2
`fully_shard` on every decoder layer's MLP, then on the model (PLE ignored),
MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32), over
init_device_mesh(device, (world,)); AdamW(lr=2e-5, weight_decay=0.01); per
epoch the mean loss over ranks (all_reduce AVG), tokens/s = steps x global
batch x 512 / epoch time, the seed's `Epoch e/n | loss=... | epoch_time=...s
| tokens/s=...` line on rank 0, the full state dict (full_state_dict,
cpu_offload, ignore_frozen_params) saved by rank 0 and reported with the
metrics {epoch, loss, epoch_time_s, tokens_per_s}; the driver prints
`Training completed! Final metrics: ...` and `Saved checkpoint: ...`.

Differences from the seed, forced by this machine:
- `import tpu_dist` where the seed imports torch_tpu. Ray Train's TPU path
  itself imports `torch_tpu._loader` for backend "tpu_dist" and names the
  device "tpu" (ray/air/_internal/device_manager/tpu.py); without TorchTPU,
  the driver puts python/compat (a stand-in `torch_tpu` that loads tpu_dist
  and only names the device) on the workers' PYTHONPATH through the job's
  runtime_env. It is never used where the real torch_tpu imports.
- Device "cpu" where the seed uses "tpu": the mesh is init_device_mesh("cpu",
  ...), and Ray's data loader does not move batches (move_to_device=False:
  "tpu" is a name here, with no kernels).
- The model: --model-id is a local directory (no model hub here); default the
  project's tiny random-init Gemma 4 (data/tiny_gemma, made by transformers
  from its config). A local copy of google/gemma-4-E2B-it works the same.
- The data: the bundled Dolly-format file (data/instructions/train.jsonl, the
  Dolly fields, generated) through datasets.load_dataset("json", ...), with the
  seed's split syntax; --dataset takes another file.
- dtype: the seed loads and computes in bf16. --dtype auto (default) keeps
  bf16 where the CPU has bf16 arithmetic (avx512_bf16 / amx_bf16) and uses fp32
  otherwise (bf16 GEMM runs ~100x slower than fp32 on an AVX2-only CPU);
  MixedPrecisionPolicy's param_dtype follows, reduce_dtype stays fp32.
- --max-length (default the seed's 512) and --max-failures (default 0, as the
  seed: Ray's FailureConfig) are extra flags; a restarted worker group resumes
  from Ray's latest checkpoint, which also carries the optimizer.
- --num-slices N (default 1: the seed's single slice, the same lines) is the
  tutorial's multi-slice form: --num-workers stays the workers of one slice
  (its devices) and the trainer asks for N x that many; Ray Train then
  reserves N whole slices (get_tpu_num_slices_for_workers, SlicePlacementGroup)
  and, for backend "tpu_dist", gives worker i MEGASCALE_NUM_SLICES=N,
  MEGASCALE_SLICE_ID=i // workers per slice, MEGASCALE_COORDINATOR_ADDRESS
  (rank 0's host) and MEGASCALE_PORT (8081 + local rank). Each worker checks
  both values (an error naming the variable otherwise) and builds the
  tutorial's HSDP mesh init_device_mesh(device, (N, world // N),
  mesh_dim_names=("dp_replicate", "dp_shard")): fully_shard shards over
  dp_shard inside a slice and all-reduces gradients over dp_replicate across
  slices. Rank 0 reports on stderr every rank's slice id (all_gather) and
  one parameter's placements.
- Each worker runs torch with 1 thread; progress lines (every ~10% of an
  epoch, rank 0) go to stderr; stdout carries the seed's lines.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import ray
import ray.train
import ray.train.torch
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = ROOT / "python" / "compat"  # the stand-in torch_tpu
DEVICE = "cpu"  # the seed: "tpu"


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _decoder_layers(model: Any) -> List[Any]:
    """The decoder layers of a Gemma 4 (conditional generation or text-only)."""
    inner = model.model
    lm = getattr(inner, "language_model", inner)
    return list(lm.layers)


def _load_rows(config: Dict[str, Any], tokenizer: Any) -> Any:
    import datasets
    from datasets import load_dataset

    datasets.disable_progress_bars()
    ds = load_dataset("json", data_files={"train": config["dataset"]},
                      split=config["dataset_split"])

    def tokenize(batch: Dict[str, List[str]]) -> Dict[str, Any]:
        texts = [f"Instruction: {i}\nResponse: {r}"
                 for i, r in zip(batch["instruction"], batch["response"])]
        return tokenizer(texts, truncation=True, max_length=config["max_length"],
                         padding="max_length")

    # A fixed fingerprint: datasets would otherwise hash `tokenize` with dill,
    # whose bytecode scan leaks a disassembly into Ray Train's worker logs.
    key = f"{config['dataset']}|{config['dataset_split']}|{config['max_length']}"
    fingerprint = "seed_prompt_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return ds.map(tokenize, batched=True, remove_columns=ds.column_names,
                  keep_in_memory=True, new_fingerprint=fingerprint)


def _check_megascale_env(rank: int, num_slices: int, world: int) -> int:
    """This worker's slice id, after checking what Ray Train set: with one
    slice MEGASCALE_NUM_SLICES is absent or 1; with N > 1 it is N and
    MEGASCALE_SLICE_ID is rank // (world // N). ValueError naming the
    variable otherwise."""
    raw = os.environ.get("MEGASCALE_NUM_SLICES")
    if num_slices == 1:
        if raw not in (None, "1"):
            raise ValueError(f'rank {rank}: MEGASCALE_NUM_SLICES="{raw}" but --num-slices 1')
        return 0
    if world % num_slices:
        raise ValueError(f"rank {rank}: world {world} is not a multiple of "
                         f"--num-slices {num_slices}")
    if raw != str(num_slices):
        raise ValueError(f"rank {rank}: MEGASCALE_NUM_SLICES={raw!r} from Ray Train, expected "
                         f"{num_slices} (--num-slices)")
    want = rank // (world // num_slices)
    raw_id = os.environ.get("MEGASCALE_SLICE_ID")
    if raw_id != str(want):
        raise ValueError(f"rank {rank}: MEGASCALE_SLICE_ID={raw_id!r} from Ray Train, expected "
                         f"{want} (rank // {world // num_slices} workers per slice)")
    return want


def train_func(config: Dict[str, Any]) -> None:
    """One Ray Train worker: one device of the slice."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.data import DataLoader
    from transformers import (AutoModelForCausalLM, AutoTokenizer,
                              DataCollatorForLanguageModeling)

    import tpu_dist  # noqa: F401  (the seed: import torch_tpu)

    torch.set_num_threads(1)
    torch.manual_seed(42)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    dtype = getattr(torch, config["dtype"])
    max_length = config["max_length"]

    tokenizer = AutoTokenizer.from_pretrained(config["model_id"])
    rows = _load_rows(config, tokenizer)
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
    loader = DataLoader(rows, batch_size=config["batch_size_per_device"], shuffle=True,
                        drop_last=True, collate_fn=collator)
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    steps = len(loader)
    if steps == 0:
        raise ValueError(f"rank {rank}: {len(rows)} rows give no full batch of "
                         f"{config['batch_size_per_device']} per device x {world} devices")

    model = AutoModelForCausalLM.from_pretrained(
        config["model_id"], dtype=dtype, attn_implementation="eager",
        vision_config=None, audio_config=None)
    model.config.use_cache = False
    num_slices = config.get("num_slices", 1)
    if num_slices == 1:
        _check_megascale_env(rank, 1, world)
        mesh = init_device_mesh(DEVICE, (world,))
    else:
        slice_id = _check_megascale_env(rank, num_slices, world)
        mesh = init_device_mesh(DEVICE, (num_slices, world // num_slices),
                                mesh_dim_names=("dp_replicate", "dp_shard"))
    mp_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    ple = [p for n, p in model.named_parameters() if "embed_tokens_per_layer" in n]
    for p in ple:
        p.requires_grad_(False)
    for layer in _decoder_layers(model):
        fully_shard(layer.mlp, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, ignored_params=set(ple))
    if num_slices > 1:
        places: List[Any] = [None] * world
        dist.all_gather_object(places, (slice_id, os.environ.get("TPU_NAME", "")))
        if rank == 0:
            placements = next(p for p in model.parameters() if p.requires_grad).placements
            print(f"HSDP mesh (dp_replicate={num_slices}, dp_shard={world // num_slices}): "
                  f"MEGASCALE_SLICE_ID by rank {[s for s, _ in places]}, "
                  f"TPU_NAME by rank {[n for _, n in places]}, "
                  f"placements {tuple(placements)}", file=sys.stderr, flush=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=2e-5, weight_decay=0.01)

    start_epoch = 0
    resume = ray.train.get_checkpoint()
    if resume is not None:
        with resume.as_directory() as d:
            state = json.loads((Path(d) / "state.json").read_text())
            full = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(model, torch.load(Path(d) / "model.pt", weights_only=True),
                                 options=full)
            set_optimizer_state_dict(model, optimizer,
                                     torch.load(Path(d) / "optimizer.pt", weights_only=True),
                                     options=StateDictOptions(full_state_dict=True))
        start_epoch = state["epoch"]
        if rank == 0:
            print(f"Resuming after epoch {start_epoch} from {resume}", file=sys.stderr,
                  flush=True)

    global_batch = config["batch_size_per_device"] * world
    log_every = max(1, steps // 10)
    for epoch in range(start_epoch, config["num_epochs"]):
        if world > 1:
            loader.sampler.set_epoch(epoch)
        model.train()
        running_loss = 0.0
        t0 = time.perf_counter()
        for step, batch in enumerate(loader):
            optimizer.zero_grad()
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        labels=batch["labels"])
            out.loss.backward()
            optimizer.step()
            running_loss += out.loss.item()
            if rank == 0 and (step + 1) % log_every == 0:
                print(f"  epoch {epoch + 1} step {step + 1}/{steps} loss={out.loss.item():.4f} "
                      f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        total = torch.tensor([running_loss], dtype=torch.float64)
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        epoch_time = time.perf_counter() - t0
        avg_loss = total.item() / steps
        tokens_per_s = steps * global_batch * max_length / epoch_time
        if rank == 0:
            print(f"Epoch {epoch + 1}/{config['num_epochs']} | loss={avg_loss:.4f} | "
                  f"epoch_time={epoch_time:.2f}s | tokens/s={tokens_per_s:.1f}", flush=True)
        metrics = {"epoch": epoch + 1, "loss": round(avg_loss, 4),
                   "epoch_time_s": round(epoch_time, 2), "tokens_per_s": round(tokens_per_s, 1)}
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                            ignore_frozen_params=True))
        optim_state = get_optimizer_state_dict(model, optimizer, options=full)
        if rank == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save(model_state, Path(d) / "model.pt")
                torch.save(optim_state, Path(d) / "optimizer.pt")
                (Path(d) / "state.json").write_text(json.dumps({"epoch": epoch + 1}))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)


def _runtime_env(extra_env: Dict[str, str]) -> Dict[str, Any]:
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if importlib.util.find_spec("torch_tpu") is None:
        # Ray Train imports torch_tpu on its TPU path: give the workers the
        # stand-in (see the module docstring).
        path = [str(COMPAT_DIR)] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
        env["PYTHONPATH"] = ":".join(path)
    env.update(extra_env)
    return {"env_vars": env}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-id", default=str(ROOT / "data" / "tiny_gemma"),
                        help="local model directory (HF format)")
    parser.add_argument("--topology", default="4x4")
    parser.add_argument("--accelerator-type", default="TPU-V6E")
    parser.add_argument("--num-workers", type=int, default=16,
                        help="workers (devices) per slice")
    parser.add_argument("--num-slices", type=int, default=1,
                        help="slices; Ray Train gets num_slices x --num-workers workers")
    parser.add_argument("--dataset", default=str(ROOT / "data" / "instructions" / "train.jsonl"),
                        help="Dolly-format JSONL")
    parser.add_argument("--dataset-split", default="train[:1024]")
    parser.add_argument("--num-epochs", type=int, default=3)
    parser.add_argument("--batch-size-per-device", type=int, default=4)
    parser.add_argument("--storage-path", default=os.environ.get("STORAGE_PATH"))
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto")
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument("--run-name", default=None,
                        help="default torchtpu_gemma4_fsdp2_sft_<unix time>")
    args = parser.parse_args(argv)
    if not args.storage_path:
        parser.error("--storage-path is required (or set STORAGE_PATH)")
    for path, what in ((args.model_id, "--model-id"), (args.dataset, "--dataset")):
        if not Path(path).exists():
            parser.error(f"{what} {path}: no such file or directory")
    if args.num_slices < 1:
        parser.error(f"--num-slices {args.num_slices}: expected an integer >= 1")
    num_workers = args.num_workers * args.num_slices
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if _cpu_has_bf16() else "float32"

    ray.init(runtime_env=_runtime_env({}))
    run_name = args.run_name or f"torchtpu_gemma4_fsdp2_sft_{int(time.time())}"
    print(f"Starting Ray Train FSDP2 SFT job: model={args.model_id}, topology={args.topology}, "
          f"accelerator_type={args.accelerator_type}, num_workers={num_workers}",
          flush=True)
    print(f"(dtype {dtype}, max_length {args.max_length}, run {run_name} under "
          f"{args.storage_path})", file=sys.stderr, flush=True)
    config = {"model_id": str(Path(args.model_id).resolve()),
              "dataset": str(Path(args.dataset).resolve()),
              "dataset_split": args.dataset_split, "num_epochs": args.num_epochs,
              "batch_size_per_device": args.batch_size_per_device,
              "max_length": args.max_length, "dtype": dtype}
    if args.num_slices > 1:
        config["num_slices"] = args.num_slices
    trainer = TorchTrainer(
        train_func,
        train_loop_config=config,
        torch_config=TorchConfig(backend="tpu_dist"),
        scaling_config=ScalingConfig(use_tpu=True, num_workers=num_workers,
                                     topology=args.topology,
                                     accelerator_type=args.accelerator_type,
                                     resources_per_worker={"TPU": 1}),
        run_config=RunConfig(name=run_name, storage_path=args.storage_path,
                             checkpoint_config=CheckpointConfig(
                                 num_to_keep=1, checkpoint_score_attribute="loss",
                                 checkpoint_score_order="min"),
                             failure_config=FailureConfig(max_failures=args.max_failures)),
    )
    t0 = time.monotonic()
    result = trainer.fit()
    print(f"Training completed! Final metrics: {result.metrics}", flush=True)
    print(f"Saved checkpoint: {result.checkpoint}", flush=True)
    print(f"(fit {datetime.timedelta(seconds=round(time.monotonic() - t0))})", file=sys.stderr,
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
