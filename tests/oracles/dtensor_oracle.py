#!/usr/bin/env python3
"""torch DTensor oracle for our C++ DTensor layer (fsdp/): redistribute and tensor parallel.

torch's own ``torch.distributed.tensor`` on CPU over Gloo, one process per rank
(torch.multiprocessing spawn, one thread each), for worlds 2, 3 and 4 (the 2x2 mesh runs in the
world-4 processes). Everything random is drawn in the parent from fixed seeds and shipped to the
ranks, so the fixtures are byte-identical run to run.

Redistribute (``redistribute.json`` + ``redistribute.safetensors``): on 1-D meshes of 2, 3, 4 ranks
every ordered pair of {S(0), S(1), R, P(sum)} plus P(avg|max|min) -> R / S(d), R -> P(avg|max|min),
S(0) -> P(max) and P(sum) -> P(avg); on the 2x2 mesh a list of pairs that exercises the order of
steps across mesh dims (``PAIRS_2X2``). Global shapes (5, 3) and (2, 3): uneven on every mesh, and
empty shards (2 rows on 3 or 4 ranks, 3 columns on 4, 2 rows over 2x2 with both dims on rows).
A non-Partial source is ``distribute_tensor(global, mesh, src)``; a Partial source is
``DTensor.from_local(inputs[rank], mesh, src, shape=global)`` with random per-rank inputs (stored).
Then ``.redistribute(mesh, dst).to_local()`` on every rank is stored; a transition torch refuses is
recorded with its error instead.

Per-rank tensors are packed: one tensor holds every rank's piece flattened and concatenated in rank
order, and the manifest's ``pieces`` map gives the pieces' shapes ({name: [[rank 0 shape], ...]});
a safetensors header entry costs more than most of these tensors. Manifest ``cases``, one line each:
``id``, ``mesh`` (shape), ``shape`` (global), ``src``/``dst`` (placement strings as our
Placement::ToString: "S(0)", "R", "P(sum)"), ``input`` (the global tensor ``g.<mesh>.<shape>``, or
the packed per-rank Partial inputs ``p.<mesh>.<shape>.<src>``), ``out`` (packed, named as the id) or
``torch_error``.

Tensor parallel (``tensor_parallel.json`` + ``tensor_parallel.safetensors``): ``parallelize_module``
on small modules (``TP_MODELS``), worlds 2, 3, 4; full weights, input and target are stored once per
model (``<model>.<param>``, ``<model>.x``, ``<model>.target``); per world, packed over the ranks, the
local output, the input gradient and every parameter's local gradient (``<model>.w<world>.y``,
``.x_grad``, ``.grad.<param>``) after ``loss = sum((y_local - target_local)^2) / target.numel()``
and backward. Replicated parameters whose torch gradient is left Partial (SequenceParallel's norm)
are stored reduced, as our SequenceParallel all-reduces them in backward. Each run is checked here
against the same module on one process (1e-5) so a fixture cannot encode a wrong plan.

Run through regenerate.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

import gloo_ranks

WORLDS = (2, 3, 4)
SHAPES = ((5, 3), (2, 3))
BASE = ("S(0)", "S(1)", "R", "P(sum)")
EXTRA_1D = (("P(avg)", "R"), ("P(avg)", "S(0)"), ("P(max)", "R"), ("P(max)", "S(1)"), ("P(min)", "R"),
            ("P(min)", "S(0)"), ("R", "P(avg)"), ("R", "P(max)"), ("R", "P(min)"), ("S(0)", "P(max)"),
            ("P(sum)", "P(avg)"))
PAIRS_2X2 = (
    # gathers and chunks, nested shards of one tensor dim
    ("S(0),S(1)", "R,R"), ("R,R", "S(0),S(1)"), ("S(0),S(0)", "R,R"), ("R,R", "S(0),S(0)"),
    ("S(1),S(1)", "R,R"), ("S(0),S(0)", "R,S(0)"), ("S(0),S(0)", "S(0),R"), ("R,S(0)", "S(0),S(0)"),
    ("S(0),R", "S(0),S(0)"), ("S(0),R", "R,S(0)"), ("R,S(0)", "S(0),R"),
    # shard-to-shard
    ("S(0),S(1)", "S(1),S(0)"), ("S(0),S(0)", "S(1),S(1)"), ("S(0),S(0)", "S(0),S(1)"),
    ("S(0),S(0)", "S(1),S(0)"), ("S(1),R", "S(0),R"), ("R,S(1)", "R,S(0)"), ("S(0),S(1)", "S(0),S(0)"),
    ("S(1),S(0)", "S(0),S(0)"), ("S(0),S(1)", "S(1),S(1)"),
    # from Partial
    ("P(sum),P(sum)", "R,R"), ("P(sum),P(sum)", "S(0),S(1)"), ("P(sum),P(sum)", "S(0),S(0)"),
    ("P(sum),R", "R,R"), ("R,P(sum)", "R,S(1)"), ("P(sum),S(0)", "R,R"), ("P(sum),S(0)", "S(0),S(0)"),
    ("S(0),P(sum)", "S(0),S(1)"), ("P(sum),S(1)", "S(1),S(0)"), ("S(1),P(sum)", "R,R"),
    ("P(max),P(max)", "R,S(0)"),
    # to Partial
    ("R,R", "P(sum),P(sum)"), ("R,R", "P(sum),R"), ("S(0),S(1)", "P(sum),S(1)"), ("S(0),R", "P(sum),R"),
    ("R,S(0)", "R,P(sum)"), ("S(0),S(0)", "S(0),P(sum)"), ("S(0),S(0)", "P(sum),S(0)"),
    ("S(1),S(0)", "P(sum),P(sum)"), ("P(sum),R", "P(sum),S(0)"), ("S(0),S(0)", "P(sum),P(sum)"),
    ("S(0),S(0)", "P(sum),R"), ("S(0),S(0)", "R,P(sum)"), ("S(0),S(0)", "S(1),P(sum)"),
)
# name -> module kind, sizes, torch plan. Rows of every input: x [B, in] or [B, S, in] or ids [B, S].
TP_MODELS: dict[str, dict[str, Any]] = {
    # hidden 12: even on 2, 3, 4; torch's default styles (local tensors between the layers)
    "ffn12": dict(kind="ffn", dims=(6, 12, 5), x=(3, 6), plan="colwise_rowwise"),
    # hidden 10: uneven on 3 and 4 (4, 4, 2 / 3, 3, 3, 1). torch's default ColwiseParallel returns a
    # local tensor and RowwiseParallel's from_local then infers hidden = local * world, which fails for
    # uneven shards; w1 keeps a DTensor output (use_local_output=False): the same math.
    "ffn10": dict(kind="ffn", dims=(6, 10, 5), x=(3, 6), plan="colwise_dtensor_rowwise"),
    # Megatron-SP: LayerNorm SequenceParallel, w1 Colwise(input S(1)), w2 Rowwise(output S(1))
    "sp": dict(kind="sp", dims=(4, 12, 4), x=(1, 12, 4), plan="sequence_colwise_rowwise"),
    # vocab 11 rows over 2, 3, 4 (uneven), ids replicated (torchtitan's RowwiseParallel(input_layouts=
    # Replicate()); our RowwiseParallel's default for an Embedding)
    "emb_rowwise": dict(kind="emb", dims=(11, 4), x=(2, 5), plan="rowwise"),
    # torch's default RowwiseParallel() on an Embedding: the ids are declared Shard(-1) and all-gathered
    # (12 ids per row: even over 2, 3, 4)
    "emb_rowwise_ids_sharded": dict(kind="emb", dims=(11, 4), x=(1, 12), plan="rowwise_default"),
    # embedding dim 6 over 2, 3, 4: 2, 2, 2, 0 columns on 4 ranks
    "emb_colwise": dict(kind="emb", dims=(11, 6), x=(2, 5), plan="colwise"),
}


def parse_placement(s: str) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard
    if s == "R":
        return Replicate()
    if s.startswith("S("):
        return Shard(int(s[2:-1]))
    if s.startswith("P("):
        return Partial(s[2:-1])
    raise ValueError(s)


def local_chunk(full: torch.Tensor, mesh: tuple[int, ...], coord: tuple[int, ...],
                placements: list[str]) -> torch.Tensor:
    """torch.chunk in mesh-dim order (an empty piece past the last chunk)."""
    t = full
    for m, p in enumerate(placements):
        if p.startswith("S("):
            d = int(p[2:-1])
            t = piece(t, mesh[m], d, coord[m])
    return t.contiguous()


def piece(t: torch.Tensor, n: int, dim: int | None, i: int) -> torch.Tensor:
    """torch.chunk(t, n, dim)[i], empty past the last piece; t itself when dim is None."""
    if dim is None:
        return t
    pieces = torch.chunk(t, n, dim)
    return pieces[i] if i < len(pieces) else t.narrow(dim, 0, 0)


def coords(mesh: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Row-major coordinates of ranks 0..n-1."""
    out = [()]
    for size in mesh:
        out = [c + (i,) for c in out for i in range(size)]
    return out


