"""`import tpu_dist` makes "tpu_dist" a torch.distributed backend.

    import tpu_dist
    import torch.distributed as dist
    dist.init_process_group("tpu_dist")          # env:// (torchrun, Ray Train)

The backend is the project's C++ ProcessGroupTpuDist (a c10d Backend): shared
memory between the ranks of one host, TCP between hosts. Host placement comes
from the same discovery as in C++ (`rank_info()`). On a TPU host whose
launcher sets only the KubeRay webhook / TorchTPU variables (no RANK /
WORLD_SIZE), importing this package fills in the torchrun variables from them
so that env:// works unchanged (see `tpu_dist.env`).

The compiled part, `tpu_dist._C`, is built by the project's CMake
(tools/build.sh) next to this file.
"""

from __future__ import annotations

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
from tpu_dist.env import fill_torchrun_env_from_tpu, rank_info

__all__ = ["BACKEND_NAME", "ProcessGroupTpuDist", "rank_info", "create_backend"]

ProcessGroupTpuDist = _C.ProcessGroupTpuDist


def _register() -> None:
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, create_backend, extended_api=True, devices=["cpu"]
    )


_register()
fill_torchrun_env_from_tpu()
