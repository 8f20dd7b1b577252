"""The creator torch.distributed calls to make a tpu_dist backend for a group."""

from __future__ import annotations

import datetime
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from tpu_dist import _C
from tpu_dist.env import host_placement_without_rank_info, rank_info_or_none

BACKEND_NAME = "tpu_dist"

# The timeout of this process's default tpu_dist group (init_process_group's);
# None while there is none.
_world_timeout: datetime.timedelta | None = None


def _group_timeout(timeout: datetime.timedelta) -> datetime.timedelta:
    """The timeout a new group gets: init_process_group's for the default group
    (remembered), and for a later group created without one (new_group,
    new_subgroups, DeviceMesh's dimensions: torch hands those its 30-minute
    default_pg_timeout) the default group's -- the one in force, after any
    dist.set_timeout -- so that the timeout the user set bounds every tpu_dist
    wait. A later group's own timeout is kept."""
    global _world_timeout
    if not dist.is_initialized():  # init_process_group is creating the default group
        _world_timeout = timeout
        return timeout
    unset = timeout == default_pg_timeout
    if unset and _world_timeout is not None and BACKEND_NAME in str(dist.get_backend()):
        try:
            world = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            return world.options._timeout
        except (RuntimeError, AttributeError):  # not ours after all
            return _world_timeout
    return timeout


def _options_from_host_place() -> Optional[_C.ProcessGroupTpuDist.Options]:
    """Without a RankInfo (Ray Train's workers: see
    env.host_placement_without_rank_info), the options a group would get,
    placed on the TPU host that tpu_dist.env reads (TPU_DIST_HOST_ID still
    wins); None off a TPU host."""
    place = host_placement_without_rank_info()
    if place is None:
        return None
    options = _C.ProcessGroupTpuDist.Options()
    if not options.host_id:
        options.host_id = place[0]
    if not options.worker_hostname:
        options.worker_hostname = place[1]
    return options


def create_backend(dist_backend_opts: Any, backend_options: Any) -> _C.ProcessGroupTpuDist:
    """torch.distributed's extended-API creator for "tpu_dist".

    dist_backend_opts carries the group's (prefixed) store, this rank in the
    group, the group size, the timeout and the group id; backend_options is
    whatever the caller passed as pg_options: a `ProcessGroupTpuDist.Options`
    gives the group its knobs (the timeout and group name are still
    dist_backend_opts'), anything else but None is a TypeError. A group
    created without a timeout of its own gets the default group's (see
    _group_timeout). Without pg_options, host id, job id and this host's name
    come from this process's RankInfo (`tpu_dist.rank_info()`, passed whole),
    and bind address, job secret and the TPU_DIST_* knobs from the
    environment, by the C++ rule (distributed/group_config.h), as for every
    C++ binary.
    """
    if backend_options is not None and not isinstance(backend_options,
                                                      _C.ProcessGroupTpuDist.Options):
        raise TypeError("tpu_dist: pg_options must be a tpu_dist.ProcessGroupTpuDist.Options, "
                        f"got {type(backend_options).__name__}")
    timeout = dist_backend_opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    timeout = _group_timeout(timeout)
    group_id = str(dist_backend_opts.group_id) or "default"
    # This process's RankInfo, discovered once here: the group takes its host
    # placement and job id from it and reads no TPU_* variable again.
    info = rank_info_or_none()
    if info is None and backend_options is None:
        backend_options = _options_from_host_place()
    return _C.ProcessGroupTpuDist(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        timeout,
        group_name=f"py_{group_id}",
        options=backend_options,
        info=info,
        # The flight recorder's dumps name the group's members by global rank.
        global_ranks=list(getattr(dist_backend_opts, "global_ranks_in_group", None) or []),
    )
