#!/usr/bin/env python3
"""torch DCP (``torch.distributed.checkpoint``) with torch's own FSDP2: the oracle of our DCP interop.

The format route is DCP's Hugging Face safetensors storage (``HuggingFaceStorageWriter(path,
save_distributed=True)`` / ``HuggingFaceStorageReader(path)``, torch 2.15): every rank writes
``shard-<rank+1:05>-model-00001-of-00001.safetensors`` holding its DTensor chunks, and each file's
safetensors header says where they sit (``__metadata__["DCP_SHARDING_INFO"]`` = JSON
``{key: {"saved_offsets": [...]}}``). docs/fsdp.md ("DCP interop") says why this route.

State dict keys (what fsdp/fully_shard/dcp_checkpoint.h writes and reads):
  ``<fqn>``                                       model parameters (get_model_state_dict)
  ``optim.state.<fqn>.{step,exp_avg,exp_avg_sq}``  AdamW state (get_optimizer_state_dict()["state"]
                                                   under "optim": DCP flattens nested dicts with ".")
``param_groups`` (lr, betas, ...: not tensors) are not in the checkpoint: safetensors holds tensors
only, and the HF writer would write a bytes item as raw bytes in front of the safetensors data.

The model is testing/fsdp_util.h's MlpStack (b0 5->7->6, b1 6->9->6, b2 6->3->6, head 6->3,
tanh, biases): uneven Shard(0) over 2 and 4 ranks and an empty shard on rank 3 (3 rows over 4).
``fully_shard`` on b0, b1, b2, then the root, CPU, Gloo ranks (gloo_ranks.py), AdamW.

  dcp_oracle.py save DIR WORLD EXPECTED   torch FSDP2 on WORLD ranks trains 2 AdamW steps and
                                          dcp.save()s model + optimizer state to DIR; rank 0 writes
                                          the full tensors (same keys) to EXPECTED
  dcp_oracle.py load DIR WORLD EXPECTED   torch FSDP2 on WORLD ranks (other init) dcp.load()s DIR
                                          into model and AdamW, gathers the full state dicts and
                                          compares them bit for bit with EXPECTED; exit 1 naming
                                          every key that differs
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gloo_ranks  # noqa: E402

OPTIM_PREFIX = "optim.state."


class Mlp(nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, d_in]
        return self.fc2(torch.tanh(self.fc1(x)))


class MlpStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b0 = Mlp(5, 7, 6)
        self.b1 = Mlp(6, 9, 6)
        self.b2 = Mlp(6, 3, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, 5] -> [batch, 3]
        return self.head(self.b2(self.b1(self.b0(x))))


def _sharded_model(world: int, seed: int) -> tuple[MlpStack, torch.optim.AdamW]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = MlpStack()
    mesh = init_device_mesh("cpu", (world,))
    for block in (model.b0, model.b1, model.b2):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def _train(model: MlpStack, opt: torch.optim.AdamW, rank: int, steps: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _dcp_state(model: MlpStack, opt: torch.optim.AdamW) -> tuple[dict, dict]:
    """The state dict handed to dcp.save / dcp.load, and the optimizer dict it came from."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, opt)
    return {**get_model_state_dict(model), "optim": {"state": osd["state"]}}, osd


def _full_state(model: MlpStack, opt: torch.optim.AdamW) -> dict[str, torch.Tensor]:
    """Full tensors under the checkpoint's keys (collective; complete on rank 0)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    out = {k: v.clone() for k, v in get_model_state_dict(model, options=full).items()}
    for fqn, st in get_optimizer_state_dict(model, opt, options=full).get("state", {}).items():
        for name, t in st.items():
            out[f"{OPTIM_PREFIX}{fqn}.{name}"] = t.clone().reshape(t.shape)
    return out


def _save(rank: int, world: int, path: str, expected: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    model, opt = _sharded_model(world, seed=1)
    _train(model, opt, rank, steps=2)
    state, _ = _dcp_state(model, opt)
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(path, save_distributed=True))
    full = _full_state(model, opt)
    if rank == 0:
        save_file(full, expected)
    dist.barrier()


def _load(rank: int, world: int, path: str, expected: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    model, opt = _sharded_model(world, seed=2)  # another init: the load must overwrite all of it
    state, osd = _dcp_state(model, opt)
    dcp.load(state, storage_reader=HuggingFaceStorageReader(path))
    optim = state.pop("optim")
    set_model_state_dict(model, state)
    set_optimizer_state_dict(model, opt, {"state": optim["state"], "param_groups": osd["param_groups"]})
    full = _full_state(model, opt)
    if rank != 0:
        return
    want = load_file(expected)
    bad = []
    for key in sorted(set(want) | set(full)):
        if key not in full or key not in want:
            bad.append(f"{key}: {'missing after load' if key not in full else 'not expected'}")
            continue
        a, b = full[key], want[key]
        if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
            diff = (a.double() - b.double()).abs().max().item() if a.shape == b.shape else "shape"
            bad.append(f"{key}: loaded {tuple(a.shape)} {a.dtype} != expected {tuple(b.shape)} {b.dtype} "
                       f"(max abs diff {diff})")
    if bad:
        raise AssertionError(f"dcp.load of {path} on {world} ranks differs from {expected}:\n" + "\n".join(bad))
    print(f"dcp_oracle: {len(want)} tensors of {path} loaded on {world} ranks, bit-identical")


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[1] not in ("save", "load"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, path, world, expected = argv[1], argv[2], int(argv[3]), argv[4]
    try:
        gloo_ranks.spawn(_save if mode == "save" else _load, world, path, expected)
    except Exception as e:  # noqa: BLE001 - a rank's failure, already printed by mp.spawn
        print(f"dcp_oracle {mode}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
