"""torch.distributed from Python: tpu_dist vs Gloo side by side in one run.

    .venv/bin/python bench/python/torch_dist_bench.py [--worlds 2 4 16] [--quick]
        [--json-out FILE]
    .venv/bin/python bench/python/torch_dist_bench.py --layers [--worlds 2 4]
        [--cxx-bench build/bench/collectives_bench]
    .venv/bin/python bench/python/torch_dist_bench.py --latency [--worlds 2 4]
        [--ab OLD_PKG_DIR] [--rounds 3] [--cxx-bench build/bench/collectives_bench]

For each world size it spawns that many ranks (one process each, like
torchrun), initialises the default group with backend "tpu_dist" and a Gloo
group over the same ranks, then times, on rank 0, `dist.all_reduce`,
`dist.all_gather_into_tensor` and `dist.reduce_scatter_tensor` (fp32,
8 B .. 64 MiB; size = the largest buffer a rank touches, as bench/README.md)
on both, and FSDP2 training steps/s (torch's `fully_shard` of a small
transformer, AdamW) on both. Every case: barrier, one warm-up op, barrier,
timed loop. Prints a markdown table with the load average; nothing asserts a
number (this is a benchmark, not a test).

Ranks get RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, as torchrun
sets them: without the LOCAL_* pair tpu_dist's discovery places every rank
on a host of its own (TCP between them, never shared memory).

--latency: the per-op cost of small and mid-size all_reduce (8 B, 64 KiB,
1 MiB) on tpu_dist alone, three ways: blocking `dist.all_reduce(t)`,
`dist.all_reduce(t, async_op=True).wait()` and `...get_future().wait()`;
each cell is the median over 7 repetitions of a timed loop (rank 0's
clock). With --ab DIR it alternates the tpu_dist package copied into DIR
(DIR/tpu_dist, an older build) with this checkout's, --rounds times per
world, in one run; --cxx-bench adds our C++ path (collectives_bench, blocking
all_reduce on the same sizes) to every round. Prints one row per (world,
size, mode) with each build's rounds and the load average.

--layers: where the per-op cost of a small op goes between Python and our
C++: an 8 B all_reduce through our backend's binding (asyncOp false), torch's
ProcessGroup (the c10d dispatcher op), dist.all_reduce, and an async op
waited on at once; with --cxx-bench, our C++ path in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

SIZES = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20]
OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"]


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _iters(nbytes: int, quick: bool) -> int:
    if quick:
        return 2
    return max(3, min(200, (64 << 20) // max(nbytes, 1) // 4))


def _time_op(op: str, nbytes: int, world: int, group: Any, iters: int) -> float:
    numel = max(world, nbytes // 4 // world * world)  # divisible by world
    if op == "all_reduce":
        buf = torch.ones(numel)
        fn = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    elif op == "all_gather_into_tensor":
        out = torch.empty(numel)
        inp = torch.ones(numel // world)
        fn = lambda: dist.all_gather_into_tensor(out, inp, group=group)  # noqa: E731
    else:
        inp = torch.ones(numel)
        out = torch.empty(numel // world)
        fn = lambda: dist.reduce_scatter_tensor(out, inp, group=group)  # noqa: E731
    dist.barrier()
    fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, seq, dim]
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def _fsdp_steps_per_s(world: int, group: Any, steps: int) -> float:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(*[_Block(128) for _ in range(4)])
    mesh = DeviceMesh.from_group(group, "cpu")
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 32, 128)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    return steps / (time.perf_counter() - start)


def _rank_env(rank: int, world: int, port: int) -> None:
    # As torchrun: all ranks on this host (LOCAL_*), so tpu_dist uses shm.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))


LATENCY_SIZES = [8, 64 << 10, 1 << 20]
LATENCY_MODES = ["blocking", "async+wait", "async+future"]


def _latency_main(rank: int, world: int, port: int, pkg_dir: str, queue: Any) -> None:
    _rank_env(rank, world, port)
    if pkg_dir:  # an older build of the package (--ab): ahead of this checkout's
        sys.path.insert(0, pkg_dir)
    torch.set_num_threads(1)
    import tpu_dist

    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=300))
    rows = []
    for nbytes in LATENCY_SIZES:
        t = torch.ones(max(1, nbytes // 4))
        fns = {
            "blocking": lambda: dist.all_reduce(t),
            "async+wait": lambda: dist.all_reduce(t, async_op=True).wait(),
            "async+future": lambda: dist.all_reduce(t, async_op=True).get_future().wait(),
        }
        iters = 2000 if nbytes <= 8 else 400 if nbytes <= (64 << 10) else 100
        for mode in LATENCY_MODES:
            times = []
            for _ in range(7):
                dist.barrier()
                fns[mode]()
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    fns[mode]()
                times.append((time.perf_counter() - start) / iters * 1e6)
            times.sort()
            rows.append({"bytes": nbytes, "mode": mode, "us": times[len(times) // 2]})
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        queue.put({"rows": rows, "package": os.path.dirname(tpu_dist.__file__)})


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(target: Any, world: int, extra: tuple) -> dict[str, Any]:
    port = _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port) + extra + (queue,))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        while True:  # a rank that died (its traceback is on stderr) ends the wait
            try:
                return queue.get(timeout=5)
            except Exception:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"a rank failed: {[p.exitcode for p in procs]}")
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def _cxx_latency(binary: str, world: int) -> dict[int, float]:
    """Our C++ path: collectives_bench's blocking all_reduce at LATENCY_SIZES."""
    names = {8: "8B", 64 << 10: "64KiB", 1 << 20: "1MiB"}
    sizes = "|".join(names.values())
    out = subprocess.run(
        [binary, f"--world={world}", f"--benchmark_filter=^all_reduce/fp32/({sizes})/world{world}/tpu_dist/",
         "--benchmark_format=json"], capture_output=True, text=True, timeout=600)
    start = out.stdout.find("{")
    if out.returncode != 0 or start < 0:
        return {}
    bench = json.JSONDecoder().raw_decode(out.stdout[start:])[0]
    result = {}
    for b in bench.get("benchmarks", []):
        for n, name in names.items():
            if f"/{name}/" in b["name"]:
                scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b.get("time_unit", "ns")]
                result[n] = b["real_time"] * scale
    return result


