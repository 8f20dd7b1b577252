"""The creator torch.distributed calls to make a tpu_dist backend for a group."""

from __future__ import annotations

import datetime
import os
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from tpu_dist import _C
from tpu_dist.env import host_placement_without_rank_info, rank_info_or_none

BACKEND_NAME = "tpu_dist"

# "1": torch's FlightRecorderHook records this group's ops too (see
# _choose_torch_flight_recorder_hook).
TORCH_FR_HOOK_ENV = "TPU_DIST_TORCH_FR_HOOK"

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


def _choose_torch_flight_recorder_hook() -> None:
    """Decides whether torch attaches its FlightRecorderHook to the group being created.

    torch 2.15 attaches the hook to every group whose backends are not listed
    in distributed_c10d._FR_SELF_RECORDING_BACKENDS (read right after this
    creator returns). tpu_dist records every op in a flight recorder of its own
    (tpu_dist.dump_flight_recorder, dumps on failure, torch's format), so by
    default it is listed: the hook would record each op a second time, and
    its pre-hook (an entry with a Python stack captured per op) was the largest
    single cost of a small dist.all_reduce (bench/README.md, "--layers").
    TPU_DIST_TORCH_FR_HOOK=1 when the group is created keeps torch's hook, for
    torch's own dump functions (_dump_fr_trace(backend="tpu_dist")).
    """
    listed = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if not isinstance(listed, set):  # a torch without the hook
        return
    if os.environ.get(TORCH_FR_HOOK_ENV, "0") == "1":
        listed.discard(BACKEND_NAME)
    else:
        listed.add(BACKEND_NAME)


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
    C++ binary. torch's FlightRecorderHook is left off the group unless
    TPU_DIST_TORCH_FR_HOOK=1 (see _choose_torch_flight_recorder_hook).
    """
    if backend_options is not None and not isinstance(backend_options,
                                                      _C.ProcessGroupTpuDist.Options):
        raise TypeError("tpu_dist: pg_options must be a tpu_dist.ProcessGroupTpuDist.Options, "
                        f"got {type(backend_options).__name__}")
    timeout = dist_backend_opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    timeout = _group_timeout(timeout)
    _choose_torch_flight_recorder_hook()
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
