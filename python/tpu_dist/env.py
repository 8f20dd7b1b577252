"""Rank discovery (the C++ RankInfo) and the torchrun variables it implies.

The Python side's one reader of the TPU host's variables (TPU_*): the C++
discovery (tpu_runtime/env_discovery.h, through `rank_info()`) reads them for
every process that can load tpu_dist._C; `tpu_host_place()` reads the host's
place for one that cannot (the Ray actor that starts a rank stays without
torch). tools/check_layers.py refuses TPU_* reads anywhere else.
"""

from __future__ import annotations

import os
from typing import List, Mapping, Optional, Tuple

from tpu_dist import _C

RankInfo = _C.RankInfo

# What a TPU host's launcher (KubeRay webhook, TorchTPU) sets.
_TPU_VARS = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TORCH_TPU_TOPOLOGY",
             "TORCH_TPU_SLICEBUILDER_ADDRESSES")


def rank_info() -> RankInfo:
    """This process's place in the job, from the environment: a RankInfo
    (the C++ tpu_runtime::RankInfo, read-only).

    Properties (also readable as info["name"]): rank, world_size, local_rank,
    local_world_size, host_index, num_hosts, slice_index, num_slices,
    megascale_coordinator, master_addr, master_port, hostnames (this
    slice's), slicebuilder_addresses, accelerator_type, chip_topology,
    devices_per_host, source, restart_count, job_id, summary; and
    devices_per_slice, rank_in_slice, host_in_slice, hostname. Raises
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


def tpu_host_place(environ: Optional[Mapping[str, str]] = None) -> Tuple[int, List[str]]:
    """This TPU host's index in its slice and the slice's host list, read as
    discovery reads them: TPU_WORKER_ID (default 0) and TPU_WORKER_HOSTNAMES
    (comma-separated; default empty). Torch-free and self-contained (only
    `os`), so that the Ray launcher can ship it by value to an actor that
    never imports torch. `environ` defaults to os.environ.

    Raises ValueError naming the variable: an id that is not an integer >= 0,
    an empty host entry, or an id past the end of a non-empty host list.
    """
    env = os.environ if environ is None else environ
    raw_hosts = env.get("TPU_WORKER_HOSTNAMES", "")
    hosts = [h.strip() for h in raw_hosts.split(",")] if raw_hosts.strip() else []
    if any(not h for h in hosts):
        raise ValueError(f'TPU_WORKER_HOSTNAMES="{raw_hosts}": expected a comma-separated list '
                         "without empty entries")
    raw_id = env.get("TPU_WORKER_ID", "").strip()
    if not raw_id:
        return 0, hosts
    if not raw_id.isdigit():
        raise ValueError(f'TPU_WORKER_ID="{raw_id}": expected an integer >= 0')
    index = int(raw_id)
    if hosts and index >= len(hosts):
        raise ValueError(f'TPU_WORKER_ID="{raw_id}": expected 0..{len(hosts) - 1}, an index '
                         f"into the {len(hosts)} entries of TPU_WORKER_HOSTNAMES")
    return index, hosts


def tpu_slice_name(environ: Optional[Mapping[str, str]] = None) -> str:
    """The name of this TPU host's slice: TPU_NAME (the KubeRay webhook sets
    it per worker-group replica, i.e. per slice; GKE per node pool), stripped,
    or "" when unset. Torch-free and self-contained like tpu_host_place: the
    Ray launcher groups its rank actors into slices by it."""
    env = os.environ if environ is None else environ
    return env.get("TPU_NAME", "").strip()


def host_placement_without_rank_info(
        environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, str]]:
    """The host id and this host's name for a group when discovery finds no
    RankInfo but the TPU host's variables are there (Ray Train numbers its
    workers without regard to hosts, which discovery refuses as a RANK that
    disagrees with TPU_WORKER_ID): ("slice_host_<global host index>", this
    host's TPU_WORKER_HOSTNAMES entry or ""), by tpu_host_place. The global
    index is MEGASCALE_SLICE_ID x hosts per slice + TPU_WORKER_ID, as
    discovery numbers hosts slice-major, so that hosts of two slices (each
    with a TPU_WORKER_ID 0) never share an id; without a host list a slice
    > 0 gives "slice_<s>_host_<id>". None without TPU_WORKER_ID. ValueError
    naming a malformed variable.
    """
    env = os.environ if environ is None else environ
    if not env.get("TPU_WORKER_ID", "").strip():
        return None
    index, hosts = tpu_host_place(env)
    raw_slice = env.get("MEGASCALE_SLICE_ID", "").strip()
    if raw_slice and not raw_slice.isdigit():
        raise ValueError(f'MEGASCALE_SLICE_ID="{raw_slice}": expected an integer >= 0')
    slice_id = int(raw_slice) if raw_slice else 0
    name = hosts[index] if index < len(hosts) else ""
    if slice_id == 0:
        return f"slice_host_{index}", name
    if hosts:
        return f"slice_host_{slice_id * len(hosts) + index}", name
    return f"slice_{slice_id}_host_{index}", name


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