def _latency(worlds: list[int], ab: str, rounds: int, cxx: str) -> int:
    builds = {"new": ""} if not ab else {"old": os.path.abspath(ab), "new": ""}
    cells: dict[tuple, dict[str, list[float]]] = {}
    loads = []
    for world in worlds:
        for _ in range(rounds):
            for build, pkg in builds.items():
                res = _spawn(_latency_main, world, (pkg,))
                loads.append(_load())
                for r in res["rows"]:
                    cells.setdefault((world, r["bytes"], r["mode"]), {}).setdefault(
                        build, []).append(r["us"])
            if cxx:
                for nbytes, us in _cxx_latency(cxx, world).items():
                    cells.setdefault((world, nbytes, "C++ blocking"), {}).setdefault(
                        "new", []).append(us)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; all_reduce fp32, us per op "
          f"(median of 7 loops, rank 0), {rounds} round(s) per build, builds alternated; "
          f"load average after each run: {', '.join(loads)}")
    head = "| world | size | mode | " + " | ".join(f"{b} (each round)" for b in builds)
    print(head + (" | old/new (medians) |" if ab else " |"))
    print("|---" * (3 + len(builds) + (1 if ab else 0)) + "|")
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    for (world, nbytes, mode), by in sorted(cells.items(), key=lambda kv: (
            kv[0][0], kv[0][1], (["C++ blocking"] + LATENCY_MODES).index(kv[0][2]))):
        vals = " | ".join(" ".join(f"{x:.1f}" for x in by.get(b, [])) or "-" for b in builds)
        ratio = ""
        if ab:
            ratio = (f" | {med(by['old']) / med(by['new']):.2f}"
                     if by.get("old") and by.get("new") else " | -")
        print(f"| {world} | {_size(nbytes)} | {mode} | {vals}{ratio} |")
    return 0


LAYERS = ["backend.allreduce (sync)", "pg.allreduce (sync)", "dist.all_reduce",
          "backend.allreduce (async) + wait"]


def _layers_main(rank: int, world: int, port: int, queue: Any) -> None:
    """One 8 B all_reduce through each layer between Python and our C++:
    our backend's binding called directly, torch's ProcessGroup (the c10d
    dispatcher op), torch.distributed's Python function, and an async op
    waited on at once (the op-worker handoff)."""
    _rank_env(rank, world, port)
    torch.set_num_threads(1)
    import tpu_dist  # noqa: F401
    from torch._C._distributed_c10d import AllreduceOptions

    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=120))
    t = torch.ones(2)
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    sync, asynchronous = AllreduceOptions(), AllreduceOptions()
    sync.asyncOp, asynchronous.asyncOp = False, True
    fns = {
        LAYERS[0]: lambda: backend.allreduce([t], sync),
        LAYERS[1]: lambda: pg.allreduce([t], sync),
        LAYERS[2]: lambda: dist.all_reduce(t),
        LAYERS[3]: lambda: backend.allreduce([t], asynchronous).wait(),
    }
    rows = {}
    for name, fn in fns.items():
        times = []
        for _ in range(7):
            dist.barrier()
            fn()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(2000):
                fn()
            times.append((time.perf_counter() - start) / 2000 * 1e6)
        rows[name] = sorted(times)[3]
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        queue.put({"rows": rows})


