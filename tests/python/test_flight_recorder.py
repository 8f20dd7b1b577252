"""tpu_dist's flight recorder, read by torch's own analyzer (issue 33 item 2).

Three hangs on 2 ranks (env://, group timeout 2 s), each with
TPU_DIST_FLIGHT_RECORDER_DIR set: the dump must exist on every rank, and
`python -m torch.distributed.flight_recorder.fr_trace <dir>` (the pinned
torch's analyzer, run as a subprocess) must name the culprit rank and the
sequence id:

* mismatched collectives: rank 0 all_reduce, rank 1 all_gather at op 3;
* a rank stuck in a sleep before the all_reduce at op 3 (rank 1 never
  issues it: its dump comes from rank 0's request through the store);
* a recv nobody sends (rank 1 waits on rank 0, which sleeps).

Plus: an on-demand dump (tpu_dist.dump_flight_recorder) of healthy ops that
the analyzer matches without errors, and TPU_DIST_FLIGHT_RECORDER_SIZE
bounding (and 0 turning off) the ring.
"""

from __future__ import annotations

import datetime
import os
import pickle
import subprocess
import sys
import time

import pytest

from ranks import run_ranks

TIMEOUT_S = 2.0
# How long a rank waits for its own dump file. Generous: under a loaded CI box
# a dump requested by the other rank took over 6 s to appear (issue 36
# session, load 5-8); how fast the launcher prints the verdict is asserted by
# test_launcher_fr_verdict.py, not here.
DUMP_WAIT_S = TIMEOUT_S + 20


def _init(rank: int, world: int) -> None:
    import torch.distributed as dist
    import tpu_dist  # noqa: F401

    dist.init_process_group("tpu_dist", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))


def _warm_up() -> None:
    """Ops 1 and 2: completed on every rank."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4))


def _wait_for(path: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return os.path.exists(path)


def _mismatched(rank: int, world: int, dump_dir: str) -> str:
    import torch
    import torch.distributed as dist

    _init(rank, world)
    _warm_up()
    error = ""
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.all_gather([torch.zeros(4) for _ in range(world)], torch.ones(4))
    except RuntimeError as e:
        error = str(e)
    assert _wait_for(os.path.join(dump_dir, f"tpu_dist_fr_rank_{rank}"), DUMP_WAIT_S)
    dist.destroy_process_group()
    return error


def _sleeper(rank: int, world: int, dump_dir: str) -> str:
    import torch
    import torch.distributed as dist

    _init(rank, world)
    _warm_up()
    error = ""
    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
        except RuntimeError as e:
            error = f"{time.monotonic() - start:.1f}s: {e}"
    else:
        # Stuck in user code: never reaches op 3. Its dump comes from rank 0's
        # request, seen by this rank's watcher within a second.
        assert _wait_for(os.path.join(dump_dir, f"tpu_dist_fr_rank_{rank}"), DUMP_WAIT_S)
    assert _wait_for(os.path.join(dump_dir, f"tpu_dist_fr_rank_{rank}"), DUMP_WAIT_S)
    if rank == 0:
        # The TCPStore (rank 0) outlives rank 1's poll that sees the request
        # (every second): a fixed 0.5 s here lost that race under load.
        _wait_for(os.path.join(dump_dir, "tpu_dist_fr_rank_1"), DUMP_WAIT_S)
    dist.destroy_process_group()
    return error


def _recv_nobody_sends(rank: int, world: int, dump_dir: str) -> str:
    import torch
    import torch.distributed as dist

    _init(rank, world)
    _warm_up()
    error = ""
    if rank == 1:
        try:
            dist.recv(torch.zeros(4), src=0)
        except RuntimeError as e:
            error = str(e)
    assert _wait_for(os.path.join(dump_dir, f"tpu_dist_fr_rank_{rank}"), DUMP_WAIT_S)
    if rank == 0:
        time.sleep(0.5)
    dist.destroy_process_group()
    return error


def _on_demand(rank: int, world: int, prefix: str) -> list[str]:
    import torch
    import torch.distributed as dist
    import tpu_dist

    _init(rank, world)
    _warm_up()
    out = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(out, torch.ones(4))
    dist.broadcast(torch.ones(3), src=0)
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    else:
        dist.recv(torch.zeros(2), src=0)
    dist.barrier()
    paths = tpu_dist.dump_flight_recorder(prefix)
    dist.destroy_process_group()
    return paths


def _ring_size(rank: int, world: int) -> int:
    import torch
    import torch.distributed as dist
    from tpu_dist import _C

    _init(rank, world)
    for _ in range(7):
        dist.all_reduce(torch.ones(2))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    trace = _C._flight_recorder_trace(backend)
    dist.destroy_process_group()
    return len(pickle.loads(trace)["entries"]) if trace else -1


def _analyze(dump_dir: str) -> str:
    """torch's analyzer on the dumps, as a user runs it."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                        dump_dir], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    return out


