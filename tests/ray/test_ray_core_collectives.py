"""examples/ray/ray_core_collectives.py (the seed's Ray Core TP check) on a real
local Ray cluster of emulated TPU hosts.

Brings up v4-2x2x2 (2 hosts x 4 devices = 8 ranks, the smallest multi-host
slice; network namespaces as root, loopback addresses otherwise) with
tools/ray_cluster.sh, runs the example as a driver on the head (`exec`),
checks the seed's output lines (one per rank, sorted, all_reduce_sum = 36.0 =
1 + ... + 8, each rank where the seed's rank rule puts it, and the verdict)
and that tpu_dist spanned the two hosts over TCP, then brings the cluster
down and checks that no process, namespace, state dir or /dev/shm file of it
(Ray's or tpu_dist's) is left.

Run: .venv/bin/python -m pytest -m ray_cluster tests/ray/test_ray_core_collectives.py -v
"""

import os
import re
import time
from pathlib import Path

import pytest

from test_ray_cluster import IS_ROOT, PYTHON, ROOT, Cluster, _assert_down_clean, _shm

# In CI's selection. Once (before the actors exited with exit_actor instead
# of ray.kill) an actor aborted at kill time ("Mutex corrupt"); the test
# fails on any actor crash.
pytestmark = pytest.mark.ray_cluster

EXAMPLE = ROOT / "examples" / "ray" / "ray_core_collectives.py"
HOSTS, DEVICES = 2, 4
WORLD = HOSTS * DEVICES
RANK_LINE = re.compile(
    r"^Rank +(\d+) \(worker_id=(\d+), local_rank=(\d+), ip=([0-9.]+)\): "
    r"all_reduce_sum=\[([^\]]*)\]$")
VERDICT = re.compile(
    rf"^All {WORLD} TorchTPU-style ranks verified DTensor TP parity "
    r"\(max_abs_diff=(\d+\.\d{6})\) and all_reduce sum = 36\.0$")
TRANSPORT = re.compile(
    r"^tpu_dist transport: num_hosts=(\S+) \(hosts ([^;]+); shared memory inside a host\), "
    r"(\d+) TCP connections between ranks on different hosts \(ranks \[([0-9, ]*)\]\)$")


class _Cluster(Cluster):
    """tools/ray_cluster.sh with a state dir of this test's own, so that it
    never takes down a cluster of test_ray_cluster.py."""

    def __init__(self) -> None:
        super().__init__()
        self.state = Path("/tmp/tdray-rcc-test")
        self.env = dict(os.environ, TPU_DIST_RAY_STATE=str(self.state))


@pytest.fixture
def cluster() -> _Cluster:
    c = _Cluster()
    c.run("down")
    yield c
    c.run("down")  # whatever a failed assertion left up


def _tpu_dist_shm() -> set:
    # The example names its tpu_dist segments /dev/shm/tpud_ray_<run id>_...
    return {n for n in _shm() if n.startswith("tpud_ray_")}


def test_ray_core_collectives_on_v4_2x2x2(cluster: _Cluster) -> None:
    net = "netns" if IS_ROOT else "loopback"
    shm_before, tpud_before = _shm(), _tpu_dist_shm()
    t0 = time.monotonic()
    cluster.up("v4-2x2x2", "--net", net)
    t_up = time.monotonic() - t0

    res = cluster.run("exec", "--", str(PYTHON), str(EXAMPLE), "--topology", "2x2x2",
                      "--accelerator-type", "TPU-V4", "--report-transport",
                      "--timeout-s", "150", timeout=240)
    t_run = time.monotonic() - t0 - t_up
    out = res.stdout.splitlines()
    assert res.returncode == 0, f"the example failed:\n{res.stdout}\n{res.stderr[-6000:]}"
    # No actor died on the way out (ray.kill after destroy_process_group).
    for sign in ("Fatal Python error", "SIGABRT", "SIGSEGV"):
        assert sign not in res.stderr, f"an actor crashed:\n{res.stderr[-6000:]}"

    # One line per rank, sorted by rank; each rank where the seed's rule puts it.
    rows = [m.groups() for m in map(RANK_LINE.match, out) if m]
    assert [int(r[0]) for r in rows] == list(range(WORLD)), res.stdout
    host_ips = [f"10.250.0.{j + 2}" if net == "netns" else f"127.0.1.{j + 1}"
                for j in range(HOSTS)]
    for rank, worker_id, local_rank, ip, sums in rows:
        assert int(rank) == int(worker_id) * DEVICES + int(local_rank)
        assert 0 <= int(local_rank) < DEVICES
        assert ip == host_ips[int(worker_id)]
        assert sums == "36.0, 36.0, 36.0, 36.0"

    verdict = [m for m in map(VERDICT.match, out) if m]
    assert len(verdict) == 1, res.stdout
    assert float(verdict[0].group(1)) < 1e-4  # CPU: ~1e-7 (the seed's TPU: 0.002470)
    # The verdict comes right after the last rank line, as in the seed.
    assert out.index(verdict[0].string) == out.index(
        next(line for line in out if line.startswith(f"Rank  {WORLD - 1} "))) + 1

    # tpu_dist saw 2 hosts and its ranks talk TCP across them: the flat mesh
    # (4 x 4 cross-host pairs) plus one rail per local rank (local rank i of
    # each host; rail 0 is the host leaders' mesh, ranks 0 and 4).
    transport = [m for m in map(TRANSPORT.match, out) if m]
    assert len(transport) == 1, res.stdout
    num_hosts, ips, n_links, tcp_ranks = transport[0].groups()
    assert num_hosts == str(HOSTS)
    assert ips.split(", ") == host_ips
    assert int(n_links) == DEVICES * DEVICES + DEVICES
    assert [int(r) for r in tcp_ranks.split(",")] == list(range(WORLD))

    procs, suffix = cluster.footprint()
    assert (suffix != "") == (net == "netns")
    cluster.down()
    t_down = time.monotonic() - t0 - t_up - t_run
    _assert_down_clean(cluster, procs, suffix, shm_before)
    assert _tpu_dist_shm() - tpud_before == set(), "tpu_dist shm segments left"
    print(f"\nv4-2x2x2 --net {net}: up {t_up:.1f}s, ray_core_collectives {t_run:.1f}s, "
          f"down {t_down:.1f}s")
