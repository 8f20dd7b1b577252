"""The committed oracle fixtures are exactly what regenerate.sh produces now.

Regenerates every fixture into a temporary directory with the venv's pinned
transformers / tokenizers / torch and compares file by file: the same set of
files, byte-identical contents. When a safetensors file differs, the message
names each differing tensor and its largest difference (floats must be
exactly equal, not close).
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "fixtures"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _explain(rel: str, want: Path, got: Path) -> str:
    if rel.endswith(".safetensors"):
        a, b = load_file(str(want)), load_file(str(got))
        lines = [f"{rel}: tensors only committed: {sorted(set(a) - set(b))}, only fresh: {sorted(set(b) - set(a))}"]
        for name in sorted(set(a) & set(b)):
            x, y = a[name], b[name]
            if x.dtype != y.dtype or x.shape != y.shape:
                lines.append(f"  {name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
            elif not torch.equal(x, y):
                diff = (x.double() - y.double()).abs().max().item()
                lines.append(f"  {name}: max abs difference {diff:.3g}")
        return "\n".join(lines)
    try:
        diff = difflib.unified_diff(want.read_text().splitlines(), got.read_text().splitlines(), "committed",
                                    "fresh", lineterm="", n=1)
        return rel + ":\n" + "\n".join(list(diff)[:40])
    except UnicodeDecodeError:
        return f"{rel}: binary contents differ"


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed fixtures")
def test_fixtures_are_fresh(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(HERE / "regenerate.sh"), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    want, got = _files(COMMITTED), _files(tmp_path)
    assert want == got, f"only committed: {sorted(want - got)}; only fresh: {sorted(got - want)}"
    stale = [rel for rel in sorted(want) if (COMMITTED / rel).read_bytes() != (tmp_path / rel).read_bytes()]
    assert not stale, "fixtures differ from a fresh regeneration (run tests/oracles/regenerate.sh):\n" + "\n".join(
        _explain(rel, COMMITTED / rel, tmp_path / rel) for rel in stale)
