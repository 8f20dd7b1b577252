"""Our sharded checkpoint files, read by the `safetensors` package alone.

Runs ``fully_shard_test --gtest_filter=ShardedCheckpointTest.TpFsdpTwoDim*``
(fsdp/fully_shard/checkpoint_test.cc) with $TPU_DIST_CKPT_EXPORT_DIR set: it
saves a TP(2) x FSDP(2) model (4 ranks on a 2-D mesh, uneven torch.chunk
pieces, a replicated bias stored once) as a format-2 sharded checkpoint and
writes the original full tensors to expected.safetensors. Here, without any
of our code, every tensor is reassembled from the shard files by the blocks
metadata.json names (offsets and sizes per dim); each element must be covered
exactly once and the result must equal the expected tensor bit for bit.

The binary is $TPU_DIST_FULLY_SHARD_TEST, else build/fsdp/fully_shard/
fully_shard_test; the test is skipped when neither exists.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("TPU_DIST_FULLY_SHARD_TEST", REPO / "build" / "fsdp" / "fully_shard" / "fully_shard_test"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not BINARY.exists():
        pytest.skip(f"{BINARY} not built")
    out = tmp_path_factory.mktemp("sharded_ckpt")
    env = dict(os.environ, TPU_DIST_CKPT_EXPORT_DIR=str(out))
    proc = subprocess.run([str(BINARY), "--gtest_filter=ShardedCheckpointTest.TpFsdpTwoDim*"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "1 test" in proc.stdout, proc.stdout[-2000:]  # the filter matched
    return out


def test_blocks_reassemble_to_the_full_tensors(exported: Path) -> None:
    meta = json.loads((exported / "metadata.json").read_text())
    assert meta["format"] == 2
    world = meta["world_size"]
    assert world == 4
    expected = load_file(str(exported / "expected.safetensors"))
    assert set(meta["tensors"]) == set(expected)
    files = {}
    for r in range(world):
        path = exported / f"shard-{r}-of-{world}.safetensors"
        files[r] = safe_open(str(path), framework="pt")
    sharded_over_tp_and_dp = 0
    for name, t in meta["tensors"].items():
        full = torch.zeros(t["shape"], dtype=expected[name].dtype)
        hits = torch.zeros(t["shape"], dtype=torch.int32)
        for b in t["blocks"]:
            piece = files[b["rank"]].get_tensor(name)
            assert list(piece.shape) == b["sizes"], (name, b)
            index = tuple(slice(o, o + s) for o, s in zip(b["offsets"], b["sizes"]))
            full[index] = piece
            hits[index] += 1
        assert torch.equal(hits, torch.ones_like(hits)), f"{name}: elements not covered exactly once"
        assert torch.equal(full, expected[name]), name
        if len({tuple(b["offsets"]) for b in t["blocks"]}) == 4:
            sharded_over_tp_and_dp += 1
    # fc1 weights/biases (Shard(0) then dp rows) and fc2 weights (Shard(1),
    # then dp rows) are in 4 distinct blocks: the 2-D layout was exercised.
    assert sharded_over_tp_and_dp >= 6
