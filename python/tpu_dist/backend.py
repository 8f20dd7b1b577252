"""The creator torch.distributed calls to make a tpu_dist backend for a group."""

from __future__ import annotations

import datetime
import os
from typing import Any

from tpu_dist import _C

BACKEND_NAME = "tpu_dist"


def _host_id() -> str:
    """Ranks with equal host ids share memory; "" lets C++ decide.

    TPU_DIST_HOST_ID wins (emulated hosts); on a TPU slice the host's index
    (TPU_WORKER_ID) names the host, as the C++ trainers do; otherwise the
    machine's hostname and boot id (C++ default).
    """
    if os.environ.get("TPU_DIST_HOST_ID"):
        return ""
    worker_id = os.environ.get("TPU_WORKER_ID", "")
    if worker_id.isdigit():
        return f"slice_host_{worker_id}"
    return ""


def create_backend(dist_backend_opts: Any, backend_options: Any) -> _C.ProcessGroupTpuDist:
    """torch.distributed's extended-API creator for "tpu_dist".

    dist_backend_opts carries the group's (prefixed) store, this rank in the
    group, the group size, the timeout and the group id; backend_options is
    whatever the caller passed as pg_options (unused).
    """
    timeout = dist_backend_opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    group_id = str(dist_backend_opts.group_id) or "default"
    return _C.ProcessGroupTpuDist(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        timeout,
        group_name=f"py_{group_id}",
        host_id=_host_id(),
    )
