"""torch.distributed collectives timed with bench/peers' one method.

    python bench/peers/torch_peers.py --lib tpu_dist|gloo|deepspeed|fake --world W
        [--ops all_reduce,reduce_scatter,...] [--sizes 8,4096,...] [--max-iters N]

Starts W rank processes of itself (one process per rank, one intra-op thread
each, MASTER_ADDR/PORT on loopback) and prints rank 0's results, one JSON
object per line, as bench/peers/mpi_peers.c does:
    {"lib": "tpu_dist_torch", "op": "all_reduce", "world": 2, "bytes": 8,
     "time_us": 39.5, "iters": 200}
Per (op, size): barrier, one warm-up op, barrier, then N ops each timed on its
own (time.perf_counter around the call, which returns when the op is done);
rank 0's median. fp32 SUM; sizes as in bench/README.md (split ops round to
world x 4 B); N = clamp(512 MiB / size, 5, max_iters).

Libraries:
  tpu_dist   dist.init_process_group("tpu_dist") (needs the extension:
             the project's .venv python);
  gloo       dist.init_process_group("gloo");
  deepspeed  deepspeed.comm.inference_all_reduce (DeepSpeed's shm all-reduce
             for CPU, its op JIT-built on first use) over a Gloo group, all_reduce
             only; run with the peers' scratch venv python (bench/peers/install.sh);
  fake       torch's own no-op backend (FakeProcessGroup, FakeStore: every
             rank alone, nothing moves): torch.distributed's per-op cost with
             a backend that does nothing, the floor under any backend's
             torch.distributed figure.
This is the per-op timer bench/peers/run.py uses for these three; run it alone
to compare one change (e.g. `--lib tpu_dist --world 2 --ops all_reduce`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

LIB_KEYS = {"tpu_dist": "tpu_dist_torch", "gloo": "gloo_torch", "deepspeed": "deepspeed_shm",
            "fake": "torch_floor"}


def iterations(nbytes: int, max_iters: int) -> int:
    n = (512 << 20) // max(nbytes, 1)
    return max(min(5, max_iters), min(n, max_iters))


def case_bytes(op: str, size: int, world: int) -> int:
    if op in ("all_reduce", "broadcast"):
        return max(4, size // 4 * 4)
    unit = world * 4
    return max(unit, size // unit * unit)


def _rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=args.op_timeout)
    lib = args.lib
    out = {"lib": LIB_KEYS[lib]}
    if lib == "tpu_dist":
        import tpu_dist  # noqa: F401  (registers the backend)

        dist.init_process_group("tpu_dist", timeout=timeout)
    elif lib == "gloo":
        dist.init_process_group("gloo", timeout=timeout)
    elif lib == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world,
                                timeout=timeout)
    else:
        import deepspeed
        import deepspeed.comm as dscomm

        deepspeed.init_distributed(dist_backend="gloo", timeout=timeout)
        shm = hasattr(torch.ops, "deepspeed") and hasattr(torch.ops.deepspeed,
                                                          "inference_all_reduce_")
        out["library_version"] = f"deepspeed {deepspeed.__version__}, shm op {'built' if shm else 'MISSING'}"
        if not shm:
            raise SystemExit("deepspeed: the shm inference_all_reduce op did not build/load")
    if rank == 0:
        print(json.dumps({**out, "library_version": out.get(
            "library_version", f"torch {torch.__version__}")}), flush=True)
    for op in args.ops.split(","):
        if lib == "deepspeed" and op != "all_reduce":
            continue
        for size in (int(s) for s in args.sizes.split(",")):
            nbytes = case_bytes(op, size, world)
            numel = nbytes // 4
            buf = torch.ones(numel)
            if op == "all_reduce":
                if lib == "deepspeed":
                    fn = lambda: dscomm.inference_all_reduce(buf)  # noqa: E731
                else:
                    fn = lambda: dist.all_reduce(buf)  # noqa: E731
            elif op == "reduce_scatter":
                small = torch.empty(numel // world)
                fn = lambda: dist.reduce_scatter_tensor(small, buf)  # noqa: E731
            elif op == "all_gather":
                small = torch.ones(numel // world)
                fn = lambda: dist.all_gather_into_tensor(buf, small)  # noqa: E731
            elif op == "broadcast":
                fn = lambda: dist.broadcast(buf, src=0)  # noqa: E731
            elif op == "all_to_all":
                recv = torch.empty(numel)
                fn = lambda: dist.all_to_all_single(recv, buf)  # noqa: E731
            else:
                raise SystemExit(f"unknown op {op}")
            n = iterations(nbytes, args.max_iters)
            times = []
            dist.barrier()
            fn()
            dist.barrier()
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            if rank == 0:
                print(json.dumps({"lib": out["lib"], "op": op, "world": world, "bytes": nbytes,
                                  "time_us": round(statistics.median(times) * 1e6, 4),
                                  "iters": n}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _launch(args: argparse.Namespace) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(args.world), LOCAL_RANK=str(r), LOCAL_SIZE=str(args.world),
                   LOCAL_WORLD_SIZE=str(args.world), OMP_NUM_THREADS="1")
        if args.lib == "deepspeed":
            env.setdefault("DS_ACCELERATOR", "cpu")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--rank-process"] + sys.argv[1:],
            env=env, stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, text=True))
    def forward() -> None:  # rank 0's JSON lines, as they come
        for line in procs[0].stdout:
            if line.startswith("{"):
                print(line, end="", flush=True)

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    deadline = time.monotonic() + args.timeout
    rc = 0
    try:
        # Until every rank is done, one fails (the others would wait for it
        # until the op timeout) or the deadline passes.
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
            if failed:
                print(f"torch_peers: {args.lib} world {args.world}: a rank exited {failed[0]}",
                      file=sys.stderr)
                rc = failed[0]
                break
            if time.monotonic() > deadline:
                print(f"torch_peers: {args.lib} world {args.world}: over {args.timeout}s",
                      file=sys.stderr)
                rc = 124
                break
            time.sleep(0.05)
        rc = rc or next((p.returncode for p in procs if p.returncode), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        reader.join(timeout=5)
    return rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", choices=sorted(LIB_KEYS), required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather,broadcast,all_to_all")
    p.add_argument("--sizes", default="8,4096,65536,1048576,16777216")
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--timeout", type=float, default=1200, help="seconds for the whole run")
    p.add_argument("--op-timeout", type=float, default=300, help="the group's op timeout")
    p.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_process:
        _rank(args)
        return 0
    return _launch(args)


if __name__ == "__main__":
    sys.exit(main())
