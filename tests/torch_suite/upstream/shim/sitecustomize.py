"""Makes PyTorch's own test files run over tpu_dist where they ask for Gloo.

Loaded by every Python process that tests/torch_suite/upstream_files.py
starts for a file of PyTorch's test/distributed (this folder is put first on
PYTHONPATH): the pytest process and every rank that torch's
MultiProcessTestCase spawns. It does nothing unless
TPU_DIST_UPSTREAM_BACKEND=tpu_dist; then it imports tpu_dist (which registers
the backend) and wraps torch.distributed's group constructors so that a
backend of "gloo" -- as a name, `Backend.GLOO`, a "cpu:gloo,cuda:nccl"
device map, or no backend for the default group (torch's CPU default is
Gloo) -- becomes "tpu_dist". Everything else in the files is unchanged: their
skips and checks still see the names they passed, and groups they build as
`ProcessGroupGloo(...)` objects stay Gloo.

With TPU_DIST_UPSTREAM_START=forkserver (either backend) the ranks of
torch's MultiProcessTestCase are forked from a forkserver instead of spawned
(see _start_ranks_from_a_forkserver).
"""

from __future__ import annotations

import os

_BACKEND = os.environ.get("TPU_DIST_UPSTREAM_BACKEND", "gloo")


def _redirect(backend):
    """The backend argument with Gloo replaced by tpu_dist."""
    if backend is None:
        return "tpu_dist"
    text = str(backend)
    if text.lower() == "gloo":
        return "tpu_dist"
    if ":" in text:  # "cpu:gloo,cuda:nccl"
        parts = []
        for pair in text.split(","):
            device, _, name = pair.partition(":")
            parts.append(f"{device}:tpu_dist" if name.strip().lower() == "gloo" else pair)
        return ",".join(parts)
    return backend


def _log(line: str) -> None:
    """Appends to $TPU_DIST_UPSTREAM_LOG (the runner counts the redirected
    groups, so a file that never reached tpu_dist is noticed)."""
    path = os.environ.get("TPU_DIST_UPSTREAM_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {line}\n")


def _install() -> None:
    import functools
    import inspect

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import tpu_dist  # noqa: F401  (registers the backend)

    def wrap(name: str, default_is_gloo: bool):
        original = getattr(c10d, name)
        position = list(inspect.signature(original).parameters).index("backend")

        @functools.wraps(original)
        def redirected(*args, **kwargs):
            if len(args) > position:
                args = list(args)
                before = args[position]
                args[position] = after = _redirect(before)
            elif "backend" in kwargs and (kwargs["backend"] is not None or default_is_gloo):
                before = kwargs["backend"]
                kwargs["backend"] = after = _redirect(before)
            elif default_is_gloo:
                before, after = None, "tpu_dist"
                kwargs["backend"] = after
            else:
                before = after = None  # the default group's backend
            _log(f"{name} {before!r} -> {after!r}")
            return original(*args, **kwargs)

        redirected._tpu_dist_redirected = True  # noqa: SLF001
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                setattr(module, name, redirected)

    wrap("init_process_group", default_is_gloo=True)
    for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration"):
        wrap(name, default_is_gloo=False)


def _run_with_env(cls, env, rank, test_name, file_name, pipe, kwargs):
    """A rank forked from the forkserver: the parent's environment of the
    moment (setUp may have set MASTER_PORT, WORLD_SIZE, ...), then torch's
    MultiProcessTestCase._run."""
    os.environ.clear()
    os.environ.update(env)
    cls._run(rank, test_name, file_name, pipe, **kwargs)


def _start_ranks_from_a_forkserver() -> None:
    """MultiProcessTestCase starts each rank with spawn: every rank imports
    torch and the test file (~5 s of CPU each on 2 cores, 20-25 s per test
    at world 4). Fork them instead from a forkserver that imported torch,
    torch.distributed and (for tpu_dist) the backend once; each rank is still
    a fresh process that has not touched torch.distributed. Subclasses with
    their own _spawn_processes keep it."""
    import torch.multiprocessing as mp
    from torch.testing._internal.common_distributed import MultiProcessTestCase

    def _spawn_processes(self) -> None:
        ctx = mp.get_context("forkserver")
        self.processes = []
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = mp.Pipe()
            process = ctx.Process(
                target=_run_with_env, name=f"process {rank}",
                args=(self.__class__, dict(os.environ), rank, self._current_test_name(),
                      self.file_name, child_conn, {"fake_pg": getattr(self, "fake_pg", False)}))
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    MultiProcessTestCase._spawn_processes = _spawn_processes


if _BACKEND == "tpu_dist":
    _install()
if os.environ.get("TPU_DIST_UPSTREAM_START") == "forkserver":
    _start_ranks_from_a_forkserver()
