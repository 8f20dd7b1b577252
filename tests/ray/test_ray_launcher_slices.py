"""tpu_dist-ray-run on 2 slices (issue 32 items 4 and 5, the Ray launcher's part).

One cluster for the module: 3 x v6e-2x2 (`tools/ray_cluster.sh up v6e-2x2
--num-slices 3`: 3 single-host slices x 4 devices on 3 hosts, network
namespaces); every job takes 2 of the slices (8 ranks), the third is the
spare a lost slice is replaced by.

- `tpu_dist-ray-run --num-slices 2 -- slice_check`: the launcher numbers the
  slices by their hosts' TPU_NAME, gives every rank Ray's MEGASCALE_* (one
  coordinator, slice 0's host:8081), and each rank's own discovery puts it at
  rank = slice x 4 + device, slice rank // 4 of 2; the all_reduce sums 36.
- losing a slice's ranks: gemma_finetune --hsdp (2 epochs, --max-failures 1;
  the mesh is (dp_replicate 2 = MEGASCALE_NUM_SLICES, dp_shard 4)) under a
  wrapper that prints the MEGASCALE_* each rank was started with; during
  epoch 2 the test SIGKILLs every rank of slice 1 from outside. The launcher
  names slice 1 as lost (not slice 0), restarts all 8 ranks with MEGASCALE_*
  recomputed from the new actors (every restarted rank prints the right
  slice id, 2 slices and the coordinator the launcher announced), the run
  resumes from the epoch-1 checkpoint and its epoch losses equal an
  uninterrupted run's.
- losing a slice's node (last): the same job, with every process of slice
  1's Ray node SIGKILLed; Ray reschedules the slice onto the spare host and
  the restart's layout and MEGASCALE_* name the new slice, not the lost one;
  same resume and losses.

Afterwards: no process, namespace, state dir or /dev/shm file is left.

Run: .venv/bin/python -m pytest -m ray_cluster tests/ray/test_ray_launcher_slices.py -v -s
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
from typing import Callable, Dict, List

import pytest

from test_ray_cluster import (IS_ROOT, ROOT, SCRIPT, Cluster, _assert_down_clean,
                              _processes, _shm)

pytestmark = pytest.mark.ray_cluster

BUILD = Path(os.environ.get("TPU_DIST_BUILD_DIR", ROOT / "build"))
LAUNCHER = ROOT / ".venv" / "bin" / "tpu_dist-ray-run"
WRAPPER = ROOT / "tests" / "ray" / "megascale_env_exec.sh"
SPEC, GROUP = "v6e-2x2", "v6e-4"  # the cluster's slice; its TPU_NAME is GROUP-<slice>
SLICES, DEVICES = 2, 4  # the job's slices; one host of 4 devices per slice
CLUSTER_SLICES = 3  # one spare: a lost slice's bundles move there
WORLD = SLICES * DEVICES
ARGS = ["--topology", "2x2", "--accelerator-type", "TPU-V6E", "--num-slices", str(SLICES)]
# 16 steps an epoch: long enough to kill a slice mid-epoch 2.
FINETUNE_ARGS = ["--dataset_split", "train[:256]", "--max_seq_len", "64",
                 "--batch_size_per_device", "2", "--num_epochs", "2", "--bf16=false",
                 "--timeout", "120s", "--hsdp"]
HSDP_LINE = (f"[rank 0] HSDP: mesh {SLICES} x {DEVICES} (dp_replicate x dp_shard), dp_replicate "
             f"from the job's {SLICES} slice(s)")
EPOCH_LINE = re.compile(r"^\[rank 0\] Epoch (\d+)/(\d+) \| loss=(\d+\.\d{4}) \| ")
STARTED = re.compile(rf"attempt (\d+): {WORLD} ranks started, .*\(rank:host/pid (.*)\)$")
LAYOUT = re.compile(
    rf"attempt (\d+): {SLICES} slices: slice 0 \(TPU_NAME ({GROUP}-\d), ranks 0-3, host "
    r"([0-9.]+)\); slice 1 \(TPU_NAME (" + GROUP + r"-\d), ranks 4-7, host ([0-9.]+)\); "
    r"MEGASCALE_COORDINATOR_ADDRESS=([0-9.]+):8081 MEGASCALE_PORT=8081 "
    rf"MEGASCALE_NUM_SLICES={SLICES}, MEGASCALE_SLICE_ID by rank 0,0,0,0,1,1,1,1$")
ENV_LINE = re.compile(
    r"^\[rank (\d)\] megascale_env: restart=(\d) LOCAL_RANK=(\d) TPU_NAME=(\S+) "
    r"MEGASCALE_COORDINATOR_ADDRESS=(\S+) MEGASCALE_PORT=(\d+) MEGASCALE_NUM_SLICES=(\d+) "
    r"MEGASCALE_SLICE_ID=(\d+)$")
TIMES: Dict[str, float] = {}


class _Cluster(Cluster):
    def __init__(self) -> None:
        super().__init__()
        self.state = Path("/tmp/tdray-launcher-slices")
        self.env = dict(os.environ, TPU_DIST_RAY_STATE=str(self.state))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    if not IS_ROOT:
        pytest.skip("network namespaces need root")
    for binary in ("slice_check", "gemma_finetune"):
        if not (BUILD / "examples" / binary).exists():
            pytest.fail(f"{BUILD}/examples/{binary} is not built (tools/build.sh)")
    c = _Cluster()
    c.run("down")
    shm_before = _shm()
    t0 = time.monotonic()
    c.up(SPEC, "--net", "netns", "--num-slices", str(CLUSTER_SLICES))
    TIMES["up"] = time.monotonic() - t0
    procs, suffix = c.footprint()
    c.storage = tmp_path_factory.mktemp("ray_launcher_slices")
    c.rank_pids = set()  # every rank the launcher announced (other sessions run ours too)
    yield c
    t0 = time.monotonic()
    c.down()
    TIMES["down"] = time.monotonic() - t0
    assert c.rank_pids, "no rank pid was recorded"
    left = [pid for pid in sorted(c.rank_pids) if _is_rank(pid)]
    assert not left, f"rank processes left after down: {left}"
    _assert_down_clean(c, procs, suffix, shm_before)
    print(f"\n{CLUSTER_SLICES} x {SPEC}: " + ", ".join(f"{k} {v:.1f}s" for k, v in TIMES.items()))


def _is_rank(pid: int) -> bool:
    try:
        return str(BUILD / "examples") in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
            errors="replace")
    except OSError:
        return False


def _record_pids(c: _Cluster, text: str) -> None:
    """Adds the rank pids of every attempt's "rank:host/pid" list."""
    for m in map(STARTED.search, text.splitlines()):
        if m:
            c.rank_pids |= {int(item.split("/")[-1]) for item in m.group(2).split(", ")}


