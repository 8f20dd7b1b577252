"""tpu_dist.rank_info() across slices: the MEGASCALE_* variables Ray Train's
TorchTrainer sets for backend "tpu_dist" (ray/train/torch/config.py,
_setup_tpu_multislice: slice id = worker index // workers per slice, the
coordinator address with its port, MEGASCALE_PORT = base + LOCAL_RANK)."""

from __future__ import annotations

import pytest

import tpu_dist

_LAUNCHER_VARS = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_TOPOLOGY",
                  "TPU_ACCELERATOR_TYPE", "TORCH_TPU_TOPOLOGY", "TPU_NAME",
                  "TORCH_TPU_SLICEBUILDER_ADDRESSES", "TPU_VISIBLE_CHIPS",
                  "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                  "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
                  "TPU_DIST_HOST_ID")


def _ray_train_env(monkeypatch: pytest.MonkeyPatch, rank: int, world: int,
                   slices: int) -> None:
    for var in _LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    per_slice = world // slices
    values = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank % 2,
              "LOCAL_WORLD_SIZE": 2, "MASTER_ADDR": "10.0.0.7",
              "MASTER_PORT": 29500,
              "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.7:8081",
              "MEGASCALE_NUM_SLICES": slices,
              "MEGASCALE_SLICE_ID": min(rank // per_slice, slices - 1),
              "MEGASCALE_PORT": 8081 + rank % 2}
    for key, value in values.items():
        monkeypatch.setenv(key, str(value))


def test_ray_train_multislice_variables_give_slice_major_ranks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _ray_train_env(monkeypatch, rank=5, world=8, slices=2)
    info = tpu_dist.rank_info()
    assert (info.slice_index, info.num_slices) == (1, 2)
    assert info.megascale_coordinator == "10.0.0.7:8081"
    assert (info.host_index, info.num_hosts) == (2, 4)
    assert (info.devices_per_slice, info.rank_in_slice, info.host_in_slice) == (4, 1, 0)
    assert info["num_slices"] == 2
    assert "slice 1/2" in info.summary


def test_a_stale_slice_count_names_both_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A restarted job whose launcher still announces 3 slices for 8 devices.
    _ray_train_env(monkeypatch, rank=5, world=8, slices=2)
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "3")
    with pytest.raises(ValueError, match=r'WORLD_SIZE="8": expected a multiple '
                                         r"of MEGASCALE_NUM_SLICES=3"):
        tpu_dist.rank_info()


def test_one_slice_reads_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    _ray_train_env(monkeypatch, rank=3, world=4, slices=1)
    info = tpu_dist.rank_info()
    assert (info.slice_index, info.num_slices, info.rank_in_slice) == (0, 1, 3)
    assert "slice" not in info.summary
