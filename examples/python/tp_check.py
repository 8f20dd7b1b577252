"""The seed's Ray Core tensor-parallel check as a plain torch.distributed
program over tpu_dist (no Ray): run it one process per device.

    torchrun --standalone --nproc-per-node 16 examples/python/tp_check.py
    build/tpu_runtime/launcher/tpurun --accelerator-type TPU-V6E --topology 4x4 \\
        --hosts-emulated -- .venv/bin/python examples/python/tp_check.py

Steps, as the seed takes them (../shared/reference/seed-ray-programs.md):
the FeedForward(128) model `x + w2(silu(w1(x)))` with seed 42, a reference
output on one device for a (64, 128) input, the same model sharded with
init_device_mesh + parallelize_module({"w1": Colwise, "w2": Rowwise}),
assert_close(rtol=1e-3, atol=1e-2), then an all_reduce SUM of a 4-vector of
rank + 1 on every rank. Rank 0 prints one line per rank, sorted, and the
verdict. Differences from the seed, forced by this machine: `import tpu_dist`
where the seed imports torch_tpu; device "cpu" for "tpu"; ranks come from
torchrun's variables or, with none, from the TPU host's (tpu_dist.rank_info).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket

import tpu_dist  # registers the "tpu_dist" backend (the seed: import torch_tpu)

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)


class FeedForward(nn.Module):
    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, 4 * hidden, bias=False)  # [512, 128]
        self.w2 = nn.Linear(4 * hidden, hidden, bias=False)  # [128, 512]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, 128]
        return x + self.w2(nn.functional.silu(self.w1(x)))


def _host_address(info: tpu_dist.RankInfo) -> str:
    """This (possibly emulated) host's address: its TPU_WORKER_HOSTNAMES entry,
    as Ray's get_node_ip_address would give on a real slice; else the
    machine's."""
    hosts, index = info.hostnames, info.host_index
    if 0 <= index < len(hosts):
        return hosts[index]
    return socket.gethostbyname(socket.gethostname())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = tpu_dist.rank_info()
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cpu"

    torch.manual_seed(42)
    model = FeedForward().to(device)
    x = torch.randn(64, 128, device=device)
    with torch.no_grad():
        reference = model(x)
    mesh = init_device_mesh(device, (world,))
    sharded = parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    with torch.no_grad():
        out = sharded(x)
    torch.testing.assert_close(out, reference, rtol=1e-3, atol=1e-2)
    max_abs_diff = (out - reference).abs().max().item()

    t = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    row = {"rank": rank, "worker_id": info.host_index, "local_rank": info.local_rank,
           "ip": _host_address(info), "sum": t.tolist(),
           "diff": max_abs_diff}
    rows: list = [None] * world
    dist.all_gather_object(rows, row)
    expected = world * (world + 1) / 2
    if rank == 0:
        for r in sorted(rows, key=lambda r: r["rank"]):
            print(f"Rank {r['rank']:2d} (worker_id={r['worker_id']}, "
                  f"local_rank={r['local_rank']}, ip={r['ip']}): "
                  f"all_reduce_sum={r['sum']}", flush=True)
            assert r["sum"] == [expected] * 4, r
        worst = max(r["diff"] for r in rows)
        print(f"All {world} TorchTPU-style ranks verified DTensor TP parity "
              f"(max_abs_diff={worst:.6f}) and all_reduce sum = {expected}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