def _layout(text: str, attempt: int) -> re.Match:
    m = next((m for m in map(LAYOUT.search, text.splitlines()) if m and m.group(1) == str(attempt)),
             None)
    assert m, f"no slice layout line for attempt {attempt}:\n{text[-4000:]}"
    # Each job slice is one whole cluster slice, on its own host; the
    # coordinator is slice 0's host.
    assert m.group(2) != m.group(4), m.group(0)
    assert m.group(3) != m.group(5) and m.group(6) == m.group(3), m.group(0)
    return m


def test_launcher_runs_slice_check_on_two_slices(cluster: _Cluster) -> None:
    t0 = time.monotonic()
    res = cluster.run("exec", "--", str(LAUNCHER), *ARGS, "--",
                      str(BUILD / "examples" / "slice_check"), timeout=300)
    TIMES["slice_check"] = time.monotonic() - t0
    text = res.stdout + res.stderr
    _record_pids(cluster, res.stderr)
    assert res.returncode == 0, text[-6000:]
    _layout(res.stderr, 0)
    ok = [line for line in res.stdout.splitlines()
          if line.endswith(f"allreduce {WORLD * (WORLD + 1) // 2} "
                           f"(expected {WORLD * (WORLD + 1) // 2}) OK")]
    assert len(ok) == WORLD, res.stdout
    for r in range(WORLD):  # each rank's own discovery: slice-major, slice r // 4 of 2
        pattern = (rf"^\[rank {r}\] slice_check: rank {r}/{WORLD} local {r % DEVICES}/{DEVICES} "
                   rf"host {r // DEVICES}/{SLICES} slice {r // DEVICES}/{SLICES} \(v6e 2x2, ")
        assert any(re.match(pattern, line) for line in ok), (pattern, res.stdout)
    assert f"reserved {SLICES} x TPU-V6E 2x2: 2 hosts x 4 devices" in res.stderr
    assert f"all {WORLD} ranks succeeded" in res.stderr
    print("\n" + "\n".join(line for line in res.stderr.splitlines()
                            if line.startswith("tpu_dist-ray-run: ")) + "\n" + ok[-1])


