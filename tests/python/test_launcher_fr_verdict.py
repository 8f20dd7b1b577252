"""tpurun prints torch's flight-recorder verdict after a hang (issue 33 items 1-2).

Two ranks under the built tpurun, group timeout 2 s, no flight-recorder
variable given: tpurun sets TPU_DIST_FLIGHT_RECORDER_DIR to its per-job
directory (under TMPDIR, here the test's tmp_path), and after the failure runs
`python -m torch.distributed.flight_recorder.fr_trace` with the ranks' own
Python (the venv's) and prints the verdict. Each case checks that the
launcher's output names the right rank and sequence id (a rank asleep before
an all_reduce, mismatched collectives, a recv nobody sends), and (the sleeper)
that the verdict comes within the op timeout + 5 s of the hang.

tpu_dist-ray-run's path (dump collection through the rank actors, SIGUSR1,
the verdict) runs with its actors replaced by local RankProcess objects (no
Ray cluster). Serial (python/CMakeLists.txt): it measures a latency.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TPU_DIST_BUILD_DIR", ROOT / "build"))
TPURUN = BUILD / "tpu_runtime" / "launcher" / "tpurun"
OP_TIMEOUT_S = 2.0
PREFIX = "tpurun: flight recorder: "

RANK_SCRIPT = r'''
import datetime, os, sys, time
import torch
import torch.distributed as dist
import tpu_dist  # noqa: F401

case = sys.argv[1]
dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=float(sys.argv[2])))
rank, world = dist.get_rank(), dist.get_world_size()
dist.all_reduce(torch.ones(4))  # ops 1 and 2 complete everywhere
dist.all_reduce(torch.ones(4))
try:
    if case == "sleeper":
        if rank == 1:
            time.sleep(60)  # stuck in user code: never issues op 3
        print(f"hang_at {time.time():.3f}", flush=True)
        dist.all_reduce(torch.ones(4))
    elif case == "recv":
        if rank == 0:
            time.sleep(60)  # never sends
        dist.recv(torch.zeros(4), src=0)
    elif case == "mismatch":
        if rank == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.all_gather([torch.zeros(4) for _ in range(world)], torch.ones(4))
except RuntimeError as e:
    print(f"rank {rank} failed: {e}", file=sys.stderr, flush=True)
    os._exit(1)  # no teardown: the launcher must still get every rank's dump
'''


def _tpurun(tmp_path: Path, case: str, *flags: str) -> tuple[int, list[tuple[float, str]]]:
    """Runs the case under tpurun; its exit code and (arrival time, line) pairs."""
    if not TPURUN.exists():
        pytest.skip(f"{TPURUN} not built (tools/build.sh tpurun)")
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    for name in ("TPU_DIST_FLIGHT_RECORDER_DIR", "TORCH_FR_DUMP_TEMP_FILE",
                 "TPU_DIST_FLIGHT_RECORDER_SIZE", "TPU_DIST_FR_ANALYZER"):
        env.pop(name, None)
    cmd = [str(TPURUN), "--nproc", "2", "--grace-period", "2s", "--timeout", "90s", *flags,
           "--", sys.executable, str(script), case, str(OP_TIMEOUT_S)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=tmp_path)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
        rc = proc.wait(timeout=100)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, lines


def _text(lines: list[tuple[float, str]]) -> str:
    return "\n".join(line for _, line in lines)


def _dumps(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "tpurun_fr").glob("*/attempt_0/*"))


def test_a_rank_asleep_before_an_all_reduce_is_named_within_the_timeout_plus_5s(
        tmp_path: Path) -> None:
    rc, lines = _tpurun(tmp_path, "sleeper")
    out = _text(lines)
    assert rc == 1, out
    hang_at = float(re.search(r"\[rank 0\] hang_at (\d+\.\d+)", out).group(1))
    verdict = [(t, line) for t, line in lines if line.startswith(PREFIX + "verdict: ")]
    assert verdict, out
    when, line = verdict[0]
    assert line == (PREFIX + "verdict: sequence id 3, tpu_dist:all_reduce: rank 1 never joined it "
                    "(behind: stuck before it, or in another op)"), out
    assert PREFIX + "  missing ranks: {1}" in out, out
    assert re.search(PREFIX + r"2 of 2 ranks dumped to .*/tpurun_fr/tpurun-[^/]+/attempt_0; "
                     r"torch's analyzer took", out), out
    assert _dumps(tmp_path) == ["tpu_dist_fr_rank_0", "tpu_dist_fr_rank_1"]
    took = when - hang_at
    print(f"verdict {took:.2f} s after the hang (op timeout {OP_TIMEOUT_S} s)")
    assert took < OP_TIMEOUT_S + 5, f"{took:.2f} s\n{out}"


def test_mismatched_collectives_name_the_other_op_and_the_sequence_id(tmp_path: Path) -> None:
    rc, lines = _tpurun(tmp_path, "mismatch")
    out = _text(lines)
    assert rc == 1, out
    # The analyzer compares every rank with the first dump it loads, so it
    # names either rank of the pair.
    assert (PREFIX + "verdict: sequence id 3, tpu_dist:all_gather: Culprit rank 0; Error type: "
            "COLLECTIVE_TYPE_MISMATCH, Expected collective type: 'all_gather' does not match "
            "found collective type: 'all_reduce'" in out
            or PREFIX + "verdict: sequence id 3, tpu_dist:all_reduce: Culprit rank 1; Error type: "
            "COLLECTIVE_TYPE_MISMATCH, Expected collective type: 'all_reduce' does not match "
            "found collective type: 'all_gather'" in out), out


def test_a_recv_nobody_sends_names_the_sender(tmp_path: Path) -> None:
    rc, lines = _tpurun(tmp_path, "recv")
    out = _text(lines)
    assert rc == 1, out
    # A p2p entry carries the group's last collective sequence number (2).
    assert (PREFIX + "verdict: sequence id 2, tpu_dist:recv 1<-0: rank 0 never joined it "
            "(behind: stuck before it, or in another op)") in out, out


def test_a_missing_analyzer_is_one_line_and_the_exit_status_stays(tmp_path: Path) -> None:
    rc, lines = _tpurun(tmp_path, "mismatch", "--fr-analyzer", str(tmp_path / "no_python"))
    out = _text(lines)
    assert rc == 1, out
    fr = [line for _, line in lines if line.startswith(PREFIX)]
    assert len(fr) == 1, out
    assert "2 of 2 ranks dumped to" in fr[0] and "no analyzer: cannot run" in fr[0], out
    assert out.splitlines()[-1].startswith("tpurun: rank "), out  # the summary comes last


class _Remote:
    def __init__(self, fn) -> None:
        self.remote = fn


class _LocalActor:
    """A RankProcess called in this process, as the launcher calls its actor."""

    def __init__(self) -> None:
        from tpu_dist.ray_rank_process import RankProcess

        self.rank_process = RankProcess()
        for name in ("poll", "stop", "flight_recorder_dump"):
            setattr(self, name, _Remote(getattr(self.rank_process, name)))


class _LocalRay:
    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        class RayActorError(Exception):
            pass

        class GetTimeoutError(Exception):
            pass

    @staticmethod
    def get(ref, timeout=None):
        return ref


def test_ray_run_prints_the_verdict_of_a_rank_asleep_before_an_all_reduce(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """tpu_dist-ray-run's supervision, dump collection and verdict, with the
    ranks' actors replaced by RankProcess objects in this process (no Ray)."""
    import tempfile

    from ranks import free_port
    from tpu_dist import fr_verdict, ray_launcher

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    attempt = object.__new__(ray_launcher._Attempt)
    attempt.ray, attempt.world, attempt.attempt, attempt.job_id = _LocalRay, 2, 0, "rayrun_test"
    attempt.args = ray_launcher._parse(["--poll-s", "0.05", "--grace-s", "2", "--", sys.executable,
                                        str(script), "sleeper", str(OP_TIMEOUT_S)])
    attempt.dumps = fr_verdict.dump_location(attempt.args.env, attempt.job_id, 0)
    assert attempt.dumps is not None and attempt.dumps.set_by_launcher
    attempt.places = [{"worker_id": 0, "local_rank": r, "ip": "127.0.0.1"} for r in range(2)]
    attempt.actors = [_LocalActor() for _ in range(2)]
    envs = ray_launcher.rank_environments(attempt.places, "127.0.0.1", free_port(), "rayrun_test",
                                          ray_launcher.new_job_secret(), 0, 0, {},
                                          fr_dir=attempt.dumps.dir)
    try:
        for rank, (actor, env) in enumerate(zip(attempt.actors, envs)):
            env.update(RANK=str(rank), WORLD_SIZE="2", OMP_NUM_THREADS="1")
            actor.rank_process.start(attempt.args.command, env, str(tmp_path))
        failure = attempt.supervise(deadline=time.monotonic() + 90)
    finally:
        for actor in attempt.actors:
            actor.rank_process.stop(0.5)
    done = time.time()
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert failure is not None and failure.rank == 0, out
    hang_at = float(re.search(r"\[rank 0\] hang_at (\d+\.\d+)", out).group(1))
    ray_prefix = "tpu_dist-ray-run: flight recorder: "
    assert (ray_prefix + "verdict: sequence id 3, tpu_dist:all_reduce: rank 1 never joined it "
            "(behind: stuck before it, or in another op)") in out, out
    assert ray_prefix + "2 of 2 ranks dumped to " + str(
        tmp_path / "tpu_dist_fr" / "rayrun_test" / "attempt_0_collected") in out, out
    took = done - hang_at  # an upper bound: the verdict is the last thing printed
    print(f"ray-run verdict within {took:.2f} s of the hang")
    assert took < OP_TIMEOUT_S + 5, f"{took:.2f} s\n{out}"


