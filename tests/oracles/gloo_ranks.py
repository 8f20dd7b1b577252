"""Runs a function on `world` Gloo ranks, one spawned process each, for the oracle generators.

Each rank joins through a FileStore in a fresh temporary directory (no TCP port to pick and then
lose to another process before rank 0 binds it: ctest runs other tests beside the generators), runs
``fn(rank, world, *args)`` with one intra-op thread, destroys the group, and leaves with
``os._exit(0)`` instead of through interpreter finalization. That is the fix for SIGABRT at a rank's
exit ("terminate called without an active exception", one run in five under ``ctest -L unit -j2``):
``destroy_process_group`` does not stop Gloo's threads here (FSDP2's DeviceMesh keeps the group:
after it, and after gc, two ``pt_gloo_runloop`` threads, ``gloo_tcp_loop`` and rank 0's
``pt_tcpstore_uv`` still run), and a C++ thread that frees a tensor takes the GIL; one that waits
for it as the interpreter starts to finalize is ended by ``pthread_exit``, whose unwinding through
a C++ destructor calls ``std::terminate``. A rank's results are on disk by then (the callers write
them before returning); a rank that raises exits non-zero through ``mp.spawn`` as before.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, fn: Callable[..., None], world: int, store_dir: str, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=world)
    fn(rank, world, *args)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # see the module docstring


def spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    """fn(rank, world, *args) on `world` Gloo ranks; raises if a rank fails (torch's mp.spawn)."""
    with tempfile.TemporaryDirectory(prefix="gloo_ranks_") as store_dir:
        mp.spawn(_rank, args=(fn, world, store_dir, args), nprocs=world, join=True)
