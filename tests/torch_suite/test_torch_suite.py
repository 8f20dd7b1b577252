"""PyTorch's distributed test suite against tpu_dist, for CI (pytest).

    .venv/bin/python -m pytest -q tests/torch_suite                  # CI: ci selection
    .venv/bin/python -m pytest -q tests/torch_suite -m 'not torch_suite'   # none of it
    .venv/bin/python -m pytest -q tests/torch_suite -m torch_suite_long    # long run

Every test here is marked `torch_suite`; the long run is marked
`torch_suite_long` and runs only when selected with -m torch_suite_long.
Environment: TPU_DIST_TORCH_SUITE_SELECT (default "ci") picks the selection
of the comparison; TPU_DIST_TORCH_SUITE_OUT keeps the reports (JSON + logs)
in that folder instead of pytest's tmp_path.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

import compare

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.torch_suite


def _script(name: str, *args: str, timeout: float,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HERE / name), *args], cwd=HERE,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def _out_dir(tmp_path: Path, world: int | str) -> Path:
    base = os.environ.get("TPU_DIST_TORCH_SUITE_OUT")
    return Path(base) / f"w{world}" if base else tmp_path


def test_harness_runs_gloo(tmp_path: Path) -> None:
    """The runner reports pass / skip per test, and a file:// global re-init works."""
    out = tmp_path / "gloo.json"
    p = _script("run_suite.py", "--backend", "gloo", "--world", "2", "--json", str(out),
                "--tests", "test_all_reduce_sum", "test_all_reduce_sum_cuda",
                "test_barrier_timeout_global", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(out.read_text())
    outcomes = {n: r["outcome"] for n, r in report["tests"].items()}
    assert outcomes == {"test_all_reduce_sum": "passed",
                        "test_all_reduce_sum_cuda": "skipped",
                        "test_barrier_timeout_global": "passed"}
    assert report["counts"] == {"passed": 2, "failed": 0, "skipped": 1, "error": 0}
    assert report["shm_leftovers"] == []


def test_hang_tracebacks_are_cut_from_the_log(tmp_path: Path) -> None:
    """What torch's harness logs for a timed-out rank reaches the report."""
    log = tmp_path / "suite.log"
    stack = [f'  File "x.py", line {i} in f{i}' for i in range(60)]
    log.write_text("\n".join([
        "===== phase native #1", "noise",
        "ERROR:torch.testing._internal.common_distributed:Process 2 timed out with "
        "traceback: ", "", "Current thread 0x1 (most recent call first):", *stack,
        "Could not retrieve traceback for timed out process: 1", "end"]) + "\n")
    blocks = compare.hang_tracebacks(str(log), max_lines=10)
    assert len(blocks) == 2
    assert blocks[0].startswith("ERROR:") and "line 6 in f6" in blocks[0]
    assert "line 7 in f7" not in blocks[0]
    assert blocks[1].splitlines() == [
        "Could not retrieve traceback for timed out process: 1", "end"]
    assert compare.hang_tracebacks(None) == []
    assert compare.hang_tracebacks(str(tmp_path / "missing.log")) == []


def test_missing_backend_module_fails_clearly() -> None:
    p = _script("run_suite.py", "--backend", "tpu_dist_not_a_module", "--tests",
                "test_barrier", timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "`import tpu_dist_not_a_module` failed" in p.stderr


def test_expected_failures_name_existing_tests() -> None:
    entries = compare.load_expected(compare.DEFAULT_EXPECTED)
    names = sorted({e.test for e in entries})
    if not names:
        return
    p = _script("run_suite.py", "--backend", "gloo", "--list", "--tests", *names,
                timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no such tests" not in p.stderr, p.stderr


@pytest.mark.parametrize("world", [2, 3])
def test_tpu_dist_passes_what_gloo_passes(world: int, tmp_path: Path) -> None:
    """The CI selection on gloo then tpu_dist; compare.py's verdict."""
    select = os.environ.get("TPU_DIST_TORCH_SUITE_SELECT", "ci")
    p = _script("compare.py", "--worlds", str(world), "--select", select,
                "--out-dir", str(_out_dir(tmp_path, world)), timeout=1800)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]


def test_tpu_dist_next_to_a_busy_load_passes_what_gloo_passes(tmp_path: Path) -> None:
    """The collectives family at world 2 with the shm paths meant for busy cores
    (phases that run ahead, streamed broadcast) taken on idle ones, and slots
    of 256 bytes and no one-shot all_reduce, so that the suite's small tensors
    span many phases of every path."""
    p = _script("compare.py", "--worlds", "2", "--select", "collectives",
                "--out-dir", str(_out_dir(tmp_path, "2_load")), timeout=1800,
                env={"TPU_DIST_ASSUME_FOREIGN_LOAD": "1", "TPU_DIST_SHM_SLOT_BYTES": "256",
                     "TPU_DIST_SHM_SLOTS": "8", "TPU_DIST_SMALL_ALLREDUCE_BYTES": "0"})
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]


@pytest.mark.torch_suite_long
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_tpu_dist_passes_what_gloo_passes_long(world: int, tmp_path: Path,
                                               request: pytest.FixtureRequest) -> None:
    """The long selection; only with -m torch_suite_long."""
    if "torch_suite_long" not in (request.config.getoption("-m") or ""):
        pytest.skip("long run: select with -m torch_suite_long")
    p = _script("compare.py", "--worlds", str(world), "--select", "long",
                "--out-dir", str(_out_dir(tmp_path, f"{world}_long")), timeout=7200)
    print(p.stdout)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]


# ---------------------------------------------------------------------------
# PyTorch's own test/distributed files (upstream_files.py): not in the wheel
# and not in this repository, they run when the cache holds them (README.md).
# ---------------------------------------------------------------------------

def test_upstream_lists_are_well_formed() -> None:
    import upstream_files

    manifest = upstream_files.load_manifest()
    assert manifest, "upstream_files.tsv lists no file"
    names = {Path(f.path).name for f in manifest}
    for test_id in upstream_files.load_expected():
        assert test_id.split("::", 1)[0] in names, test_id
    for f in manifest:
        assert re.fullmatch(r"[0-9a-f]{40}", f.commit) and re.fullmatch(r"[0-9a-f]{64}", f.sha256), f


def test_upstream_shim_turns_gloo_into_tpu_dist() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "tpu_dist_upstream_shim", HERE / "upstream" / "shim" / "sitecustomize.py")
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)  # TPU_DIST_UPSTREAM_BACKEND unset: installs nothing
    assert shim._redirect("gloo") == "tpu_dist"
    assert shim._redirect("GLOO") == "tpu_dist"
    assert shim._redirect(None) == "tpu_dist"
    assert shim._redirect("cpu:gloo,cuda:nccl") == "cpu:tpu_dist,cuda:nccl"
    assert shim._redirect("nccl") == "nccl"
    assert shim._redirect("dummy") == "dummy"


def test_pytorch_test_files_pass_what_gloo_passes(tmp_path: Path) -> None:
    """Each file of upstream_files.tsv in the cache, on Gloo then on tpu_dist."""
    out = _out_dir(tmp_path, "upstream")
    p = _script("upstream_files.py", "--allow-missing", "-v", "--out-dir", str(out),
                timeout=1800)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    if "no upstream file to run" in p.stdout:
        pytest.skip("PyTorch's test files are not in the cache "
                    f"({p.stdout.strip().splitlines()[0]}); see tests/torch_suite/README.md")
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