def tag(seq: Any) -> str:
    return "x".join(str(v) for v in seq)


def make_redistribute_cases(
) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor], dict[str, list[torch.Tensor]]]:
    """The cases (without results), the global inputs and the per-rank Partial inputs."""
    gen = torch.Generator().manual_seed(20260601)
    cases: list[dict[str, Any]] = []
    globals_: dict[str, torch.Tensor] = {}
    partials: dict[str, list[torch.Tensor]] = {}
    plans: list[tuple[tuple[int, ...], list[tuple[list[str], list[str]]]]] = []
    for w in WORLDS:
        plans.append(((w,), [([a], [b]) for a in BASE for b in BASE if a != b]))
    plans.append(((2, 2), [(a.split(","), b.split(",")) for a, b in PAIRS_2X2]))
    for mesh, pairs in plans:
        for shape in SHAPES:
            extra = [([a], [b]) for a, b in EXTRA_1D] if len(mesh) == 1 and shape == SHAPES[0] else []
            for src, dst in pairs + extra:
                name = f"g.{tag(mesh)}.{tag(shape)}"
                if name not in globals_:
                    globals_[name] = torch.randn(shape, generator=gen)
                if any(p.startswith("P") for p in src):
                    name = f"p.{tag(mesh)}.{tag(shape)}.{','.join(src)}"
                    if name not in partials:
                        partials[name] = [local_chunk(torch.randn(shape, generator=gen), mesh, c, src)
                                          for c in coords(mesh)]
                cases.append(dict(id=f"c{len(cases):03d}", mesh=list(mesh), shape=list(shape), src=src, dst=dst,
                                  input=name))
    return cases, globals_, partials