def _epoch_losses(lines: List[str]) -> Dict[int, str]:
    return {int(m.group(1)): m.group(3) for m in map(EPOCH_LINE.match, lines) if m}


class _KilledRun:
    """The 2-epoch --hsdp fine-tune under --max-failures 1 and the wrapper;
    `kill(layout of attempt 0, rank pids of attempt 0)` runs when rank 0
    reports epoch 2 step 4 (after the epoch-1 checkpoint), once."""

    def __init__(self, cluster: _Cluster, run_name: str,
                 kill: Callable[[re.Match, Dict[int, int]], None]) -> None:
        cmd = [str(SCRIPT), "exec", "--", str(LAUNCHER), *ARGS, "--max-failures", "1", "--",
               str(WRAPPER), str(BUILD / "examples" / "gemma_finetune"), *FINETUNE_ARGS,
               "--storage_path", str(cluster.storage), "--run_name", run_name]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.out: List[str] = []
        self.arrived: List[float] = []  # when each line of `out` came
        self.killed_at = 0.0
        pids: Dict[int, int] = {}

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.out.append(line.rstrip("\n"))
                self.arrived.append(time.monotonic())
                m = STARTED.search(line)
                if m and m.group(1) == "0":
                    pids.update({int(item.split(":")[0]): int(item.split("/")[-1])
                                 for item in m.group(2).split(", ")})
                if line.startswith("[rank 0] Epoch 2/2 step 4/16") and pids \
                        and not self.killed_at:
                    self.killed_at = time.monotonic()  # once: attempt 1 passes here again
                    kill(_layout("\n".join(self.out), 0), pids)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            self.rc = proc.wait(timeout=400)
        finally:
            proc.kill()
            proc.wait()
            reader.join(timeout=10)
        self.seconds = time.monotonic() - t0
        self.text = "\n".join(self.out)
        _record_pids(cluster, self.text)

    def when(self, pattern: str, after: float = 0.0) -> float:
        """Seconds from the kill to the first line matching `pattern` that came
        after `after` seconds from the kill."""
        return next(t for t, line in zip(self.arrived, self.out)
                    if t >= self.killed_at + after and re.search(pattern, line)) - self.killed_at

    def check_restart(self, lost_name: str, lost_host: str, expected: Dict[int, str]) -> re.Match:
        """Slice 1 (`lost_name` on `lost_host`), and only it, named lost; every
        rank of attempt 1 started with the MEGASCALE_* of attempt 1's freshly
        computed layout (returned); resumed from the epoch-1 checkpoint to the
        `expected` epoch losses."""
        text, out = self.text, self.out
        assert self.rc == 0, text[-6000:]
        assert self.killed_at, text[-4000:]
        lost = (f"tpu_dist-ray-run: slice 1 (TPU_NAME {lost_name}, ranks 4-7, host {lost_host}) "
                "lost: all 4 of its ranks failed before tpu_dist-ray-run stopped the job")
        assert lost in text, text[-4000:]
        assert "tpu_dist-ray-run: slice 0 (" not in text
        assert "restarting all ranks (restart 1 of 1)" in text
        second = _layout(text, 1)
        coordinator = f"{second.group(6)}:8081"
        seen: Dict[int, tuple] = {}
        for m in map(ENV_LINE.match, out):
            if m and m.group(2) == "1":
                seen[int(m.group(1))] = m.groups()[2:]
        assert sorted(seen) == list(range(WORLD)), text[-4000:]
        for r, (local, name, coord, port, slices, slice_id) in seen.items():
            assert (local, coord, port, slices, slice_id) == \
                (str(r % DEVICES), coordinator, "8081", str(SLICES), str(r // DEVICES)), \
                (r, seen[r])
            assert name == (second.group(2) if r < DEVICES else second.group(4)), (r, seen[r])
        assert re.search(r"^\[rank 0\] Resuming from \S+ \(epoch 2, step 0\)$", text, re.M), \
            text[-4000:]
        assert f"all {WORLD} ranks succeeded" in text and "(after 1 restart)" in text
        assert out.count(HSDP_LINE) == 2, text[-4000:]  # each attempt: 2 slices -> dp_replicate 2
        assert [int(m.group(1)) for m in map(EPOCH_LINE.match, out) if m] == [1, 2], text[-4000:]
        assert _epoch_losses(out) == expected
        return second

    def report(self, what: str) -> None:
        print("\n" + "\n".join(line for line in self.out if line.startswith("tpu_dist-ray-run: ")))
        resumed = self.when(r"Resuming from")
        print(f"{what} -> slice named lost {self.when(r'slice 1 .* lost: '):.1f} s, "
              f"-> all stopped {self.when(r'stopped the other'):.1f} s, "
              f"-> attempt 1 started {self.when(r'attempt 1: 8 ranks started'):.1f} s, "
              f"-> resumed {resumed:.1f} s, -> first progress line of attempt 1 "
              f"{self.when(r'Epoch 2/2 step', resumed):.1f} s; the run {self.seconds:.1f} s")


EXPECTED: Dict[int, str] = {}  # the uninterrupted run's epoch losses


def test_a_lost_slice_is_named_and_restarted_with_fresh_megascale_values(
        cluster: _Cluster) -> None:
    t0 = time.monotonic()
    base = cluster.run("exec", "--", str(LAUNCHER), *ARGS, "--",
                       str(BUILD / "examples" / "gemma_finetune"), *FINETUNE_ARGS,
                       "--storage_path", str(cluster.storage), "--run_name", "uninterrupted",
                       timeout=400)
    TIMES["finetune_uninterrupted"] = time.monotonic() - t0
    _record_pids(cluster, base.stderr)
    assert base.returncode == 0, base.stdout[-4000:] + base.stderr[-4000:]
    assert HSDP_LINE in base.stdout.splitlines(), base.stdout[-3000:]
    EXPECTED.update(_epoch_losses(base.stdout.splitlines()))
    assert sorted(EXPECTED) == [1, 2], base.stdout[-3000:]

    def kill_slice_1(_layout0: re.Match, pids: Dict[int, int]) -> None:
        for r in range(DEVICES, WORLD):  # every rank of slice 1, from outside
            os.kill(pids[r], signal.SIGKILL)

    run = _KilledRun(cluster, "killed", kill_slice_1)
    TIMES["finetune_slice_killed"] = run.seconds
    first = _layout(run.text, 0)
    run.check_restart(first.group(4), first.group(5), EXPECTED)
    assert re.search(r"tpu_dist-ray-run: rank [4-7] \(slice 1, worker 0, device \d, [0-9.]+\) "
                     r"killed by SIGKILL", run.text), run.text[-4000:]
    runs = {name: [json.loads(line) for line in
                   (cluster.storage / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("uninterrupted", "killed")}
    assert [m["loss"] for m in runs["killed"]] == [m["loss"] for m in runs["uninterrupted"]]
    run.report("slice 1's ranks killed")


def test_a_lost_node_is_replaced_by_the_spare_slice_with_fresh_megascale_values(
        cluster: _Cluster) -> None:
    """Last in the module: it kills a Ray node. Every process of slice 1's
    node (its raylet, the rank actors and, with them, the ranks) is SIGKILLed;
    Ray marks the node dead after missed heartbeats and reschedules slice 1's
    bundles onto the spare slice; the restart places its new actors there and
    computes the layout again: the lost slice's TPU_NAME and host are gone
    from it and every rank gets MEGASCALE_* for the new layout."""

    def kill_node(layout0: re.Match, _pids: Dict[int, int]) -> None:
        node = f"n{int(layout0.group(5).split('.')[-1]) - 1}"  # 10.250.0.(I+1) is node I
        root = next(int(line.split()[1]) for line in
                    (cluster.state / "pids").read_text().splitlines() if line.split()[0] == node)
        for pid, _start, sid in _processes():
            if sid == root:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    if not EXPECTED:
        pytest.skip("needs the uninterrupted run of the test before")
    run = _KilledRun(cluster, "node_lost", kill_node)
    TIMES["finetune_node_killed"] = run.seconds
    first = _layout(run.text, 0)
    second = run.check_restart(first.group(4), first.group(5), EXPECTED)
    assert first.group(5) not in (second.group(3), second.group(5)), second.group(0)
    assert first.group(4) not in (second.group(2), second.group(4)), second.group(0)
    assert re.search(r"tpu_dist-ray-run: rank [4-7] \(slice 1, worker 0, device \d, [0-9.]+\) "
                     r"its Ray actor died or hung", run.text), run.text[-4000:]
    run.report("slice 1's node killed")
