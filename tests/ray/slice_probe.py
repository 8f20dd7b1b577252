"""A Ray driver that reports what Ray sees of an emulated TPU slice, as JSON.

Run it on the cluster's head (tools/ray_cluster.sh exec -- python
tests/ray/slice_probe.py --topology 2x2x2 --accelerator-type TPU-V4
[--num-slices 2]). It
prints one JSON object on its last stdout line:

  nodes:   every alive node's address, labels and resources;
  slice:   what ray.util.tpu.slice_placement_group reserved (bundles, hosts,
           devices per host, the node of each bundle, the head reservation);
  actors:  one per bundle (resources={"TPU": 1}, as the seed's program): its
           node, address, TPU environment, the TPU ids Ray assigned, and the
           addresses TPU_WORKER_HOSTNAMES resolve to from inside the actor.

Only Ray's public APIs are used; nothing of Ray is patched.
"""

import argparse
import json
import os
import socket
import sys
import time
from typing import Any, Dict, List, Optional

import ray
from ray.util import tpu
from ray.util.placement_group import placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ENV_KEYS = (
    "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_NAME", "TPU_ACCELERATOR_TYPE",
    "TPU_TOPOLOGY", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICEBUILDER_ADDRESSES",
    "TPU_VISIBLE_CHIPS", "RAY_TPU_RESOURCE_PER_CHIP", "TPU_PROCESS_ADDRESSES",
)


@ray.remote(num_cpus=0, resources={"TPU": 1})
class Device:
    """One actor per bundle: reports what this device's process sees."""

    def info(self) -> Dict[str, Any]:
        env = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}
        resolved: Dict[str, Optional[str]] = {}
        for name in env.get("TPU_WORKER_HOSTNAMES", "").split(","):
            if not name:
                continue
            try:
                resolved[name] = socket.gethostbyname(name)
            except OSError:
                resolved[name] = None
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "env": env,
            "tpu_ids": ctx.get_accelerator_ids()["TPU"],
            "pod_name": tpu.get_current_pod_name(),
            "resolved": resolved,
            "pid": os.getpid(),
        }


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology", required=True)
    parser.add_argument("--accelerator-type", required=True)
    parser.add_argument("--chips-per-vm", type=int, default=None)
    parser.add_argument("--num-slices", type=int, default=1)
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    ray.init(logging_level="ERROR", log_to_driver=False)
    nodes = [
        {"id": n["NodeID"], "ip": n["NodeManagerAddress"], "labels": n["Labels"],
         "resources": n["Resources"]}
        for n in ray.nodes() if n["Alive"]
    ]
    spg = tpu.slice_placement_group(
        topology=args.topology,
        accelerator_version=tpu.get_tpu_version_from_type(args.accelerator_type),
        num_slices=args.num_slices,
        resources_per_bundle={"TPU": 1},
        chips_per_vm=args.chips_per_vm,
    )
    pg = spg.placement_group
    ray.get(pg.ready(), timeout=120)
    t_ready = time.monotonic() - t0
    table = placement_group_table(pg)
    head_nodes = [
        placement_group_table(h)["bundles_to_node_id"][0] for h in spg.head_placement_groups
    ]
    actors = [
        Device.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote()
        for i in range(spg.num_bundles)
    ]
    infos = ray.get([a.info.remote() for a in actors], timeout=180)
    t_actors = time.monotonic() - t0
    for a in actors:
        ray.kill(a)
    spg.shutdown()
    result = {
        "nodes": nodes,
        "slice": {
            "num_bundles": spg.num_bundles,
            "num_hosts": spg.num_hosts,
            "devices_per_host": spg.devices_per_host,
            "bundle_resources": spg.bundle_resources,
            "bundle_label_selector": spg.bundle_label_selector,
            "bundle_nodes": [table["bundles_to_node_id"][i] for i in range(spg.num_bundles)],
            "head_reservation_nodes": head_nodes,
        },
        "actors": infos,
        "seconds": {"slice_ready": round(t_ready, 2), "actors": round(t_actors, 2)},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
