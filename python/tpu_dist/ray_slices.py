"""Slices for tpu_dist-ray-run --num-slices: which rank each Ray actor is,
the MEGASCALE_* Ray would give it, and the one-line descriptions of the
layout and of a lost slice. Pure functions over the actors' places (dicts
with worker_id, local_rank, tpu_name, hosts, ip: what each rank actor
reports about its node), so they are tested without a Ray cluster."""
from __future__ import annotations

from typing import Any, Dict, List


def assign_ranks(places: List[Dict[str, Any]], num_slices: int,
                 devices_per_host: int) -> List[int]:
    """Sets "rank" and "slice" on every place (in bundle order) and returns
    the bundle indices in rank order. One slice: rank = TPU_WORKER_ID x
    devices per host + LOCAL_RANK. Several: the actor's slice is its host's
    TPU_NAME ("tpu_name"), numbered in bundle order, and rank = slice x
    devices per slice + its rank in the slice. Raises RuntimeError, one line
    naming what disagrees: a slice without one actor per device, another
    number of slices than `num_slices`, ranks not 0..world - 1."""
    world = len(places)
    per_slice = world // num_slices
    for p in places:
        p["rank"] = p["worker_id"] * devices_per_host + p["local_rank"]
        p["slice"] = 0
    if num_slices > 1:
        names: List[str] = []
        for p in places:  # bundle order
            if p["tpu_name"] not in names:
                names.append(p["tpu_name"])
        if len(names) != num_slices:
            raise RuntimeError(f"the actors run on {len(names)} TPU slices (TPU_NAME "
                               f"{', '.join(repr(n) for n in names)}), expected --num-slices "
                               f"{num_slices}")
        for s, name in enumerate(names):
            mine = sorted(p["rank"] for p in places if p["tpu_name"] == name)
            if mine != list(range(per_slice)):
                raise RuntimeError(f"TPU_NAME={name!r}: the actors on this slice's hosts have "
                                   f"ranks {mine} in the slice, expected 0..{per_slice - 1} "
                                   "(one actor per device of the slice)")
        for p in places:
            p["slice"] = names.index(p["tpu_name"])
            p["rank"] += p["slice"] * per_slice
    order = sorted(range(world), key=lambda i: places[i]["rank"])
    ranks = [places[i]["rank"] for i in order]
    if ranks != list(range(world)):
        raise RuntimeError(f"the slice's devices give ranks {ranks}, not 0..{world - 1}")
    return order


def megascale_environments(places: List[Dict[str, Any]], num_slices: int,
                           port: int) -> List[Dict[str, str]]:
    """MEGASCALE_* of each rank (places in rank order, from assign_ranks), as
    Ray computes them (ray.util.tpu.get_tpu_coordinator_env_vars): the
    coordinator is slice 0's first host. Empty dicts for one slice."""
    if num_slices == 1:
        return [{} for _ in places]
    from ray.util.tpu import get_tpu_coordinator_env_vars

    coordinator = places[0]["hosts"][0]  # rank 0: slice 0, TPU_WORKER_ID 0
    return [get_tpu_coordinator_env_vars(coordinator_address=f"{coordinator}:{port}",
                                         num_slices=num_slices, slice_id=p["slice"],
                                         coordinator_port=str(port)) for p in places]


def _slice_text(places: List[Dict[str, Any]], s: int) -> str:
    """'slice 1 (TPU_NAME v6e-4-1, ranks 4-7, host 10.250.0.3)': places in rank order."""
    mine = [p for p in places if p["slice"] == s]
    hosts: List[str] = []
    for p in mine:
        if p["ip"] not in hosts:
            hosts.append(p["ip"])
    where = f"host {hosts[0]}" if len(hosts) == 1 else f"hosts {', '.join(hosts)}"
    name = f"TPU_NAME {mine[0]['tpu_name']}, " if mine[0].get("tpu_name") else ""
    return f"slice {s} ({name}ranks {mine[0]['rank']}-{mine[-1]['rank']}, {where})"


def slice_layout_line(places: List[Dict[str, Any]], num_slices: int,
                      megascale: List[Dict[str, str]]) -> str:
    """One line: every slice's TPU_NAME, ranks and hosts, and the MEGASCALE_*
    values common to all ranks (places and megascale in rank order)."""
    first = megascale[0]
    return (f"{num_slices} slices: "
            + "; ".join(_slice_text(places, s) for s in range(num_slices))
            + f"; MEGASCALE_COORDINATOR_ADDRESS={first['MEGASCALE_COORDINATOR_ADDRESS']} "
            f"MEGASCALE_PORT={first['MEGASCALE_PORT']} "
            f"MEGASCALE_NUM_SLICES={first['MEGASCALE_NUM_SLICES']}, MEGASCALE_SLICE_ID by rank "
            + ",".join(m["MEGASCALE_SLICE_ID"] for m in megascale))


def lost_slices(places: List[Dict[str, Any]], num_slices: int,
                failed_ranks: List[int]) -> List[int]:
    """The slices every rank of which is in `failed_ranks` (places in rank order)."""
    if num_slices == 1:
        return []
    per_slice = len(places) // num_slices
    failed = set(failed_ranks)
    return [s for s in range(num_slices)
            if all(r in failed for r in range(s * per_slice, (s + 1) * per_slice))]


def lost_slice_line(places: List[Dict[str, Any]], num_slices: int, s: int) -> str:
    per_slice = len(places) // num_slices
    return (f"{_slice_text(places, s)} lost: all {per_slice} of its ranks failed before "
            "tpu_dist-ray-run stopped the job")