def plain(t: torch.Tensor) -> torch.Tensor:
    """A detached contiguous copy (waits on an AsyncCollectiveTensor)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    if isinstance(t, AsyncCollectiveTensor):
        t = t.wait()
    return t.detach().clone().contiguous()


def run_redistribute(rank: int, cases: list[dict[str, Any]], globals_: dict[str, torch.Tensor],
                     partials: dict[str, list[torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """This rank's local result of every case (by case id), and torch's refusals."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    meshes: dict[tuple[int, ...], Any] = {}
    out: dict[str, torch.Tensor] = {}
    errors: dict[str, str] = {}
    for case in cases:
        mesh_shape = tuple(case["mesh"])
        if mesh_shape not in meshes:
            meshes[mesh_shape] = init_device_mesh("cpu", mesh_shape)
        mesh = meshes[mesh_shape]
        src = [parse_placement(p) for p in case["src"]]
        dst = [parse_placement(p) for p in case["dst"]]
        if case["input"] in partials:
            shape = torch.Size(case["shape"])
            x = DTensor.from_local(partials[case["input"]][rank], mesh, src, run_check=False, shape=shape,
                                   stride=torch.empty(shape).stride())
        else:
            x = distribute_tensor(globals_[case["input"]], mesh, src)
        try:
            out[case["id"]] = plain(x.redistribute(mesh, dst).to_local())
        except Exception as e:  # torch refuses the transition: the same on every rank, before any collective
            errors[case["id"]] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return out, errors


def make_tp_models() -> dict[str, torch.Tensor]:
    """Full weights, inputs and targets of every TP_MODELS entry."""
    gen = torch.Generator().manual_seed(20260602)
    tensors: dict[str, torch.Tensor] = {}
    for name, spec in TP_MODELS.items():
        model = build_tp_model(spec)
        for pname, p in model.named_parameters():
            tensors[f"{name}.{pname}"] = (torch.randn(p.shape, generator=gen) * 0.5).contiguous()
        if spec["kind"] == "emb":
            tensors[f"{name}.x"] = torch.randint(0, spec["dims"][0], spec["x"], generator=gen)
        else:
            tensors[f"{name}.x"] = torch.randn(spec["x"], generator=gen)
        ref = build_tp_model(spec)
        ref.load_state_dict({k[len(name) + 1:]: v for k, v in tensors.items()
                             if k.startswith(name + ".") and k != f"{name}.x"})
        with torch.no_grad():
            y = ref(tensors[f"{name}.x"])
        tensors[f"{name}.target"] = torch.randn(y.shape, generator=gen)
    return tensors


