"""The Python tests' one helper module: ranks, free ports, the test model.

run_ranks runs a function on N ranks as spawned processes (the way torchrun
would).

Each rank gets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT for env://, a
fresh free port per run, one intra-op thread, and a deadline: a rank still
running at the deadline is killed and the run fails naming it. Results come
back through a queue, one per rank. free_port() picks a free TCP port;
thread_names() lists this process's threads; FeedForward is the seed's
tensor-parallel check model. Tests import it as `ranks` (conftest.py puts
this folder on sys.path, also for spawned ranks).
"""

from __future__ import annotations

import os
import queue
import socket
import traceback
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch import nn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def thread_names(prefix: str = "") -> list[str]:
    """Names (comm) of this process's threads that start with `prefix`."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # the thread left meanwhile
    return [n for n in names if n.startswith(prefix)]

def _entry(fn: Callable[..., Any], rank: int, world: int, port: int,
           env: dict[str, str], torchrun_env: bool, results: Any,
           args: tuple[Any, ...]) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(key, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torchrun_env:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update({k: v.format(rank=rank) for k, v in env.items()})
    import torch
    torch.set_num_threads(1)
    try:
        results.put((rank, True, fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world: int, *args: Any,
              timeout_s: float = 180.0, env: dict[str, str] | None = None,
              torchrun_env: bool = True) -> list[Any]:
    """fn(rank, world, *args) on `world` processes; returns results by rank.

    fn must be importable (module level). `env` values may use "{rank}".
    With torchrun_env=False the ranks get no RANK / WORLD_SIZE / LOCAL_RANK.
    Raises AssertionError with the failing rank's traceback, or naming ranks
    that did not finish in time.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry,
                         args=(fn, r, world, port, dict(env or {}), torchrun_env, results, args))
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            try:
                rank, ok, value = results.get(timeout=timeout_s)
            except queue.Empty:
                break
            if ok:
                got[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    assert not errors, "\n".join(errors)
    missing = sorted(set(range(world)) - set(got))
    assert not missing, f"ranks {missing} did not finish within {timeout_s} s"
    return [got[r] for r in range(world)]


class FeedForward(nn.Module):
    """The seed's TP check model: x + w2(silu(w1(x)))."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, 4 * hidden, bias=False)
        self.w2 = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, hidden]
        return x + self.w2(nn.functional.silu(self.w1(x)))