def _run(fn, dump_dir: str) -> list[str]:
    env = {"TPU_DIST_FLIGHT_RECORDER_DIR": dump_dir}
    return run_ranks(fn, 2, dump_dir, timeout_s=60, env=env)


def _dump(dump_dir: str, rank: int) -> dict:
    with open(os.path.join(dump_dir, f"tpu_dist_fr_rank_{rank}"), "rb") as f:
        return pickle.load(f)


def test_mismatched_collectives_name_the_rank_and_sequence_id(tmp_path) -> None:
    d = str(tmp_path / "fr")
    errors = _run(_mismatched, d)
    assert all(errors), errors
    assert sorted(os.listdir(d)) == ["tpu_dist_fr_rank_0", "tpu_dist_fr_rank_1"]
    out = _analyze(d)
    assert "Collective sequence number: 3 has errors" in out, out
    # The analyzer compares every rank with the first dump it loaded (directory
    # order) and names the other one: either reading names the pair.
    assert ("Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: "
            "'all_reduce' does not match found collective type: 'all_gather'" in out
            or "Culprit rank 0; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: "
            "'all_gather' does not match found collective type: 'all_reduce'" in out), out
    op3 = [e for e in _dump(d, 1)["entries"] if e["collective_seq_id"] == 3]
    assert [e["profiling_name"] for e in op3] == ["tpu_dist:all_gather"], op3
    assert op3[0]["state"] == "started" and op3[0]["retired"], op3


def test_a_rank_stuck_before_an_all_reduce_is_named_missing(tmp_path) -> None:
    d = str(tmp_path / "fr")
    errors = _run(_sleeper, d)
    assert "DEADLINE_EXCEEDED" in errors[0] or "timed out" in errors[0], errors
    assert sorted(os.listdir(d)) == ["tpu_dist_fr_rank_0", "tpu_dist_fr_rank_1"]
    out = _analyze(d)
    assert "Not all ranks joining collective, sequence number: 3" in out, out
    assert "missing ranks: {1}" in out, out
    assert "collective: tpu_dist:all_reduce" in out, out
    # Rank 1 completed ops 1-2 and never recorded op 3.
    ops1 = [(e["collective_seq_id"], e["state"]) for e in _dump(d, 1)["entries"]]
    assert ops1[-2:] == [(1, "completed"), (2, "completed")], ops1


def test_a_recv_nobody_sends_names_the_sender(tmp_path) -> None:
    d = str(tmp_path / "fr")
    errors = _run(_recv_nobody_sends, d)
    assert errors[1], errors
    assert sorted(os.listdir(d)) == ["tpu_dist_fr_rank_0", "tpu_dist_fr_rank_1"]
    out = _analyze(d)
    # A p2p entry carries the group's last collective sequence number (2), as
    # in torch's own recorders; the analyzer prints that one.
    assert "Not all ranks joining collective, sequence number: 2" in out, out
    assert "collective: tpu_dist:recv 1<-0" in out, out
    assert "missing ranks: {0}" in out, out
    recv = [e for e in _dump(d, 1)["entries"] if e["is_p2p"]]
    assert len(recv) == 1 and recv[0]["p2p_seq_id"] == 1 and recv[0]["state"] == "started", recv


def test_an_on_demand_dump_of_healthy_ops_matches_everywhere(tmp_path) -> None:
    prefix = str(tmp_path / "ondemand" / "trace_")
    paths = run_ranks(_on_demand, 2, prefix, timeout_s=60)
    assert paths == [[prefix + "0"], [prefix + "1"]], paths
    out = _analyze(str(tmp_path / "ondemand"))
    assert "has errors" not in out and "Not all ranks joining" not in out, out
    with open(prefix + "0", "rb") as f:
        d0 = pickle.load(f)
    assert d0["version"] == "2.10"
    assert d0["pg_config"]["0"]["ranks"] == "[0, 1]", d0["pg_config"]
    names = [e["profiling_name"] for e in d0["entries"]]
    assert names == ["tpu_dist:all_reduce", "tpu_dist:all_reduce", "tpu_dist:all_gather",
                     "tpu_dist:broadcast", "tpu_dist:send 0->1", "tpu_dist:barrier"], names
    assert all(e["state"] == "completed" for e in d0["entries"]), d0["entries"]
    ag = d0["entries"][2]
    assert ag["input_sizes"] == [[4]] and ag["output_sizes"] == [[4], [4]], ag


@pytest.mark.parametrize("size,expected", [("5", 5), ("0", -1)])
def test_the_ring_is_bounded_by_the_env_size(size: str, expected: int) -> None:
    got = run_ranks(_ring_size, 2, timeout_s=60, env={"TPU_DIST_FLIGHT_RECORDER_SIZE": size})
    assert got == [expected, expected], got
