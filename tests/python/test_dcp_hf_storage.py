"""The torch side of our DCP interop alone: torch FSDP2 saves model and AdamW state with DCP's
Hugging Face safetensors storage (``HuggingFaceStorageWriter(save_distributed=True)``) on one world
size and loads it with ``HuggingFaceStorageReader`` on another, bit for bit.

This pins the recipe docs/fsdp.md ("DCP interop") gives torch users and the layout
fsdp/fully_shard/dcp_checkpoint.h reads and writes: if a torch upgrade changes the HF storage's
file names, header record or what its reader requires, this fails before the C++ oracle
(fully_shard_test ``Worlds/DcpOracle.*``) does. Runs tests/oracles/dcp_oracle.py (Gloo ranks).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO / "tests" / "oracles" / "dcp_oracle.py"


def _oracle(mode: str, path: Path, world: int, expected: Path) -> None:
    proc = subprocess.run([sys.executable, str(ORACLE), mode, str(path), str(world), str(expected)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


@pytest.mark.parametrize("save_world,load_world", [(4, 2), (2, 4)])
def test_torch_hf_storage_reshards_model_and_adamw(tmp_path: Path, save_world: int, load_world: int) -> None:
    ckpt, expected = tmp_path / "ckpt", tmp_path / "expected.safetensors"
    _oracle("save", ckpt, save_world, expected)
    # The layout dcp_layout.h writes: one file per rank, torch's names, offsets in the header.
    files = sorted(p.name for p in ckpt.iterdir())
    assert files == [f"shard-{r + 1:05d}-model-00001-of-00001.safetensors" for r in range(save_world)], files
    header = _header(ckpt / files[1])
    info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
    assert info["b1.fc1.weight"]["saved_offsets"] == [5 if save_world == 2 else 3, 0]
    assert set(header) - {"__metadata__"} == set(info)
    _oracle("load", ckpt, load_world, expected)
