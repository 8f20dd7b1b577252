"""The creator torch.distributed calls to make a tpu_dist backend for a group."""

from __future__ import annotations

import datetime
from typing import Any

from tpu_dist import _C

BACKEND_NAME = "tpu_dist"


def create_backend(dist_backend_opts: Any, backend_options: Any) -> _C.ProcessGroupTpuDist:
    """torch.distributed's extended-API creator for "tpu_dist".

    dist_backend_opts carries the group's (prefixed) store, this rank in the
    group, the group size, the timeout and the group id; backend_options is
    whatever the caller passed as pg_options (unused). Host id, job id, bind
    address and job secret come from the environment by the C++ rule
    (distributed/group_config.h), as for every C++ binary.
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
    )