def test_fr_verdict_locations_and_a_missing_analyzer_are_one_line(tmp_path: Path) -> None:
    from tpu_dist import fr_verdict

    own = fr_verdict.dump_location({}, "job", 2)
    assert own is not None and own.set_by_launcher
    assert own.dir.endswith("/tpu_dist_fr/job/attempt_2")
    assert fr_verdict.dump_location({"TPU_DIST_FLIGHT_RECORDER_DIR": "/d"}, "j", 0) == \
        fr_verdict.DumpLocation("/d")
    assert fr_verdict.dump_location({"TORCH_FR_DUMP_TEMP_FILE": "/x/trace_"}, "j", 0) == \
        fr_verdict.DumpLocation("/x", "trace_")
    assert fr_verdict.dump_location({"TPU_DIST_FLIGHT_RECORDER_SIZE": "0"}, "j", 0) is None
    where = fr_verdict.DumpLocation(str(tmp_path))
    assert fr_verdict.flight_recorder_verdict(where, [0, 1], sys.executable, 30) == []
    (tmp_path / "tpu_dist_fr_rank_0").write_bytes(b"x")
    missing = fr_verdict.flight_recorder_verdict(where, [0, 1], str(tmp_path / "nope"), 30)
    assert len(missing) == 1 and "1 of 2 ranks dumped" in missing[0] and \
        "(none from ranks 1)" in missing[0] and "no analyzer: cannot run" in missing[0], missing
    assert "analyzer off" in fr_verdict.flight_recorder_verdict(where, [0], "", 30)[0]
