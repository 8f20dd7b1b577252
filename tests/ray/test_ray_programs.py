"""Our programs under the real Ray, on one local cluster of emulated TPU hosts.

One v4-2x2x2 cluster (2 hosts x 4 devices, the smallest multi-host slice;
network namespaces as root, loopback addresses otherwise) for the module:

- the C++ launcher (`tpu_dist-ray-run`, python/tpu_dist/ray_launcher.py) runs
  slice_check and ffn_tp_check (the TP check) on the 8 devices;
- it runs a 3-epoch gemma_finetune; a rank SIGKILLed from outside mid-epoch 2
  is named, the others are stopped, the group restarts from the epoch-1
  checkpoint and ends with the same epoch losses as an uninterrupted run;
- with --max-failures 0 it gives up on a killed rank with the rank's status;
- examples/ray/ray_train_llm_finetune.py (the seed's Ray Train FSDP2
  fine-tune, TorchConfig(backend="tpu_dist")) prints the seed's lines and
  keeps one checkpoint (num_to_keep=1, best by loss).

Afterwards: no process, namespace, state dir or /dev/shm file is left.

Run: .venv/bin/python -m pytest -m ray_cluster tests/ray/test_ray_programs.py -v
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest

from test_ray_cluster import IS_ROOT, PYTHON, ROOT, SCRIPT, Cluster, _assert_down_clean, _shm

pytestmark = pytest.mark.ray_cluster

BUILD = Path(os.environ.get("TPU_DIST_BUILD_DIR", ROOT / "build"))
LAUNCHER = ROOT / ".venv" / "bin" / "tpu_dist-ray-run"
TRAIN_EXAMPLE = ROOT / "examples" / "ray" / "ray_train_llm_finetune.py"
SLICE = ["--topology", "2x2x2", "--accelerator-type", "TPU-V4"]
WORLD = 8
# Small enough for CI, long enough (16 steps, ~5 s an epoch) to be killed mid-epoch.
FINETUNE_ARGS = ["--dataset_split", "train[:256]", "--max_seq_len", "64",
                 "--batch_size_per_device", "2", "--num_epochs", "3", "--bf16=false"]
EPOCH_LINE = re.compile(r"^\[rank 0\] Epoch (\d+)/(\d+) \| loss=(\d+\.\d{4}) \| "
                        r"epoch_time=\d+\.\d{2}s \| tokens/s=\d+\.\d$")
STARTED = re.compile(r"attempt (\d+): 8 ranks started, .*\(rank:host/pid (.*)\)$")


class _Cluster(Cluster):
    def __init__(self) -> None:
        super().__init__()
        self.state = Path("/tmp/tdray-programs-test")
        self.env = dict(os.environ, TPU_DIST_RAY_STATE=str(self.state))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    for binary in ("slice_check", "ffn_tp_check", "gemma_finetune"):
        if not (BUILD / "examples" / binary).exists():
            pytest.fail(f"{BUILD}/examples/{binary} is not built (tools/build.sh)")
    c = _Cluster()
    c.run("down")
    shm_before = _shm()
    c.up("v4-2x2x2", "--net", "netns" if IS_ROOT else "loopback")
    procs, suffix = c.footprint()
    c.storage = tmp_path_factory.mktemp("ray_runs")
    yield c
    c.down()
    left = [pid for pid in subprocess.run(["pgrep", "-f", f"{BUILD}/examples/"],
                                          capture_output=True, text=True,
                                          check=False).stdout.split() if _launched_here(pid)]
    assert not left, f"rank processes left after down: {left}"
    _assert_down_clean(c, procs, suffix, shm_before)


def _launched_here(pid: str) -> bool:
    """Whether a process is a rank tpu_dist-ray-run started (its job id
    rayrun_*), not one of another test's tpurun jobs running beside this one."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(v.startswith(b"TPU_DIST_JOB_ID=rayrun_") for v in environ)


