"""The committed oracle fixtures are what regenerate.sh produces now.

Regenerates every fixture (or takes ctest's fresh regeneration, in
$TPU_DIST_ORACLE_FIXTURES) with the venv's pinned transformers / tokenizers /
torch and compares file by file with the committed ones: the same set of
files, and

Each fixture folder carries the tag of the CPU that generated it
(`<folder>/cpu.json`; the top-level `cpu.json` for files without one), since
folders added later may come from another machine than the rest:

- on a CPU with that `cpu.json`'s kernel flags: byte-identical
  contents (floats exactly equal, not close); a differing safetensors file is
  explained tensor by tensor;
- on another CPU (another kernel path: the last bits of floats move): the same
  JSON up to float values, the same tensor names, dtypes and shapes, and
  integer tensors (token ids, masks, labels) exactly equal. The numbers
  themselves are then checked by the C++ oracle tests against the fresh
  fixtures of this CPU.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_tag import cpu_tag  # noqa: E402

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


def _fresh_dir(tmp_path: Path) -> Path:
    """ctest's regeneration when there is one, else a new one in tmp_path."""
    ready = os.environ.get("TPU_DIST_ORACLE_FIXTURES")
    if ready:
        assert (Path(ready) / "cpu.json").is_file(), f"{ready}: no regenerated fixtures (ctest's oracle_fixtures)"
        return Path(ready)
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(HERE / "regenerate.sh"), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return tmp_path


def _json_shape(value: object) -> object:
    """`value` with every float replaced by a marker: structure, ints, strings."""
    if isinstance(value, float):
        return "<float>"
    if isinstance(value, dict):
        return {k: _json_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_shape(v) for v in value]
    return value


def _same_up_to_floats(rel: str, want: Path, got: Path) -> list[str]:
    """What differs between two fixture files beyond float values."""
    if rel.endswith(".safetensors"):
        a, b = load_file(str(want)), load_file(str(got))
        if set(a) != set(b):
            return [f"{rel}: tensors only committed {sorted(set(a) - set(b))}, only fresh {sorted(set(b) - set(a))}"]
        out = []
        for name in sorted(a):
            x, y = a[name], b[name]
            if x.dtype != y.dtype or x.shape != y.shape:
                out.append(f"{rel}: {name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
            elif not x.is_floating_point() and not torch.equal(x, y):
                out.append(f"{rel}: {name}: integer tensor differs")
            elif x.is_floating_point() and not torch.isfinite(y).all() and torch.isfinite(x).all():
                out.append(f"{rel}: {name}: fresh values not finite")
        return out
    if rel.endswith(".json"):
        if _json_shape(json.loads(want.read_text())) != _json_shape(json.loads(got.read_text())):
            return [_explain(rel, want, got)]
        return []
    return [] if want.read_bytes() == got.read_bytes() else [_explain(rel, want, got)]


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed fixtures")
def test_fixtures_are_fresh(tmp_path: Path) -> None:
    fresh = _fresh_dir(tmp_path)
    want, got = _files(COMMITTED), _files(fresh)
    assert want == got, f"only committed: {sorted(want - got)}; only fresh: {sorted(got - want)}"
    here_isa = cpu_tag()["isa"]
    fixtures = sorted(rel for rel in want if Path(rel).name != "cpu.json")
    exact = [rel for rel in fixtures if committed_isa(rel) == here_isa]
    stale = [rel for rel in exact if (COMMITTED / rel).read_bytes() != (fresh / rel).read_bytes()]
    assert not stale, "fixtures differ from a fresh regeneration (run tests/oracles/regenerate.sh):\n" + \
        "\n".join(_explain(rel, COMMITTED / rel, fresh / rel) for rel in stale)
    problems = [p for rel in sorted(set(fixtures) - set(exact))
                for p in _same_up_to_floats(rel, COMMITTED / rel, fresh / rel)]
    assert not problems, "fixtures differ from a fresh regeneration beyond float bits:\n" + "\n".join(problems)


def committed_isa(rel: str, root: Path = COMMITTED) -> list[str]:
    """The kernel flags of the CPU that generated committed fixture `rel`: the
    nearest cpu.json in its folder or above."""
    folder = (root / rel).parent
    while True:
        tag = folder / "cpu.json"
        if tag.is_file():
            return json.loads(tag.read_text())["isa"]
        if folder == root:
            raise AssertionError(f"{rel}: no cpu.json in its folder or above")
        folder = folder.parent


def test_each_folder_is_judged_by_its_own_cpu_tag(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "cpu.json").write_text(json.dumps({"isa": ["avx2", "amx_tile"], "model": "x"}))
    (tmp_path / "b" / "cpu.json").write_text(json.dumps({"isa": ["avx2"], "model": "y"}))
    assert committed_isa("a/f.safetensors", tmp_path) == ["avx2", "amx_tile"]
    assert committed_isa("b/f.safetensors", tmp_path) == ["avx2"]


def test_cpu_tag_reads_kernel_flags() -> None:
    tag = cpu_tag("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 sse2\n"
                  "processor\t: 1\nflags\t\t: fpu\n")
    assert tag == {"isa": ["avx2", "fma", "avx512f", "avx512_bf16"], "model": "AMD EPYC"}


def test_cross_cpu_comparison_catches_changed_ids(tmp_path: Path) -> None:
    from safetensors.torch import save_file
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"ids": torch.tensor([1, 2, 3]), "logits": torch.tensor([0.5, 1.0])}, str(a))
    save_file({"ids": torch.tensor([1, 2, 3]), "logits": torch.tensor([0.5000001, 1.0])}, str(b))
    assert _same_up_to_floats("x.safetensors", a, b) == []
    save_file({"ids": torch.tensor([1, 2, 4]), "logits": torch.tensor([0.5, 1.0])}, str(b))
    assert _same_up_to_floats("x.safetensors", a, b) == ["x.safetensors: ids: integer tensor differs"]
    ja, jb = tmp_path / "a.json", tmp_path / "b.json"
    ja.write_text(json.dumps({"n": 3, "x": 0.25}))
    jb.write_text(json.dumps({"n": 3, "x": 0.2500001}))
    assert _same_up_to_floats("x.json", ja, jb) == []
    jb.write_text(json.dumps({"n": 4, "x": 0.25}))
    assert _same_up_to_floats("x.json", ja, jb) != []
