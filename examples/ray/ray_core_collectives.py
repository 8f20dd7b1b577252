"""The seed's Ray Core tensor-parallel check (ray_core_collectives.py) over tpu_dist.

Run it as a Ray driver on a cluster of (emulated) TPU hosts:

    tools/ray_cluster.sh up v6e-4x4
    tools/ray_cluster.sh exec -- python examples/ray/ray_core_collectives.py
    tools/ray_cluster.sh exec -- python examples/ray/ray_core_collectives.py \\
        --topology 2x2x2 --accelerator-type TPU-V7X          # on `up tpu7x-2x2x2`
    tools/ray_cluster.sh down

    tools/ray_cluster.sh up v4-2x2x2 --num-slices 2         # 2 slices x 2 hosts x 4
    tools/ray_cluster.sh exec -- python examples/ray/ray_core_collectives.py \\
        --topology 2x2x2 --accelerator-type TPU-V4 --num-slices 2

The seed's steps, one for one (../shared/reference/seed-ray-programs.md,
"Program 1"): `ray.init()`; reserve one intact slice with
`ray.util.tpu.slice_placement_group(topology, accelerator_version, num_slices=1,
resources_per_bundle={"TPU": 1})`; one actor per bundle
(PlacementGroupSchedulingStrategy); each actor takes its worker id from
TPU_WORKER_ID, its local rank from the TPU id Ray assigned it, rank =
worker_id x devices_per_host + local_rank, MASTER_ADDR = the first of
TPU_WORKER_HOSTNAMES, and calls `dist.init_process_group(backend=...)`; the
FeedForward(128) model with seed 42 gives a reference output, the same model
sharded with init_device_mesh + parallelize_module({"w1": Colwise, "w2":
Rowwise}) must match it (assert_close rtol=1e-3, atol=1e-2); every rank
all_reduces SUM a 4-vector of rank + 1. The driver prints one line per rank,
sorted, asserts the sums, prints the verdict, kills the actors and removes the
slice's placement group.

Differences from the seed, forced by this machine:
- `import tpu_dist` (registers the "tpu_dist" torch.distributed backend) where
  the seed imports torch_tpu; `backend="tpu_dist"`. The import is in the
  actor, before init_process_group: a driver-side import does not reach the
  actors' processes.
- Progress and timings (slice reserved, actors up, ...) go to stderr; stdout
  carries only the seed's lines. The actors' shutdown destroys the process
  group before ray.kill.
- Device "cpu" where the seed uses "tpu": the mesh is init_device_mesh("cpu",
  (world,)) and every tensor lives on the CPU, so max_abs_diff is ~1e-7
  (the seed's TPU run prints 0.002470).
- "TorchTPU-style ranks" in the verdict line where the seed says "TorchTPU
  ranks": these are CPU processes.
- Each actor runs torch with 1 thread and the job is kept small: the "slice" is
  16 processes on one 2-core machine.
- MASTER_PORT is 29500 as in the seed when that port is free on the first
  host, else a free port rank 0's actor picks (`--master-port` to force one).
- TPU_DIST_JOB_ID is set per run so that the shared-memory segments of
  concurrent runs on one machine cannot meet.
- The actors end with ray.actor.exit_actor() after destroy_process_group
  (ray.kill only if one does not exit within 30 s); the seed kills them.
- `--num-slices N` (default 1: the seed's single slice, unchanged) is the
  multi-slice form: `slice_placement_group(..., num_slices=N)` reserves N
  whole slices. An actor's slice s is the TPU slice of its host (TPU_NAME),
  numbered in bundle order: on multi-host slices that is bundle // devices
  per slice (Ray pins each slice's bundles by its ray.io/tpu-slice-name);
  single-host slices carry no such label and Ray may spread one "slice"'s
  bundles over several hosts, so the host decides. Each actor gets the
  variables `ray.util.tpu.get_tpu_coordinator_env_vars(coordinator_address=
  <slice 0's first host>:8081, num_slices=N, slice_id=s)` computes
  (MEGASCALE_*, as KubeRay's webhook and Ray Train set them), its rank is s x
  devices per slice + worker_id x devices per host + local_rank, MASTER_ADDR
  is slice 0's first host, and the TP check and the all_reduce run over all
  N x devices per slice ranks. The driver checks that every slice holds its
  devices' actors (ranks 0..devices per slice - 1 in it), that there are N,
  and that tpu_dist's discovery (RankInfo) saw each rank's slice id and
  count. The lines are the seed's, over the whole world.
- `--report-transport` (off by default, so the output is the seed's) adds one
  line saying how many hosts tpu_dist saw and which ranks hold TCP
  connections to another host: the emulated hosts are network namespaces of
  one machine, and this shows their traffic crosses them over TCP.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import socket
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

import ray
import ray.util.tpu
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

DEVICE = "cpu"  # the seed: "tpu"
DEFAULT_MASTER_PORT = 29500


class FeedForward(nn.Module):
    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, 4 * hidden, bias=False)  # [512, 128]
        self.w2 = nn.Linear(4 * hidden, hidden, bias=False)  # [128, 512]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, 128]
        return x + self.w2(nn.functional.silu(self.w1(x)))


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _socket_inodes() -> set:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    return inodes


def _tcp_connections(peer_ips: set, store_port: int) -> List[List[str]]:
    """This process's established IPv4 TCP connections to `peer_ips` (the
    other hosts), except those of the rendezvous store, as [local, remote]
    "ip:port" pairs."""
    mine = _socket_inodes()
    found = []

    def endpoint(text: str):
        hex_ip, hex_port = text.split(":")
        return socket.inet_ntoa(bytes.fromhex(hex_ip)[::-1]), int(hex_port, 16)

    with open("/proc/self/net/tcp") as f:  # this process's network namespace
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] != "01" or fields[9] not in mine:  # 01 = ESTABLISHED
                continue
            (lip, lport), (rip, rport) = endpoint(fields[1]), endpoint(fields[2])
            if rip in peer_ips and store_port not in (lport, rport):
                found.append([f"{lip}:{lport}", f"{rip}:{rport}"])
    return sorted(found)


def _cross_host_links(rows: List[Dict[str, Any]]) -> List[tuple]:
    """TCP connections whose two ends are both ranks of this job, on different
    hosts: (rank, rank) pairs, one per connection."""
    owner = {}
    for r in rows:
        for local, _ in r["tcp"]:
            owner[local] = r["rank"]
    links = set()
    for r in rows:
        for local, remote in r["tcp"]:
            if remote in owner:
                links.add(tuple(sorted(((r["rank"], local), (owner[remote], remote)))))
    return sorted((a[0], b[0]) for a, b in links)


@ray.remote(resources={"TPU": 1})
class TorchTPUWorker:
    """One process per TPU device of the slice (one actor per bundle)."""

    def __init__(self) -> None:
        torch.set_num_threads(1)

    def setup(self, devices_per_host: int) -> Dict[str, Any]:
        """This device's place in the slice, from what the TPU host gives it."""
        self.ip = ray.util.get_node_ip_address()
        self.hosts = os.environ.get("TPU_WORKER_HOSTNAMES", self.ip).split(",")
        self.worker_id = int(os.environ.get("TPU_WORKER_ID", "0"))
        # The TPU id Ray assigned this actor (0..devices_per_host-1 on its host).
        # Not TPU_VISIBLE_CHIPS: on TPU7x that is the chip, shared by 2 devices.
        self.local_rank = int(ray.get_runtime_context().get_accelerator_ids()["TPU"][0])
        self.devices_per_host = devices_per_host
        self.master_addr = self.hosts[0]
        self.peer_hosts = list(self.hosts)
        self.rank = self.worker_id * devices_per_host + self.local_rank
        return {"rank": self.rank, "worker_id": self.worker_id,
                "local_rank": self.local_rank, "ip": self.ip, "master_addr": self.hosts[0],
                "tpu_name": os.environ.get("TPU_NAME", "")}

    def set_megascale_env(self, env: Dict[str, str], master_addr: str,
                          all_hosts: List[str], devices_per_slice: int) -> Dict[str, Any]:
        """Multi-slice only: the MEGASCALE_* variables of this actor's slice
        (Ray's get_tpu_coordinator_env_vars), the job's rendezvous host
        (slice 0's first host, not this slice's) and every slice's hosts;
        the rank becomes slice x devices per slice + the rank in the slice."""
        os.environ.update(env)
        self.master_addr = master_addr
        self.peer_hosts = list(all_hosts)
        self.rank += int(env["MEGASCALE_SLICE_ID"]) * devices_per_slice
        return {"rank": self.rank, "worker_id": self.worker_id,
                "local_rank": self.local_rank, "ip": self.ip}

    def pick_master_port(self, preferred: int) -> int:
        """On rank 0's host: `preferred` if free there, else a free port."""
        if _port_is_free(preferred):
            return preferred
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def init_process_group(self, world_size: int, master_port: int, job_id: str,
                           timeout_s: float) -> None:
        os.environ["MASTER_ADDR"] = self.master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ["RANK"] = str(self.rank)
        os.environ["LOCAL_RANK"] = str(self.local_rank)
        os.environ["LOCAL_WORLD_SIZE"] = str(self.devices_per_host)
        os.environ.setdefault("TPU_DIST_JOB_ID", job_id)
        self.master_port = master_port
        # Registers the "tpu_dist" backend in this actor's process (the seed:
        # import torch_tpu). Imported here, in the actor, after the variables
        # above: an import in the driver does not reach the actors' processes.
        import tpu_dist  # noqa: F401
        dist.init_process_group(backend="tpu_dist",
                                timeout=datetime.timedelta(seconds=timeout_s))

    def run(self) -> Dict[str, Any]:
        """The TP parity check and the all_reduce; returns this rank's row."""
        world = dist.get_world_size()
        torch.manual_seed(42)
        model = FeedForward(128).to(DEVICE)
        x = torch.randn(64, 128, device=DEVICE)
        with torch.no_grad():
            reference = model(x)
        mesh = init_device_mesh(DEVICE, (world,))
        sharded = parallelize_module(model, mesh,
                                     {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        with torch.no_grad():
            out = sharded(x)
        torch.testing.assert_close(out, reference, rtol=1e-3, atol=1e-2)
        max_abs_diff = (out - reference).abs().max().item()
        from tpu_dist.env import rank_info_or_none
        info = rank_info_or_none() if "MEGASCALE_NUM_SLICES" in os.environ else None

        t = torch.full((4,), float(self.rank + 1), device=DEVICE)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)

        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        peer_ips = set()
        for name in self.peer_hosts:
            try:
                peer_ips.add(socket.gethostbyname(name))
            except OSError:
                pass
        peer_ips.discard(self.ip)
        return {"rank": self.rank, "worker_id": self.worker_id, "local_rank": self.local_rank,
                "ip": self.ip, "all_reduce_sum": t.tolist(), "max_abs_diff": max_abs_diff,
                "num_hosts": getattr(backend, "num_hosts", None),
                "discovered_slice": None if info is None else (info.slice_index, info.num_slices),
                "tcp": _tcp_connections(peer_ips, self.master_port)}

    def shutdown(self) -> None:
        dist.destroy_process_group()
        gc.collect()  # the tpu_dist backend (and its threads) goes now, not at exit

    def exit(self) -> None:
        """Ends this actor's process the orderly way (Ray's exit_actor)."""
        ray.actor.exit_actor()


def _give_megascale_env(actors: List[Any], places: List[Dict[str, Any]], num_slices: int,
                        timeout_s: float) -> List[Dict[str, Any]]:
    """Multi-slice: each actor's slice is the TPU slice (TPU_NAME) its host
    belongs to, numbered in bundle order. On multi-host slices that is
    bundle // devices per slice (Ray pins each slice's bundles by its
    ray.io/tpu-slice-name); single-host slices carry no such label, so Ray
    may spread one slice's bundles over several hosts, and the actor's host
    decides. Every slice must hold devices per slice actors with ranks
    0..devices per slice - 1. Then every actor gets MEGASCALE_* as Ray
    computes them (get_tpu_coordinator_env_vars; the coordinator is slice
    0's first host, port 8081) and the rendezvous host; returns the places
    with the job-wide ranks."""
    per_slice = len(places) // num_slices
    order: List[str] = []
    for p in places:  # bundle order
        if p["tpu_name"] not in order:
            order.append(p["tpu_name"])
    for name in order:
        ranks = sorted(p["rank"] for p in places if p["tpu_name"] == name)
        if ranks != list(range(per_slice)):
            raise RuntimeError(f"TPU_NAME={name!r}: the actors on this slice's hosts have ranks "
                               f"{ranks} in the slice, expected 0..{per_slice - 1} (were whole "
                               f"slices reserved? TPU_NAME of each actor: "
                               f"{[p['tpu_name'] for p in places]})")
    if len(order) != num_slices:
        raise RuntimeError(f"the actors run on {len(order)} TPU slices {order}, expected "
                           f"--num-slices {num_slices}")
    slice_of = [order.index(p["tpu_name"]) for p in places]
    coordinator = next(p["master_addr"] for p, s in zip(places, slice_of) if s == 0)
    all_hosts = sorted({p["ip"] for p in places})
    port = str(getattr(ray.util.tpu, "DEFAULT_MEGASCALE_PORT", 8081))
    return ray.get([a.set_megascale_env.remote(
        ray.util.tpu.get_tpu_coordinator_env_vars(
            coordinator_address=f"{coordinator}:{port}", num_slices=num_slices,
            slice_id=s, coordinator_port=port),
        coordinator, all_hosts, per_slice) for a, s in zip(actors, slice_of)],
        timeout=timeout_s)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topology", default="4x4")
    parser.add_argument("--accelerator-type", default="TPU-V6E")
    parser.add_argument("--master-port", type=int, default=None,
                        help=f"default: {DEFAULT_MASTER_PORT} if free on the first host, "
                             "else a free one")
    parser.add_argument("--timeout-s", type=float, default=180.0,
                        help="bounds the slice reservation and each step of the actors")
    parser.add_argument("--num-slices", type=int, default=1,
                        help="whole slices to reserve (MEGASCALE_* per slice when > 1)")
    parser.add_argument("--report-transport", action="store_true",
                        help="also print how tpu_dist connected the hosts")
    args = parser.parse_args(argv)
    if args.num_slices < 1:
        parser.error(f"--num-slices {args.num_slices}: expected an integer >= 1")
    num_slices = args.num_slices

    t0 = time.monotonic()
    ray.init()
    accelerator_version = ray.util.tpu.get_tpu_version_from_type(args.accelerator_type)
    slice_pg = ray.util.tpu.slice_placement_group(
        topology=args.topology,
        accelerator_version=accelerator_version,
        num_slices=num_slices,
        resources_per_bundle={"TPU": 1},
    )
    pg = slice_pg.placement_group
    ray.get(pg.ready(), timeout=args.timeout_s)
    num_bundles, num_hosts = slice_pg.num_bundles, slice_pg.num_hosts
    devices_per_host = num_bundles // num_hosts
    devices_per_slice = num_bundles // num_slices
    if num_slices == 1:
        print(f"Reserved TPU slice {args.accelerator_type} {args.topology}: "
              f"{num_hosts} hosts x {devices_per_host} devices "
              f"({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
    else:
        print(f"Reserved {num_slices} TPU slices {args.accelerator_type} {args.topology}: "
              f"{num_slices} x {num_hosts // num_slices} hosts x {devices_per_host} devices "
              f"({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)

    actors = [
        TorchTPUWorker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote()
        for i in range(num_bundles)
    ]
    try:
        places = ray.get([a.setup.remote(devices_per_host) for a in actors],
                         timeout=args.timeout_s)
        t_actors = time.monotonic() - t0
        if num_slices > 1:
            places = _give_megascale_env(actors, places, num_slices, args.timeout_s)
        ranks = sorted(p["rank"] for p in places)
        assert ranks == list(range(num_bundles)), f"ranks are not 0..{num_bundles - 1}: {ranks}"
        rank0 = actors[[p["rank"] for p in places].index(0)]
        master_port = args.master_port or ray.get(
            rank0.pick_master_port.remote(DEFAULT_MASTER_PORT), timeout=args.timeout_s)
        job_id = f"ray_{uuid.uuid4().hex[:12]}"
        ray.get([a.init_process_group.remote(num_bundles, master_port, job_id, args.timeout_s)
                 for a in actors], timeout=args.timeout_s)
        t_init = time.monotonic() - t0
        rows = ray.get([a.run.remote() for a in actors], timeout=args.timeout_s)
        ray.get([a.shutdown.remote() for a in actors], timeout=args.timeout_s)
        print(f"(actors up {t_actors:.1f} s, process group {t_init:.1f} s, "
              f"check done {time.monotonic() - t0:.1f} s after ray.init)",
              file=sys.stderr, flush=True)

        expected = float(sum(range(1, num_bundles + 1)))
        if num_slices > 1:
            for r in rows:
                assert r["discovered_slice"] == (r["rank"] // devices_per_slice, num_slices), \
                    (f"rank {r['rank']}: tpu_dist discovered (slice, slices) "
                     f"{r['discovered_slice']}, expected "
                     f"{(r['rank'] // devices_per_slice, num_slices)}")
        for r in sorted(rows, key=lambda r: r["rank"]):
            print(f"Rank {r['rank']:2d} (worker_id={r['worker_id']}, "
                  f"local_rank={r['local_rank']}, ip={r['ip']}): "
                  f"all_reduce_sum={r['all_reduce_sum']}", flush=True)
            assert r["all_reduce_sum"] == [expected] * 4, r
        worst = max(r["max_abs_diff"] for r in rows)
        print(f"All {num_bundles} TorchTPU-style ranks verified DTensor TP parity "
              f"(max_abs_diff={worst:.6f}) and all_reduce sum = {expected}", flush=True)
        if args.report_transport:
            links = _cross_host_links(rows)
            tcp_ranks = sorted({r for link in links for r in link})
            seen = sorted({str(r["num_hosts"]) for r in rows})
            ips = sorted({r["ip"] for r in rows})
            print(f"tpu_dist transport: num_hosts={','.join(seen)} "
                  f"(hosts {', '.join(ips)}; shared memory inside a host), "
                  f"{len(links)} TCP connections between ranks on different hosts "
                  f"(ranks {tcp_ranks})", flush=True)
    finally:
        # Orderly exits first; ray.kill only for an actor that does not go.
        exits = [a.exit.remote() for a in actors]
        _, stuck = ray.wait(exits, num_returns=len(exits), timeout=30)
        for a, ref in zip(actors, exits):
            if ref in stuck:
                ray.kill(a)
        slice_pg.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
