"""Rank discovery (the C++ RankInfo) and the torchrun variables it implies."""

from __future__ import annotations

import os
from typing import Optional

from tpu_dist import _C

RankInfo = _C.RankInfo

# What a TPU host's launcher (KubeRay webhook, TorchTPU) sets.
_TPU_VARS = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TORCH_TPU_TOPOLOGY",
             "TORCH_TPU_SLICEBUILDER_ADDRESSES")


def rank_info() -> RankInfo:
    """This process's place in the job, from the environment: a RankInfo
    (the C++ tpu_runtime::RankInfo, read-only).

    Properties (also readable as info["name"]): rank, world_size, local_rank,
    local_world_size, host_index, num_hosts, master_addr, master_port,
    hostnames, slicebuilder_addresses, accelerator_type, chip_topology,
    devices_per_host, source, restart_count, job_id, summary. Raises
    ValueError naming the variable on bad input.
    """
    return _C.rank_info()


def rank_info_or_none() -> Optional[RankInfo]:
    """rank_info(), or None when discovery fails (the group then resolves
    its placement from the environment itself, and names a bad variable)."""
    try:
        return _C.rank_info()
    except ValueError:
        return None


def fill_torchrun_env_from_tpu() -> bool:
    """Sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT from the TPU variables when RANK or WORLD_SIZE is absent and
    a TPU host's variables are present, so `init_process_group` with env://
    works from the TPU environment alone. Variables already set are kept.
    Returns whether anything was set.
    """
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return False
    if not any(v in os.environ for v in _TPU_VARS):
        return False
    info = rank_info()
    values = {
        "RANK": info.rank,
        "WORLD_SIZE": info.world_size,
        "LOCAL_RANK": info.local_rank,
        "LOCAL_WORLD_SIZE": info.local_world_size,
        "MASTER_ADDR": info.master_addr,
        "MASTER_PORT": info.master_port,
    }
    for key, value in values.items():
        os.environ.setdefault(key, str(value))
    return True