class FeedForward(torch.nn.Module):
    """[optional LayerNorm] -> Linear(in, hidden) -> SiLU -> Linear(hidden, out), biases."""

    def __init__(self, dims: tuple[int, int, int], norm: bool) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dims[0]) if norm else None
        self.w1 = torch.nn.Linear(dims[0], dims[1])
        self.w2 = torch.nn.Linear(dims[1], dims[2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.norm is not None:
            x = self.norm(x)
        return self.w2(torch.nn.functional.silu(self.w1(x)))


class Embed(torch.nn.Module):
    def __init__(self, dims: tuple[int, int]) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(dims[0], dims[1])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [B, S] -> [B, S, dim]
        return self.emb(ids)


def build_tp_model(spec: dict[str, Any]) -> torch.nn.Module:
    if spec["kind"] == "emb":
        return Embed(spec["dims"])
    return FeedForward(spec["dims"], norm=spec["kind"] == "sp")


def tp_plan(plan: str) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    return {
        "colwise_rowwise": {"w1": ColwiseParallel(), "w2": RowwiseParallel()},
        "colwise_dtensor_rowwise": {"w1": ColwiseParallel(use_local_output=False), "w2": RowwiseParallel()},
        "sequence_colwise_rowwise": {"norm": SequenceParallel(), "w1": ColwiseParallel(input_layouts=Shard(1)),
                                     "w2": RowwiseParallel(output_layouts=Shard(1))},
        "rowwise": {"emb": RowwiseParallel(input_layouts=Replicate())},
        "rowwise_default": {"emb": RowwiseParallel()},
        "colwise": {"emb": ColwiseParallel()},
    }[plan]


def run_tp(rank: int, world: int, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh("cpu", (world,))
    out: dict[str, torch.Tensor] = {}
    for name, spec in TP_MODELS.items():
        params = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
        x, target = params.pop("x"), params.pop("target")
        model = build_tp_model(spec)
        model.load_state_dict(params)
        ref = build_tp_model(spec)
        ref.load_state_dict(params)
        parallelize_module(model, mesh, tp_plan(spec["plan"]))
        seq = spec["kind"] == "sp"  # input and output sharded on dim 1
        out_dim = 1 if seq else (-1 if spec["plan"] == "colwise" else None)
        in_dim = 1 if seq else (-1 if spec["plan"] == "rowwise_default" else None)
        x_local = piece(x, world, in_dim, rank)
        x_local = x_local.clone().requires_grad_(x.is_floating_point())
        y = model(x_local)
        if isinstance(y, DTensor):
            y = y.to_local()
        t_local = piece(target, world, out_dim, rank)
        (((y - t_local) ** 2).sum() / target.numel()).backward()
        prefix = f"{name}.w{world}"
        out[f"{prefix}.y"] = plain(y)
        if x_local.grad is not None:
            out[f"{prefix}.x_grad"] = plain(x_local.grad)
        grads = {}
        for pname, p in model.named_parameters():
            g = p.grad
            if isinstance(g, DTensor):
                if g.placements != p.placements:
                    g = g.redistribute(p.device_mesh, p.placements)
                g = g.to_local()
            grads[pname] = plain(g)
            out[f"{prefix}.grad.{pname}"] = grads[pname]
        # The same module on one process: the fixture must be the right math.
        x_ref = x.clone().requires_grad_(x.is_floating_point())
        y_ref = ref(x_ref)
        ((y_ref - target) ** 2).sum().div(target.numel()).backward()
        y_ref_local = piece(y_ref, world, out_dim, rank)
        checks = [(out[f"{prefix}.y"], y_ref_local.detach(), "y")]
        if x_ref.grad is not None:
            checks.append((out[f"{prefix}.x_grad"], piece(x_ref.grad, world, in_dim, rank),
                           "x_grad"))
        for pname, p in ref.named_parameters():
            placed = dict(model.named_parameters())[pname]
            want = p.grad
            if isinstance(placed, DTensor) and placed.placements[0].is_shard():
                want = piece(want, world, placed.placements[0].dim, rank)
            checks.append((grads[pname], want, pname))
        for got, want, what in checks:
            assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5), (name, world, what)
    return out


def worker(rank: int, world: int, cases: list[dict[str, Any]], globals_: dict[str, torch.Tensor],
           partials: dict[str, list[torch.Tensor]], tp_tensors: dict[str, torch.Tensor], tmp: str) -> None:
    out, errors = run_redistribute(rank, cases, globals_, partials)
    tp = run_tp(rank, world, tp_tensors)
    torch.save({"out": out, "errors": errors, "tp": tp}, os.path.join(tmp, f"w{world}.r{rank}.pt"))
    dist.barrier()


def pack(pieces: list[torch.Tensor]) -> tuple[torch.Tensor, list[list[int]]]:
    """Every rank's piece flattened and concatenated in rank order, and the pieces' shapes."""
    return torch.cat([p.reshape(-1) for p in pieces]).contiguous(), [list(p.shape) for p in pieces]


def write_manifest(path: Path, head: dict[str, Any], lists: dict[str, Any]) -> None:
    """JSON with one line per list item / map entry (diffable, small), keys sorted."""
    def dump(v: Any) -> str:
        return json.dumps(v, sort_keys=True, separators=(",", ":"))

    parts = [json.dumps(head, sort_keys=True)[:-1]]
    for key, items in sorted(lists.items()):
        if isinstance(items, dict):
            body = ",\n".join(f"{json.dumps(k)}: {dump(v)}" for k, v in sorted(items.items()))
            parts.append(f'"{key}": {{\n{body}\n}}')
        else:
            body = ",\n".join(dump(v) for v in items)
            parts.append(f'"{key}": [\n{body}\n]')
    path.write_text(parts[0] + ",\n" + ",\n".join(parts[1:]) + "}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="fixture directory (fixtures/dtensor)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases, globals_, partials = make_redistribute_cases()
    tp_tensors = make_tp_models()
    red_ranks: dict[str, dict[int, torch.Tensor]] = {}
    tp_ranks: dict[str, dict[int, torch.Tensor]] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in WORLDS:
            mine = [c for c in cases if len(coords(tuple(c["mesh"]))) == world]
            gloo_ranks.spawn(worker, world, mine, globals_, partials, tp_tensors, tmp)
            for rank in range(world):
                got = torch.load(os.path.join(tmp, f"w{world}.r{rank}.pt"))
                for k, v in got["out"].items():
                    red_ranks.setdefault(k, {})[rank] = v
                for k, v in got["tp"].items():
                    tp_ranks.setdefault(k, {})[rank] = v
                errors.update(got["errors"])
    red: dict[str, torch.Tensor] = dict(globals_)
    red_pieces: dict[str, list[list[int]]] = {}
    for name, ranks in list(partials.items()) + [(k, [v[r] for r in sorted(v)]) for k, v in red_ranks.items()]:
        red[name], red_pieces[name] = pack(ranks)
    for case in cases:
        if case["id"] in errors:
            case["torch_error"] = errors[case["id"]]
        else:
            case["out"] = case["id"]
    tp: dict[str, torch.Tensor] = dict(tp_tensors)
    tp_pieces: dict[str, list[list[int]]] = {}
    for name, ranks in tp_ranks.items():
        tp[name], tp_pieces[name] = pack([ranks[r] for r in sorted(ranks)])
    meta = {"format": "pt"}
    save_file(red, str(args.out / "redistribute.safetensors"), metadata=meta)
    save_file(tp, str(args.out / "tensor_parallel.safetensors"), metadata=meta)
    write_manifest(args.out / "redistribute.json", {"torch": torch.__version__},
                   {"cases": cases, "pieces": red_pieces})
    models = {k: dict(v, dims=list(v["dims"]), x=list(v["x"])) for k, v in TP_MODELS.items()}
    write_manifest(args.out / "tensor_parallel.json", {"torch": torch.__version__, "worlds": list(WORLDS)},
                   {"models": models, "pieces": tp_pieces})
    print(f"torch DTensor oracle: {len(cases)} redistribute cases ({len(errors)} refused by torch), "
          f"{len(TP_MODELS)} TP models x worlds {WORLDS}")


if __name__ == "__main__":
    sys.exit(main())