def _launch(c: _Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return c.run("exec", "--", str(LAUNCHER), *args, timeout=timeout)


def _epoch_losses(text: str) -> Dict[int, str]:
    return {int(m.group(1)): m.group(3) for m in map(EPOCH_LINE.match, text.splitlines()) if m}


def test_launcher_runs_slice_check_and_tp_check(cluster: _Cluster) -> None:
    res = _launch(cluster, *SLICE, "--", str(BUILD / "examples" / "slice_check"))
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    ok = [line for line in res.stdout.splitlines() if line.endswith("allreduce 36 (expected 36) OK")]
    assert len(ok) == WORLD, res.stdout
    for r in range(WORLD):  # rank-prefixed, each rank where the TPU variables put it
        assert any(line.startswith(f"[rank {r}] slice_check: rank {r}/8 local {r % 4}/4 "
                                   f"host {r // 4}/2 (v4 2x2x2, kuberay-tpu)") for line in ok)
    assert "all 8 ranks succeeded" in res.stderr

    res = _launch(cluster, *SLICE, "--", str(BUILD / "examples" / "ffn_tp_check"))
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    rows = [line for line in res.stdout.splitlines()
            if re.match(r"^\[rank 0\] Rank +\d+ \(worker_id=\d, local_rank=\d, ip=\S+\): "
                        r"all_reduce_sum=\[36\.0, 36\.0, 36\.0, 36\.0\]$", line)]
    assert len(rows) == WORLD, res.stdout
    verdict = re.search(r"All 8 tpu_dist ranks verified DTensor TP parity "
                        r"\(max_abs_diff=([0-9.e+-]+)\) and all_reduce sum = 36\.0", res.stdout)
    assert verdict and float(verdict.group(1)) < 1e-4, res.stdout


def test_launcher_restarts_a_killed_rank_from_the_checkpoint(cluster: _Cluster) -> None:
    binary = str(BUILD / "examples" / "gemma_finetune")
    store = str(cluster.storage)
    base = _launch(cluster, *SLICE, "--", binary, *FINETUNE_ARGS, "--storage_path", store,
                   "--run_name", "uninterrupted")
    assert base.returncode == 0, base.stdout[-4000:] + base.stderr[-4000:]
    expected = _epoch_losses(base.stdout)
    assert sorted(expected) == [1, 2, 3], base.stdout

    # The same job, with a rank killed (SIGKILL, from outside) during epoch 2.
    cmd = [str(SCRIPT), "exec", "--", str(LAUNCHER), *SLICE, "--max-failures", "1", "--",
           binary, *FINETUNE_ARGS, "--storage_path", store, "--run_name", "killed"]
    proc = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out: List[str] = []
    victim = {"pid": 0, "killed": False}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line.rstrip("\n"))
            m = STARTED.search(line)
            if m and m.group(1) == "0":
                pids = dict(item.split(":", 1) for item in m.group(2).split(", "))
                victim["pid"] = int(pids["5"].split("/")[1])
            if (line.startswith("[rank 0] Epoch 2/3 step 4/16") and victim["pid"]
                    and not victim["killed"]):
                victim["killed"] = True  # once: the restarted attempt passes here again
                os.kill(victim["pid"], signal.SIGKILL)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        rc = proc.wait(timeout=300)
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
    text = "\n".join(out)
    assert rc == 0, text[-6000:]
    assert victim["killed"], text[-4000:]
    # Every other rank is either stopped by the launcher or already gone on its
    # own (exit 75 after seeing rank 5 die) and then named as a follower.
    m = re.search(r"tpu_dist-ray-run: rank 5 \(worker 1, device 1, \S+\) killed by SIGKILL"
                  r"(?:; ranks ([\d, ]+) stopped because of it)?; "
                  r"stopped the other (\d) ranks in \d+\.\d s", text)
    assert m, text[-4000:]
    followers = len(m.group(1).split(", ")) if m.group(1) else 0
    assert followers + int(m.group(2)) == 7, m.group(0)
    assert "restarting all ranks (restart 1 of 1)" in text
    assert "all 8 ranks succeeded" in text and "(after 1 restart)" in text
    # Attempt 0 finished epoch 1 only; attempt 1 resumed after it.
    assert [int(m.group(1)) for m in map(EPOCH_LINE.match, out) if m] == [1, 2, 3], text[-4000:]
    assert _epoch_losses(text) == expected
    # metrics.jsonl: one line per epoch, losses bit-identical to the uninterrupted run's.
    runs = {name: [json.loads(line) for line in
                   (cluster.storage / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("uninterrupted", "killed")}
    assert [m["epoch"] for m in runs["killed"]] == [1, 2, 3]
    assert [m["loss"] for m in runs["killed"]] == [m["loss"] for m in runs["uninterrupted"]]


def test_launcher_gives_up_with_the_ranks_status(cluster: _Cluster) -> None:
    t0 = time.monotonic()
    res = _launch(cluster, *SLICE, "--", str(BUILD / "examples" / "gemma_finetune"),
                  *FINETUNE_ARGS, "--num_epochs", "1", "--storage_path", str(cluster.storage),
                  "--run_name", "gives_up", "--die_rank", "3", "--die_step", "2")
    assert res.returncode == 137, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"giving up: rank 3 \(worker 0, device 3, \S+\) killed by SIGKILL; exit 137$",
                     res.stderr.strip()), res.stderr[-3000:]
    assert time.monotonic() - t0 < 120


def test_launcher_restarts_when_a_ranks_actor_dies(cluster: _Cluster) -> None:
    """SIGKILL of the Ray actor (the rank's parent): the rank dies with it
    (PR_SET_PDEATHSIG), the launcher names the rank and restarts the group."""
    cmd = [str(SCRIPT), "exec", "--", str(LAUNCHER), *SLICE, "--max-failures", "1", "--",
           str(BUILD / "examples" / "gemma_finetune"), *FINETUNE_ARGS, "--num_epochs", "1",
           "--storage_path", str(cluster.storage), "--run_name", "actor_killed"]
    proc = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out: List[str] = []
    victim = {"rank_pid": 0, "actor_pid": 0}
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out.append(line.rstrip("\n"))
            m = STARTED.search(line)
            if m and m.group(1) == "0":
                pids = dict(item.split(":", 1) for item in m.group(2).split(", "))
                victim["rank_pid"] = int(pids["2"].split("/")[1])
            if line.startswith("[rank 0] Epoch 1/1 step 4/16") and not victim["actor_pid"]:
                stat = Path(f"/proc/{victim['rank_pid']}/stat").read_text()
                victim["actor_pid"] = int(stat[stat.rindex(")") + 2:].split()[1])  # ppid
                os.kill(victim["actor_pid"], signal.SIGKILL)
        rc = proc.wait(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    text = "\n".join(out)
    assert rc == 0, text[-6000:]
    assert victim["actor_pid"], text[-4000:]
    assert re.search(r"rank 2 \(worker 0, device 2, \S+\) (its Ray actor died|killed by SIGKILL)",
                     text), text[-4000:]
    assert "all 8 ranks succeeded" in text and "(after 1 restart)" in text
    assert not Path(f"/proc/{victim['rank_pid']}").exists(), "the killed actor's rank survived it"


def test_ray_train_example_prints_the_seeds_lines(cluster: _Cluster) -> None:
    res = cluster.run("exec", "--", str(PYTHON), str(TRAIN_EXAMPLE), *SLICE,
                      "--num-workers", "8", "--dataset-split", "train[:64]",
                      "--max-length", "64", "--num-epochs", "2", "--batch-size-per-device", "2",
                      "--storage-path", str(cluster.storage), "--run-name", "ray_train",
                      timeout=600)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-6000:]
    out = res.stdout.splitlines()
    assert out[0] == ("Starting Ray Train FSDP2 SFT job: model="
                      f"{ROOT / 'data' / 'tiny_gemma'}, topology=2x2x2, "
                      "accelerator_type=TPU-V4, num_workers=8"), out[0]
    epochs = re.findall(r"Epoch (\d)/2 \| loss=(\d+\.\d{4}) \| epoch_time=\d+\.\d{2}s \| "
                        r"tokens/s=\d+\.\d", res.stdout)
    assert sorted({e for e, _ in epochs}) == ["1", "2"], res.stdout[-4000:]
    final = re.search(r"^Training completed! Final metrics: \{'epoch': 2, 'loss': ([0-9.]+), "
                      r"'epoch_time_s': [0-9.]+, 'tokens_per_s': [0-9.]+\}$", res.stdout, re.M)
    assert final, res.stdout[-3000:]
    assert dict(epochs)["2"] == f"{float(final.group(1)):.4f}"
    assert re.search(r"^Saved checkpoint: Checkpoint\(filesystem=local, path=.*ray_train/checkpoint_",
                     res.stdout, re.M), res.stdout[-3000:]
    # Ray's "Setting up process group" ran our backend; Ray kept 1 checkpoint (num_to_keep=1).
    ckpts = sorted(p for p in (cluster.storage / "ray_train").glob("checkpoint_*") if p.is_dir())
    assert len(ckpts) == 1, ckpts
    assert {p.name for p in ckpts[0].iterdir()} == {"model.pt", "optimizer.pt", "state.json"}
    losses = {int(e): float(loss) for e, loss in epochs}
    kept = json.loads((ckpts[0] / "state.json").read_text())["epoch"]
    assert losses[kept] == min(losses.values()), (kept, losses)
