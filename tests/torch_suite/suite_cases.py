"""PyTorch's own distributed test class, built for one backend.

This module is what `test/distributed/test_distributed_spawn.py` is in the
PyTorch repository (that file is not in the wheel): it defines
`TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase)`
from `torch.testing._internal.distributed.distributed_test`, whose setUp
starts WORLD_SIZE rank processes for every test. It is imported by the
runner's phase process and, through pickling of
`TestDistBackendWithSpawn._run`, by every rank, so all configuration comes
from the environment and is applied at import time, before
`distributed_test` is imported: that module reads BACKEND, WORLD_SIZE and
INIT_METHOD when it is imported, and most of its skip decorators are
evaluated then.

Environment (run_suite.py sets it):

- TPU_DIST_SUITE_BACKEND: the backend the process groups are created with
  ("gloo", "tpu_dist", ...). A name that is not built into torch is imported
  as a Python module first (TPU_DIST_SUITE_BACKEND_MODULE overrides the
  module name); importing it must register the backend with
  `torch.distributed.Backend.register_backend`.
- TPU_DIST_SUITE_GATES: "native" (default) or "gloo". "native" sets
  BACKEND=<backend>, so the suite's own checks decide what runs for that name;
  a third-party name is added to the suite's feature sets
  (`DistTestCases.backend_feature` "plugin", "ddp", "subgroup", "gpu"), which
  is how the suite accepts a plugin backend. "gloo" sets BACKEND=gloo, so
  every check in the suite (import-time skips, runtime `BACKEND == "gloo"`
  branches, os.environ["BACKEND"]) takes Gloo's path, and only
  `torch.distributed.init_process_group(backend="gloo")` is redirected to the
  backend under test: Gloo's test plan, run on the other backend. It reaches
  the tests the suite gates on the literal name "gloo" (timeouts,
  monitored_barrier, batch_isend_irecv on CPU, coalesced all_reduce,
  scatter_object_list, get_future, ...). Groups a test creates with an
  explicit backend="gloo" stay Gloo.
- TPU_DIST_SUITE_START: "spawn" (default; exactly the suite's
  `_spawn_processes`) or "forkserver": ranks are forked from a server
  process that has imported this module once, instead of each rank importing
  torch and the suite (~5 s of CPU per rank on the 2-core CI machine). Each
  rank still is a fresh process that has not touched torch.distributed; it
  gets the parent's environment at the time the test starts.
- WORLD_SIZE: ranks per test (2 or 3 here).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any

ENV_BACKEND = "TPU_DIST_SUITE_BACKEND"
ENV_BACKEND_MODULE = "TPU_DIST_SUITE_BACKEND_MODULE"
ENV_GATES = "TPU_DIST_SUITE_GATES"
ENV_START = "TPU_DIST_SUITE_START"

# Backends torch.distributed knows without a plugin.
BUILTIN_BACKENDS = frozenset({"gloo", "nccl", "mpi", "ucc", "xccl"})
# DistTestCases.backend_feature sets a plugin backend joins (native gates).
PLUGIN_FEATURES = ("plugin", "ddp", "subgroup", "gpu")
GATES = ("native", "gloo")
START_METHODS = ("spawn", "forkserver")

_SHIMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shims")


class BackendImportError(ImportError):
    """The Python module that registers the backend could not be imported."""


def _ensure_expecttest() -> None:
    """torch.testing._internal.common_utils needs `expecttest`; shim it if absent."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        sys.path.insert(0, _SHIMS)


def import_backend(backend: str, module: str | None = None) -> None:
    """Imports the module that registers `backend` (nothing for built-in ones).

    Raises BackendImportError with a message that says what to build.
    """
    if backend in BUILTIN_BACKENDS:
        return
    name = module or backend
    import torch.distributed as dist

    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any failure means "not usable"
        raise BackendImportError(
            f"backend {backend!r}: `import {name}` failed ({type(e).__name__}: {e}). "
            f"The {name} Python package must be built and importable by "
            f"{sys.executable} and register the backend on import (for tpu_dist: "
            "tools/build.sh builds python/tpu_dist/_C*.so and tools/install_deps.sh "
            "installs python/ into the venv)."
        ) from e
    if backend not in dist.Backend.backend_list:
        raise BackendImportError(
            f"backend {backend!r}: `import {name}` succeeded but did not call "
            f"torch.distributed.Backend.register_backend({backend!r}, ...); "
            f"registered backends: {dist.Backend.backend_list}"
        )


