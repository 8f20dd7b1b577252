"""`import tpu_dist` makes "tpu_dist" a torch.distributed backend.

    import tpu_dist
    import torch.distributed as dist
    dist.init_process_group("tpu_dist")          # env:// (torchrun, Ray Train)

The backend is the project's C++ ProcessGroupTpuDist (a c10d Backend): shared
memory between the ranks of one host, TCP between hosts. Host placement comes
from the same discovery as in C++ (`rank_info()`, a `RankInfo` that each group
is given whole). On a TPU host whose
launcher sets only the KubeRay webhook / TorchTPU variables (no RANK /
WORLD_SIZE), importing this package fills in the torchrun variables from them
so that env:// works unchanged (see `tpu_dist.env`).

The compiled part, `tpu_dist._C`, is built by the project's CMake
(tools/build.sh) next to this file.
"""

from __future__ import annotations

import atexit
import sys

import torch  # noqa: F401  (registers the c10d base types _C derives from)
import torch.distributed as dist

try:
    from tpu_dist import _C
except ImportError as e:  # pragma: no cover - exercised by hand
    raise ImportError(
        "tpu_dist._C is not built: run tools/build.sh (it builds the extension "
        f"into {__path__[0]}): {e}"
    ) from e

from tpu_dist.backend import BACKEND_NAME, create_backend
from tpu_dist.env import RankInfo, fill_torchrun_env_from_tpu, rank_info

__all__ = ["BACKEND_NAME", "ProcessGroupTpuDist", "RankInfo", "rank_info", "create_backend",
           "dump_flight_recorder"]

ProcessGroupTpuDist = _C.ProcessGroupTpuDist


def dump_flight_recorder(prefix: str = "") -> list[str]:
    """Writes the flight recorder of every live tpu_dist group of this process
    (the last TPU_DIST_FLIGHT_RECORDER_SIZE ops of each, default 2000) to
    `<prefix><global rank>`, in the format torch's analyzer reads
    (`python -m torch.distributed.flight_recorder.fr_trace <dir>`), and returns
    the paths. prefix "": the configured location
    (TPU_DIST_FLIGHT_RECORDER_DIR/tpu_dist_fr_rank_, else TORCH_FR_DUMP_TEMP_FILE);
    RuntimeError if there is none. See docs/fault_tolerance.md."""
    return _C.dump_flight_recorder(prefix)


def _register() -> None:
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, create_backend, extended_api=True, devices=["cpu"]
    )


def _tpu_dist_backends_of_torch_groups() -> list:
    backends = []
    try:
        groups = list(dist.distributed_c10d._world.pg_map.keys())
    except AttributeError:  # a torch without the map: _C's own list only
        return backends
    for pg in groups:
        try:
            backend = pg._get_backend(torch.device("cpu"))
        except (RuntimeError, AttributeError):
            continue
        if isinstance(backend, _C.ProcessGroupTpuDist):
            backends.append(backend)
    return backends


def _stop_group_threads_at_exit() -> None:
    """atexit: stops every live group's op threads while the interpreter is
    still whole. A rank that exits without destroy_process_group (say after a
    collective error) would otherwise finalize with a group thread about to
    free a tensor: that takes the GIL, Python ends the thread with
    pthread_exit during finalization, and the unwinding aborts the process
    (SIGABRT, "terminate called without an active exception") instead of
    exiting with the rank's own code. Ops still queued run first (each
    bounded by the group timeout); pending recvs are cancelled. The groups:
    those _C made, and those torch's group map holds (split_group's, made in
    C++ from ours)."""
    not_stopped = _C._stop_all_group_threads(_tpu_dist_backends_of_torch_groups())
    if not_stopped:
        print(f"tpu_dist: at exit, the threads of {not_stopped} process group(s) did not stop "
              "within the group timeout; the process may abort", file=sys.stderr, flush=True)


_register()
fill_torchrun_env_from_tpu()
atexit.register(_stop_group_threads_at_exit)