def _layers(worlds: list[int], cxx: str) -> int:
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; all_reduce fp32 8 B, us per op "
          "(median of 7 loops of 2000, rank 0)")
    print("| world | " + " | ".join(["C++ (collectives_bench)"] + LAYERS) + " | load after |")
    print("|---" * (len(LAYERS) + 3) + "|")
    for world in worlds:
        cxx_us = _cxx_latency(cxx, world).get(8) if cxx else None
        rows = _spawn(_layers_main, world, ())["rows"]
        cells = [_fmt(cxx_us)] + [_fmt(rows[name]) for name in LAYERS]
        print(f"| {world} | " + " | ".join(cells) + f" | {_load()} |")
    return 0


def _rank_main(rank: int, world: int, port: int, quick: bool, queue: Any) -> None:
    _rank_env(rank, world, port)
    torch.set_num_threads(1)
    import tpu_dist  # noqa: F401

    timeout = datetime.timedelta(seconds=600)
    dist.init_process_group("tpu_dist", timeout=timeout)
    groups = {"tpu_dist": dist.group.WORLD,
              "gloo": dist.new_group(backend="gloo", timeout=timeout)}
    rows = []
    for op in OPS:
        for nbytes in (SIZES[:1] + SIZES[5:6] if quick else SIZES):
            row: dict[str, Any] = {"op": op, "bytes": nbytes, "world": world}
            for name, group in groups.items():
                if name == "gloo" and world > 8 and nbytes > (16 << 20):
                    row["gloo_us"] = None  # Gloo at 16 ranks x 64 MiB: minutes
                    continue
                row[f"{name}_us"] = _time_op(op, nbytes, world, group,
                                             _iters(nbytes, quick)) * 1e6
            rows.append(row)
    steps = 2 if quick else 10
    train = {name: _fsdp_steps_per_s(world, g, steps) for name, g in groups.items()}
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        queue.put({"world": world, "rows": rows, "fsdp2_steps_per_s": train})


def _run_world(world: int, quick: bool) -> dict[str, Any]:
    port = _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    load_before = _load()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, quick, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        result = queue.get(timeout=1800)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    result["load"] = f"{load_before} -> {_load()}"
    return result


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _size(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 1 << 20 else f"{n >> 10}KiB" if n >= 1024 else f"{n}B"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 16])
    parser.add_argument("--quick", action="store_true", help="2 sizes, 2 iterations")
    parser.add_argument("--json-out", default="")
    parser.add_argument("--latency", action="store_true",
                        help="8 B / 64 KiB / 1 MiB all_reduce per-op cost, tpu_dist only")
    parser.add_argument("--ab", default="",
                        help="with --latency: a dir holding an older tpu_dist package to alternate")
    parser.add_argument("--rounds", type=int, default=3, help="with --latency")
    parser.add_argument("--cxx-bench", default="",
                        help="with --latency: collectives_bench binary for the C++ path")
    parser.add_argument("--layers", action="store_true",
                        help="8 B all_reduce through each layer: backend, ProcessGroup, dist")
    args = parser.parse_args()
    if args.layers:
        return _layers(args.worlds, args.cxx_bench)
    if args.latency:
        return _latency(args.worlds, args.ab, args.rounds, args.cxx_bench)
    results = [_run_world(w, args.quick) for w in args.worlds]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    print("| op | world | size | tpu_dist us | Gloo us | Gloo/tpu_dist |")
    print("|---|---|---|---|---|---|")
    for res in results:
        for r in res["rows"]:
            ratio = (r["gloo_us"] / r["tpu_dist_us"]) if r.get("gloo_us") else None
            print(f"| {r['op']} | {r['world']} | {_size(r['bytes'])} | "
                  f"{_fmt(r['tpu_dist_us'])} | {_fmt(r.get('gloo_us'))} | "
                  f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    print()
    print("| FSDP2 training (torch fully_shard) | world | tpu_dist steps/s | Gloo steps/s | "
          "ratio | load average |")
    print("|---|---|---|---|---|---|")
    for res in results:
        t = res["fsdp2_steps_per_s"]
        print(f"| 4 blocks x dim 128, batch 4 x 32 | {res['world']} | {t['tpu_dist']:.2f} | "
              f"{t['gloo']:.2f} | {t['tpu_dist'] / t['gloo']:.2f} | {res['load']} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "torch": torch.__version__, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