def _env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default)
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {choices}")
    return value


REAL_BACKEND: str = os.environ.get(ENV_BACKEND, "gloo")
GATE_MODE: str = _env_choice(ENV_GATES, "native", GATES)
START_METHOD: str = _env_choice(ENV_START, "spawn", START_METHODS)
SUITE_BACKEND: str = "gloo" if GATE_MODE == "gloo" else REAL_BACKEND

os.environ["BACKEND"] = SUITE_BACKEND
os.environ.setdefault("WORLD_SIZE", "2")
_ensure_expecttest()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing  # noqa: E402

import_backend(REAL_BACKEND, os.environ.get(ENV_BACKEND_MODULE) or None)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if SUITE_BACKEND not in BUILTIN_BACKENDS:
    for _feature in PLUGIN_FEATURES:
        DistTestCases.backend_feature[_feature].add(SUITE_BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if SUITE_BACKEND != REAL_BACKEND:
    _init_process_group = dist.init_process_group

    def _init_process_group_redirected(*args: Any, **kwargs: Any) -> None:
        """init_process_group with the suite's backend name replaced."""
        if kwargs.get("backend") == SUITE_BACKEND:
            kwargs["backend"] = REAL_BACKEND
        elif args and args[0] == SUITE_BACKEND:
            args = (REAL_BACKEND, *args[1:])
        return _init_process_group(*args, **kwargs)

    dist.init_process_group = _init_process_group_redirected

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As in test_distributed_spawn.py: setUp starts WORLD_SIZE ranks."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def _spawn_processes(self) -> None:
        if START_METHOD == "spawn":
            super()._spawn_processes()
            return
        self._start_processes(torch.multiprocessing.get_context("forkserver").Process)

    def _start_processes(self, proc: Any) -> None:
        if START_METHOD == "spawn":
            super()._start_processes(proc)
            return
        # MultiProcessTestCase._start_processes, plus the parent's environment
        # (setUp just set TEMP_DIR and INIT_METHOD for this test).
        self.processes = []
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = torch.multiprocessing.Pipe()
            process = proc(
                target=self.__class__._run,
                name=f"process {rank}",
                args=(rank, self._current_test_name(), self.file_name, child_conn),
                kwargs={"suite_env": dict(os.environ)},
            )
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any,
             suite_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        if suite_env is not None:
            os.environ.clear()
            os.environ.update(suite_env)
        super()._run(rank, test_name, file_name, pipe, **kwargs)


def start_forkserver() -> None:
    """Starts the forkserver now, preloaded with this module (forkserver mode).

    Started before the first test so that it imports this module with the
    runner's environment, not with the first test's TEMP_DIR / INIT_METHOD.
    """
    if START_METHOD != "forkserver":
        return
    import multiprocessing.forkserver

    ctx = torch.multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    multiprocessing.forkserver.ensure_running()


def versions() -> dict[str, Any]:
    """torch's version, and which build of the backend module was imported."""
    out: dict[str, Any] = {"torch": torch.__version__}
    if REAL_BACKEND not in BUILTIN_BACKENDS:
        module = sys.modules.get(os.environ.get(ENV_BACKEND_MODULE) or REAL_BACKEND)
        path = getattr(module, "__file__", None)
        if path:
            folder = os.path.dirname(path)
            out["backend_module"] = path
            out["backend_binaries"] = {
                f: time.strftime("%Y-%m-%dT%H:%M:%S",
                                 time.localtime(os.path.getmtime(os.path.join(folder, f))))
                for f in sorted(os.listdir(folder)) if f.endswith(".so")}
    return out


def test_names() -> list[str]:
    """Every test method of the suite class, sorted."""
    return sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))


def static_skip_reason(name: str) -> str | None:
    """The reason of an import-time skip decorator on `name`, else None."""
    fn = getattr(TestDistBackendWithSpawn, name)
    if getattr(fn, "__unittest_skip__", False):
        return str(getattr(fn, "__unittest_skip_why__", "skipped"))
    return None
