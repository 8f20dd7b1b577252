"""gemma_finetune's DCP interop end to end (issue 34 item 1), against torch's own FSDP2.

1. ``gemma_finetune --dcp-export`` on 2 ranks (tpurun) trains one epoch; torch's FSDP2
   (transformers' ``Gemma4ForCausalLM``, the seed's plan: PLE frozen and ignored, every layer's MLP
   then the root) on 4 Gloo ranks ``dcp.load``s ``<checkpoint>/dcp`` with
   ``HuggingFaceStorageReader``: every trainable weight equals the checkpoint's HF export and every
   AdamW moment our own optimizer shards, bit for bit.
2. torch takes one AdamW step from there and ``dcp.save``s with
   ``HuggingFaceStorageWriter(save_distributed=True)``; ``gemma_finetune --init-from-dcp`` on 2
   ranks at lr 0 starts from it: its checkpoint's weights equal torch's, bit for bit, and its AdamW
   step count continues torch's.

Needs the build ($TPU_DIST_BUILD_DIR, else build/: ``examples/gemma_finetune``, ``tpu_runtime/launcher/tpurun``; or
$TPU_DIST_GEMMA_FINETUNE / $TPU_DIST_TPURUN); skipped without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "oracles"))
BUILD = Path(os.environ.get("TPU_DIST_BUILD_DIR", REPO / "build"))
FINETUNE = Path(os.environ.get("TPU_DIST_GEMMA_FINETUNE", BUILD / "examples" / "gemma_finetune"))
TPURUN = Path(os.environ.get("TPU_DIST_TPURUN", BUILD / "tpu_runtime" / "launcher" / "tpurun"))
PLE = "model.embed_tokens_per_layer.weight"
PREFIX = "optim.state."
STEPS = 32 // 2 // 2  # train[:32], 2 ranks, 2 rows each


def _finetune(storage: Path, run: str, extra: str) -> Path:
    cmd = (f"OMP_NUM_THREADS=1 timeout -s KILL 300 {TPURUN} --nproc 2 -- {FINETUNE} --timeout 120s "
           f"--storage-path {storage} --run-name {run} --dataset-split train[:32] --num-epochs 1 "
           f"--batch-size-per-device 2 --max-seq-len 32 --seed 5 {extra}")
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=330)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ckpts = sorted((storage / run).glob("checkpoint_*"))
    assert len(ckpts) == 1, ckpts
    return ckpts[0]


def _torch_side(rank: int, world: int, src: str, out: str, dst: str) -> None:
    """Loads DCP `src` into torch FSDP2; rank 0 writes the full state to out/loaded.safetensors;
    then one AdamW step, dcp.save to `dst`, rank 0 writes out/saved.safetensors."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import fsdp2_gemma_oracle as oracle

    model = oracle.load_model().train()
    ple = model.model.embed_tokens_per_layer.weight
    ple.requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer.mlp, mesh=mesh)
    fully_shard(model, mesh=mesh, ignored_params={ple})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    frozen = StateDictOptions(ignore_frozen_params=True)

    def state() -> tuple[dict, dict]:
        osd = get_optimizer_state_dict(model, opt)
        msd = get_model_state_dict(model, options=frozen)
        msd.pop("lm_head.weight", None)  # tied to embed_tokens; our model has no separate one
        return {**msd, "optim": {"state": osd["state"]}}, osd

    def full() -> dict[str, torch.Tensor]:
        o = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        sd = {k: v.clone() for k, v in get_model_state_dict(model, options=o).items()}
        for fqn, st in get_optimizer_state_dict(model, opt, options=o).get("state", {}).items():
            for name, t in st.items():
                sd[f"{PREFIX}{fqn}.{name}"] = t.clone()
        sd.pop("lm_head.weight", None)
        return sd

    sd, osd = state()
    dcp.load(sd, storage_reader=HuggingFaceStorageReader(src))
    optim = sd.pop("optim")
    # strict=False: the frozen PLE and the tied lm_head.weight are not in the dict.
    set_model_state_dict(model, sd, options=StateDictOptions(ignore_frozen_params=True, strict=False))
    set_optimizer_state_dict(model, opt, {"state": optim["state"], "param_groups": osd["param_groups"]})
    loaded = full()
    if rank == 0:
        save_file(loaded, f"{out}/loaded.safetensors")
    ids = (torch.arange(2 * 16).reshape(2, 16) * (rank + 3)) % 200 + 5  # [2, 16]
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sd, _ = state()
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(dst, save_distributed=True))
    saved = full()
    if rank == 0:
        save_file(saved, f"{out}/saved.safetensors")
    dist.barrier()


def _our_optim(ckpt: Path, world: int) -> dict[str, torch.Tensor]:
    """Our own AdamW shards (shards/optim-<r>-of-<W>), reassembled along dim 0."""
    parts = [load_file(str(ckpt / "shards" / f"optim-{r}-of-{world}.safetensors")) for r in range(world)]
    out = {}
    for key in parts[0]:
        if key.endswith(".step"):
            out[key] = parts[0][key]
        else:
            out[key] = torch.cat([p[key] for p in parts], 0)
    return out


def _hf_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return {k.replace("model.language_model.", "model."): v for k, v in load_file(str(ckpt / "model.safetensors")).items()}


@pytest.mark.skipif(not (FINETUNE.exists() and TPURUN.exists()), reason="gemma_finetune / tpurun not built")
def test_finetune_dcp_round_trip_through_torch_fsdp2(tmp_path: Path) -> None:
    import gloo_ranks

    ours = _finetune(tmp_path, "export", "--dcp-export")
    dcp_dir = ours / "dcp"
    assert sorted(p.name for p in dcp_dir.iterdir()) == [
        f"shard-{r + 1:05d}-model-00001-of-00001.safetensors" for r in range(2)]
    # The DCP files are in the checkpoint's CRC manifest like every other file.
    manifest = (ours / "checkpoint.json").read_text()
    assert "dcp/shard-00001-model-00001-of-00001.safetensors" in manifest

    torch_saved = tmp_path / "torch_dcp"
    gloo_ranks.spawn(_torch_side, 4, str(dcp_dir), str(tmp_path), str(torch_saved))
    loaded = load_file(str(tmp_path / "loaded.safetensors"))
    weights, optim = _hf_weights(ours), _our_optim(ours, 2)
    trainable = [k for k in loaded if not k.startswith(PREFIX)]
    assert PLE not in trainable and len(trainable) > 50, trainable
    for k in trainable:
        assert torch.equal(loaded[k], weights[k]), k
    for k in (k for k in loaded if k.startswith(PREFIX)):
        ours_key = k[len(PREFIX):]
        want = optim[ours_key]
        got = loaded[k]
        assert torch.equal(got.reshape(want.shape).to(want.dtype), want), k

    # torch -> ours: start from torch's checkpoint at lr 0 (weights stay torch's exactly).
    resumed = _finetune(tmp_path, "init", f"--init-from-dcp {torch_saved} --lr 0")
    saved = load_file(str(tmp_path / "saved.safetensors"))
    weights, optim = _hf_weights(resumed), _our_optim(resumed, 2)
    for k in trainable:
        assert torch.equal(weights[k], saved[k]), k
    torch_step = saved[f"{PREFIX}model.layers.0.mlp.gate_proj.weight.step"].item()
    assert optim["model.layers.0.mlp.gate_proj.weight.step"].item() == torch_step + STEPS
