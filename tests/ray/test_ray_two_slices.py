"""The seed's two Ray programs on 2 slices (issue 32 item 4).

One cluster for the module: 2 x v6e-2x2 (`tools/ray_cluster.sh up v6e-2x2
--num-slices 2`: 2 single-host slices x 4 devices = 8 ranks on 2 hosts,
network namespaces), the smallest 2-slice cluster both programs accept (Ray
Train's TPU path reserves single-host slices too; 2 x v4-2x2x2, the smallest
of multi-host slices, is 16 ranks and took 219 s here against ~2 min).
Single-host slices carry no ray.io/tpu-slice-name, so Ray may spread one
slice's bundles over both hosts: the Ray Core example takes an actor's slice
from its host's TPU_NAME (on multi-host slices that equals bundle // per
slice). test_ray_cluster.py::test_two_slices_up_placement_down covers the
multi-host slices' reservation.

- examples/ray/ray_core_collectives.py --num-slices 2: the seed's lines for
  8 ranks (all_reduce sum 36 = 1 + ... + 8, the TP parity verdict), ranks
  0-3 on one slice's host and 4-7 on the other's, tpu_dist's discovery saw
  each rank's MEGASCALE_SLICE_ID (the example asserts it);
- examples/ray/ray_train_llm_finetune.py --num-workers 4 --num-slices 2 (tiny:
  32 rows, max length 32, 1 epoch): the seed's lines, Ray Train gave ranks
  0-3 MEGASCALE_SLICE_ID 0 and ranks 4-7 slice id 1, each group on one
  TPU_NAME, and the parameters are (Replicate(), Shard(0)) on the HSDP mesh.

Afterwards: no process, namespace, state dir or /dev/shm file is left.

Run: .venv/bin/python -m pytest -m ray_cluster tests/ray/test_ray_two_slices.py -v -s
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Dict

import pytest

from test_ray_cluster import IS_ROOT, PYTHON, ROOT, Cluster, _assert_down_clean, _shm

pytestmark = pytest.mark.ray_cluster

CORE_EXAMPLE = ROOT / "examples" / "ray" / "ray_core_collectives.py"
TRAIN_EXAMPLE = ROOT / "examples" / "ray" / "ray_train_llm_finetune.py"
SPEC, GROUP = "v6e-2x2", "v6e-4"  # the cluster's slice; its TPU_NAME is GROUP-<slice>
SLICE = ["--topology", "2x2", "--accelerator-type", "TPU-V6E"]
SLICES, HOSTS, DEVICES = 2, 1, 4  # per slice: hosts, devices per host
PER_SLICE = HOSTS * DEVICES
WORLD = SLICES * PER_SLICE
RANK_LINE = re.compile(
    r"^Rank +(\d+) \(worker_id=(\d+), local_rank=(\d+), ip=([0-9.]+)\): "
    r"all_reduce_sum=\[([^\]]*)\]$")
HSDP_LINE = re.compile(
    rf"HSDP mesh \(dp_replicate={SLICES}, dp_shard={PER_SLICE}\): "
    r"MEGASCALE_SLICE_ID by rank (\[[^\]]*\]), "
    r"TPU_NAME by rank (\[[^\]]*\]), placements \(Replicate\(\), Shard\(dim=0\)\)$")
TIMES: Dict[str, float] = {}


class _Cluster(Cluster):
    def __init__(self) -> None:
        super().__init__()
        self.state = Path("/tmp/tdray-two-slices-test")
        self.env = dict(os.environ, TPU_DIST_RAY_STATE=str(self.state))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    if not IS_ROOT:
        pytest.skip("network namespaces need root")
    c = _Cluster()
    c.run("down")
    shm_before = _shm()
    t0 = time.monotonic()
    c.up(SPEC, "--net", "netns", "--num-slices", str(SLICES))
    TIMES["up"] = time.monotonic() - t0
    procs, suffix = c.footprint()
    c.storage = tmp_path_factory.mktemp("ray_two_slices")
    yield c
    t0 = time.monotonic()
    c.down()
    TIMES["down"] = time.monotonic() - t0
    _assert_down_clean(c, procs, suffix, shm_before)
    print(f"\n{SLICES} x {SPEC}: " + ", ".join(f"{k} {v:.1f}s" for k, v in TIMES.items()))


def _slice_hosts(s: int) -> set:
    """The addresses of cluster slice s's hosts (tools/ray_cluster.sh's netns plan)."""
    return {f"10.250.0.{s * HOSTS + h + 2}" for h in range(HOSTS)}


def test_ray_core_collectives_on_two_slices(cluster: _Cluster) -> None:
    t0 = time.monotonic()
    res = cluster.run("exec", "--", str(PYTHON), str(CORE_EXAMPLE), *SLICE,
                      "--num-slices", str(SLICES), "--timeout-s", "150", timeout=300)
    TIMES["ray_core_collectives"] = time.monotonic() - t0
    assert res.returncode == 0, f"the example failed:\n{res.stdout}\n{res.stderr[-6000:]}"
    for sign in ("Fatal Python error", "SIGABRT", "SIGSEGV"):
        assert sign not in res.stderr, f"an actor crashed:\n{res.stderr[-6000:]}"
    out = res.stdout.splitlines()
    rows = [m.groups() for m in map(RANK_LINE.match, out) if m]
    assert [int(r[0]) for r in rows] == list(range(WORLD)), res.stdout
    total = float(WORLD * (WORLD + 1) // 2)
    ips_of_slice: Dict[int, set] = {}
    for rank, worker_id, local_rank, ip, sums in rows:
        rank = int(rank)
        # rank = slice x devices per slice + worker_id x devices per host + local rank
        assert int(worker_id) == rank % PER_SLICE // DEVICES, rows
        assert int(local_rank) == rank % DEVICES, rows
        assert sums == ", ".join([str(total)] * 4)
        ips_of_slice.setdefault(rank // PER_SLICE, set()).add(ip)
    # Each job slice is one whole cluster slice (which one Ray reserved first is its choice).
    assert sorted(map(sorted, ips_of_slice.values())) == \
        sorted(sorted(_slice_hosts(s)) for s in range(SLICES)), ips_of_slice
    assert out[-1] == (f"All {WORLD} TorchTPU-style ranks verified DTensor TP parity "
                       f"(max_abs_diff=0.000000) and all_reduce sum = {total}"), res.stdout


def test_ray_train_example_on_two_slices(cluster: _Cluster) -> None:
    t0 = time.monotonic()
    res = cluster.run("exec", "--", str(PYTHON), str(TRAIN_EXAMPLE), *SLICE,
                      "--num-workers", str(PER_SLICE), "--num-slices", str(SLICES),
                      "--dataset-split", "train[:32]", "--max-length", "32",
                      "--num-epochs", "1", "--batch-size-per-device", "2",
                      "--storage-path", str(cluster.storage), "--run-name", "two_slices",
                      timeout=480)
    TIMES["ray_train_llm_finetune"] = time.monotonic() - t0
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-6000:]
    out = res.stdout.splitlines()
    assert out[0] == ("Starting Ray Train FSDP2 SFT job: model="
                      f"{ROOT / 'data' / 'tiny_gemma'}, topology=2x2, "
                      f"accelerator_type=TPU-V6E, num_workers={WORLD}"), out[0]
    epochs = re.findall(r"Epoch 1/1 \| loss=(\d+\.\d{4}) \| epoch_time=\d+\.\d{2}s \| "
                        r"tokens/s=\d+\.\d", res.stdout)
    assert epochs, res.stdout[-4000:]
    final = re.search(r"^Training completed! Final metrics: \{'epoch': 1, 'loss': ([0-9.]+), "
                      r"'epoch_time_s': [0-9.]+, 'tokens_per_s': [0-9.]+\}$", res.stdout, re.M)
    assert final and epochs[0] == f"{float(final.group(1)):.4f}", res.stdout[-3000:]
    assert re.search(r"^Saved checkpoint: Checkpoint\(filesystem=local, "
                     r"path=.*two_slices/checkpoint_", res.stdout, re.M), res.stdout[-3000:]
    ckpts = [p for p in (cluster.storage / "two_slices").glob("checkpoint_*") if p.is_dir()]
    assert len(ckpts) == 1 and {p.name for p in ckpts[0].iterdir()} == \
        {"model.pt", "optimizer.pt", "state.json"}, ckpts

    # Ray Train's MEGASCALE_SLICE_ID per rank (each worker also checked it
    # against rank // 4 and MEGASCALE_NUM_SLICES == 2 before building the mesh).
    m = next(filter(None, map(HSDP_LINE.search, text.splitlines())), None)
    assert m, res.stderr[-6000:]
    slice_ids, names = ast.literal_eval(m.group(1)), ast.literal_eval(m.group(2))
    assert slice_ids == [0] * PER_SLICE + [1] * PER_SLICE, slice_ids
    by_slice = [set(names[:PER_SLICE]), set(names[PER_SLICE:])]
    assert all(len(n) == 1 for n in by_slice) and by_slice[0] != by_slice[1], names
    assert by_slice[0] | by_slice[1] == {f"{GROUP}-{s}" for s in range(SLICES)}, names


def test_ray_train_example_refuses_a_wrong_slice_count() -> None:
    """The worker-side check, without a cluster: the variable is named."""
    code = ("import sys; sys.path.insert(0, %r); import ray_train_llm_finetune as t; "
            "t._check_megascale_env(3, 2, 8)" % str(TRAIN_EXAMPLE.parent))
    env = dict(os.environ, MEGASCALE_NUM_SLICES="3", MEGASCALE_SLICE_ID="0")
    res = subprocess.run([str(PYTHON), "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode != 0
    assert ("rank 3: MEGASCALE_NUM_SLICES='3' from Ray Train, expected 2 (--num-slices)"
            in res.stderr), res.stderr[-2000:]
    env["MEGASCALE_NUM_SLICES"] = "2"
    env["MEGASCALE_SLICE_ID"] = "1"
    res = subprocess.run([str(PYTHON), "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert "rank 3: MEGASCALE_SLICE_ID='1' from Ray Train, expected 0" in res.stderr, \
        res.stderr[-2000:]
