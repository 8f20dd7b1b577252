"""tools/ray_cluster.sh: a real local Ray cluster of emulated TPU hosts.

Each case brings a slice up, checks what Ray derived from the emulated TPU
hosts (resources and labels per node), reserves the slice with the real
ray.util.tpu.slice_placement_group and places one actor per bundle
(tests/ray/slice_probe.py), checks what each actor sees, then brings the
cluster down and checks that no process, namespace, /etc/netns entry, state
dir or /dev/shm file of it is left.

Slices: v4-2x2x2 (2 hosts x 4 devices: the smallest multi-host slice that
Ray's TPU code and tpu_runtime agree on; a 2-host x 2-device TPU slice does
not exist in either) in network namespaces and on loopback addresses, and the
seed's tpu7x-2x2x2 (2 hosts x 8 devices, RAY_TPU_RESOURCE_PER_CHIP=2).

Run: .venv/bin/python -m pytest -m ray_cluster tests/ray -v
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest

pytestmark = pytest.mark.ray_cluster

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "ray_cluster.sh"
PYTHON = ROOT / ".venv" / "bin" / "python"
PROBE = ROOT / "tests" / "ray" / "slice_probe.py"
CLUSTER = "ray-torchtpu-cluster"
TIMEOUT_S = 300
# /dev/shm names other code on this machine may create meanwhile (tpu_dist's
# shm collectives, torch, Python multiprocessing): not Ray's.
FOREIGN_SHM = ("tpud_", "torch_", "sem.", "psm_")

IS_ROOT = os.geteuid() == 0 and shutil.which("ip") is not None


@dataclass(frozen=True)
class Slice:
    spec: str            # tools/ray_cluster.sh SPEC
    net: str             # netns | loopback
    topology: str        # chips, as ScalingConfig / slice_placement_group take it
    accelerator: str     # the seed's --accelerator-type
    hosts: int
    devices_per_host: int
    per_chip: int        # RAY_TPU_RESOURCE_PER_CHIP
    group: str           # worker group = TPU_ACCELERATOR_TYPE, e.g. v4-16
    pod_type: str        # Ray's normalized pod type label
    torch_topology: str  # TORCH_TPU_TOPOLOGY

    def host_ip(self, j: int) -> str:
        return f"10.250.0.{j + 2}" if self.net == "netns" else f"127.0.1.{j + 1}"

    def head_ip(self) -> str:
        return "10.250.0.1" if self.net == "netns" else "127.0.1.254"

    def hostname(self, j: int) -> str:
        if self.net == "netns":
            return f"{self.group}-0-{j}.{CLUSTER}-headless"
        return self.host_ip(j)


V4_NETNS = Slice("v4-2x2x2", "netns", "2x2x2", "TPU-V4", 2, 4, 1, "v4-16", "v4-16", "2,2,2")
V4_LOOPBACK = Slice("v4-2x2x2", "loopback", "2x2x2", "TPU-V4", 2, 4, 1, "v4-16", "v4-16",
                    "2,2,2")
TPU7X_NETNS = Slice("tpu7x-2x2x2", "netns", "2x2x2", "TPU-V7X", 2, 8, 2, "tpu7x-16", "v7x-16",
                    "2,2,2,2")


class Cluster:
    """Drives tools/ray_cluster.sh with a state dir of its own."""

    def __init__(self) -> None:
        # Fixed, so that a run killed mid-test is cleaned up by the next one.
        self.state = Path("/tmp/tdray-test")
        self.env = dict(os.environ, TPU_DIST_RAY_STATE=str(self.state))

    def run(self, *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def up(self, *args: str) -> subprocess.CompletedProcess:
        res = self.run("up", *args)
        assert res.returncode == 0, f"up {args} failed:\n{res.stdout}\n{res.stderr}"
        return res

    def down(self) -> subprocess.CompletedProcess:
        res = self.run("down")
        assert res.returncode == 0, f"down failed:\n{res.stdout}\n{res.stderr}"
        return res

    def probe(self, s: Slice) -> Dict[str, Any]:
        res = self.run("exec", "--", str(PYTHON), str(PROBE), "--topology", s.topology,
                       "--accelerator-type", s.accelerator)
        assert res.returncode == 0, f"slice probe failed:\n{res.stdout}\n{res.stderr[-4000:]}"
        return json.loads(res.stdout.strip().splitlines()[-1])

    def footprint(self) -> Tuple[Set[Tuple[int, str]], str]:
        """(pid, starttime) of every process of the cluster's node sessions and
        namespaces, and the namespace suffix ('' in loopback mode)."""
        roots = []
        for line in (self.state / "pids").read_text().split("\n"):
            if line.strip():
                roots.append(int(line.split()[1]))
        suffix_file = self.state / "netns_suffix"
        suffix = suffix_file.read_text().strip() if suffix_file.exists() else ""
        procs = {(pid, start) for pid, start, sid in _processes() if sid in roots}
        for ns in _namespaces(suffix):
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                 check=False).stdout
            wanted = {int(p) for p in out.split()}
            procs |= {(pid, start) for pid, start, _ in _processes() if pid in wanted}
        return procs, suffix


def _processes() -> List[Tuple[int, str, int]]:
    """(pid, starttime, session id) of every process."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X"):  # exited, waiting to be reaped: gone for our purposes
            continue
        out.append((int(d.name), fields[19], int(fields[3])))
    return out


def _namespaces(suffix: str) -> List[str]:
    if not suffix:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[0].endswith(suffix)]


def _processes_mentioning(text: str) -> List[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{d.name}: {cmd[:160]}")
    return found


def _shm() -> Set[str]:
    return set(os.listdir("/dev/shm"))


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    c.run("down")
    yield c
    c.run("down")  # whatever a failed assertion left up


def _assert_down_clean(c: Cluster, procs: Set[Tuple[int, str]], suffix: str,
                       shm_before: Set[str]) -> None:
    # SIGKILLed processes with large address spaces take a moment to exit.
    deadline = time.monotonic() + 15
    while True:
        alive = {(pid, start) for pid, start, _ in _processes()}
        if not procs & alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not procs & alive, f"processes of the cluster survived down: {sorted(procs & alive)}"
    assert not _processes_mentioning(str(c.state) + "/"), "a process still uses the state dir"
    assert not c.state.exists(), f"{c.state} is left"
    if suffix:
        assert not _namespaces(suffix), f"namespaces left: {_namespaces(suffix)}"
        left = list(Path("/etc/netns").glob(f"*_{suffix}"))
        assert not left, f"/etc/netns entries left: {left}"
    new_shm = sorted(n for n in _shm() - shm_before if not n.startswith(FOREIGN_SHM))
    assert not new_shm, f"/dev/shm files left: {new_shm}"


def _check_nodes(s: Slice, nodes: List[Dict[str, Any]]) -> Dict[str, int]:
    """Checks what Ray derived per node; returns node id -> TPU worker id."""
    heads = [n for n in nodes if "node:__internal_head__" in n["resources"]]
    assert len(heads) == 1 and heads[0]["ip"] == s.head_ip()
    assert "TPU" not in heads[0]["resources"] and not heads[0]["resources"].get("CPU")
    tpu = sorted((n for n in nodes if n["resources"].get("TPU")),
                 key=lambda n: int(n["labels"]["ray.io/tpu-worker-id"]))
    assert len(tpu) == s.hosts, f"expected {s.hosts} TPU nodes, got {len(tpu)}"
    slice_name = f"{s.group}-0"
    worker_of = {}
    for j, n in enumerate(tpu):
        res, labels = n["resources"], n["labels"]
        assert n["ip"] == s.host_ip(j)
        assert res["TPU"] == s.devices_per_host
        assert res["CPU"] == s.devices_per_host
        assert res[f"accelerator_type:{s.accelerator}"] == 1
        assert res[slice_name] == 1
        assert (f"TPU-{s.pod_type}-head" in res) == (j == 0)
        assert labels["ray.io/tpu-worker-id"] == str(j)
        assert labels["ray.io/tpu-slice-name"] == slice_name
        assert labels["ray.io/tpu-topology"] == s.topology
        assert labels["ray.io/tpu-pod-type"] == s.pod_type
        assert labels["ray.io/accelerator-type"] == s.accelerator
        assert labels["ray.io/node-group"] == s.group
        worker_of[n["id"]] = j
    return worker_of


def _check_slice(s: Slice, probe: Dict[str, Any], worker_of: Dict[str, int]) -> None:
    sl = probe["slice"]
    n_dev = s.hosts * s.devices_per_host
    assert sl["num_bundles"] == n_dev
    assert sl["num_hosts"] == s.hosts
    assert sl["devices_per_host"] == s.devices_per_host
    assert sl["bundle_resources"] == {"TPU": 1, "CPU": 1}
    assert sl["bundle_label_selector"] == [{"ray.io/tpu-slice-name": f"{s.group}-0"}] * n_dev
    # The slice was reserved through its worker 0 (TPU-<pod>-head) ...
    assert [worker_of[n] for n in sl["head_reservation_nodes"]] == [0]
    # ... and one bundle per device landed on every host.
    per_host = [0] * s.hosts
    for node in sl["bundle_nodes"]:
        per_host[worker_of[node]] += 1
    assert per_host == [s.devices_per_host] * s.hosts


def _check_actors(s: Slice, probe: Dict[str, Any], worker_of: Dict[str, int]) -> None:
    hostnames = [s.hostname(j) for j in range(s.hosts)]
    slicebuilder = [f"{h}:{8471 + l}" for h in hostnames for l in range(s.devices_per_host)]
    ids_per_host: List[List[int]] = [[] for _ in range(s.hosts)]
    ranks = []
    for i, a in enumerate(probe["actors"]):
        j = worker_of[a["node_id"]]
        assert a["node_id"] == probe["slice"]["bundle_nodes"][i]
        assert a["ip"] == s.host_ip(j)
        env = a["env"]
        assert env["TPU_WORKER_ID"] == str(j)
        assert env["TPU_WORKER_HOSTNAMES"] == ",".join(hostnames)
        assert env["TPU_NAME"] == f"{s.group}-0" == a["pod_name"]
        assert env["TPU_ACCELERATOR_TYPE"] == s.group
        assert env["TPU_TOPOLOGY"] == s.topology
        assert env["TORCH_TPU_TOPOLOGY"] == s.torch_topology
        assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(slicebuilder)
        # Every hostname resolves, from inside the actor, to that host's address.
        assert a["resolved"] == {hostnames[h]: s.host_ip(h) for h in range(s.hosts)}
        assert len(a["tpu_ids"]) == 1
        device = int(a["tpu_ids"][0])
        ids_per_host[j].append(device)
        # Ray masks whole chips: device d of a chip with per_chip devices.
        assert env["TPU_VISIBLE_CHIPS"] == str(device // s.per_chip)
        if s.per_chip > 1:
            assert env["RAY_TPU_RESOURCE_PER_CHIP"] == str(s.per_chip)
            assert env["TPU_PROCESS_ADDRESSES"] == ",".join(f"{h}:8471" for h in hostnames)
        else:
            assert "RAY_TPU_RESOURCE_PER_CHIP" not in env
        ranks.append(j * s.devices_per_host + device)  # the seed's rank rule
    assert [sorted(ids) for ids in ids_per_host] == [list(range(s.devices_per_host))] * s.hosts
    assert sorted(ranks) == list(range(s.hosts * s.devices_per_host))


@pytest.mark.parametrize("s", [
    pytest.param(V4_NETNS, id="v4-2x2x2-netns",
                 marks=pytest.mark.skipif(not IS_ROOT, reason="network namespaces need root")),
    pytest.param(TPU7X_NETNS, id="tpu7x-2x2x2-netns",
                 marks=pytest.mark.skipif(not IS_ROOT, reason="network namespaces need root")),
    pytest.param(V4_LOOPBACK, id="v4-2x2x2-loopback"),
])
def test_slice_up_placement_down(cluster: Cluster, s: Slice) -> None:
    shm_before = _shm()
    t0 = time.monotonic()
    cluster.up(s.spec, "--net", s.net)
    t_up = time.monotonic() - t0
    status = cluster.run("status")
    assert status.returncode == 0, status.stdout + status.stderr
    again = cluster.run("up", s.spec, "--net", s.net)
    assert again.returncode != 0 and "already up" in again.stderr

    probe = cluster.probe(s)
    t_probe = time.monotonic() - t0 - t_up
    worker_of = _check_nodes(s, probe["nodes"])
    _check_slice(s, probe, worker_of)
    _check_actors(s, probe, worker_of)

    procs, suffix = cluster.footprint()
    assert len(procs) >= 3 * (s.hosts + 1), f"too few cluster processes found: {procs}"
    assert (suffix != "") == (s.net == "netns")
    cluster.down()
    t_down = time.monotonic() - t0 - t_up - t_probe
    _assert_down_clean(cluster, procs, suffix, shm_before)
    again = cluster.run("down")
    assert again.returncode == 0 and "no cluster" in again.stdout
    print(f"\n{s.spec} --net {s.net}: up {t_up:.1f}s, probe {t_probe:.1f}s "
          f"(slice ready {probe['seconds']['slice_ready']}s), down {t_down:.1f}s")


def test_up_fails_clearly_when_a_port_is_taken(cluster: Cluster) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = cluster.run("up", "v4-2x2x2", "--net", "loopback", "--gcs-port", str(port))
    assert res.returncode != 0
    assert f"port {port} (GCS)" in res.stderr and "taken" in res.stderr, res.stderr
    assert not cluster.state.exists()
    assert not _processes_mentioning(str(cluster.state) + "/")


@pytest.mark.parametrize("spec, message", [
    ("v6e", "expected GENERATION-TOPOLOGY"),
    ("v9-4x4", "is not one of"),
    ("v6e-4x4x4", "2 dimensions"),
    ("tpu7x-4x4", "3 dimensions"),
    ("v4-2x3x1", "do not fill whole hosts"),
])
def test_up_rejects_bad_specs(cluster: Cluster, spec: str, message: str) -> None:
    res = cluster.run("up", spec)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not cluster.state.exists()


def _env_of(*args: str) -> Dict[str, str]:
    out = subprocess.run([str(SCRIPT), "env", *args], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_env_matches_tpurun_on_loopback() -> None:
    """On loopback addresses a v6e 4x4 host gets the TPU variables tpurun gives
    (docs/runtime.md, rank 6 = host 1)."""
    env = _env_of("v6e-4x4", "--net", "loopback", "--host", "1")
    hosts = [f"127.0.1.{h}" for h in range(1, 5)]
    assert env["TPU_WORKER_ID"] == "1"
    assert env["TPU_WORKER_HOSTNAMES"] == ",".join(hosts)
    assert env["TPU_ACCELERATOR_TYPE"] == "v6e-16"
    assert env["TPU_TOPOLOGY"] == "4x4"
    assert env["TORCH_TPU_TOPOLOGY"] == "4,4,1"
    assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
        f"{h}:{p}" for h in hosts for p in range(8471, 8475))
    assert "RAY_TPU_RESOURCE_PER_CHIP" not in env


@pytest.mark.parametrize("args, hosts, devices, torch_topology", [
    (("v6e-4x4",), 4, 4, "4,4,1"),
    (("tpu7x-2x2x2",), 2, 8, "2,2,2,2"),
    (("v4-2x2x2",), 2, 4, "2,2,2"),
    (("v5p-2x2x4",), 4, 4, "2,2,4"),
    (("v6e-2x4",), 1, 8, "2,4,1"),  # one 8-chip host, as Ray's get_chips_per_host
    (("v6e-2x4", "--chips-per-host", "4"), 2, 4, "2,4,1"),  # GKE ct6e-standard-4t
    (("v5e-2x2",), 1, 4, "2,2,1"),
])
def test_env_sizes_each_slice(args: Tuple[str, ...], hosts: int, devices: int,
                              torch_topology: str) -> None:
    last = _env_of(*args, "--host", str(hosts - 1))
    assert last["TPU_WORKER_ID"] == str(hosts - 1)
    assert last["TORCH_TPU_TOPOLOGY"] == torch_topology
    assert len(last["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == hosts * devices
    # The webhook names hosts only on multi-host slices.
    assert ("TPU_WORKER_HOSTNAMES" in last) == (hosts > 1)
    res = subprocess.run([str(SCRIPT), "env", *args, "--host", str(hosts)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and f"0..{hosts - 1}" in res.stderr


@pytest.mark.parametrize("net, hostname", [
    ("loopback", lambda sl, h: f"127.0.{sl + 1}.{h + 1}"),
    ("netns", lambda sl, h: f"v4-16-{sl}-{h}.{CLUSTER}-headless"),
])
def test_env_of_two_slices_names_each_slices_own_hosts(net: str, hostname: Any) -> None:
    """--num-slices 2: host J of the cluster is host J % 2 of slice J // 2, as a
    KubeRay worker group with replicas: 2 (TPU_NAME <group>-<replica>)."""
    for j in range(4):
        sl, h = divmod(j, 2)
        env = _env_of("v4-2x2x2", "--net", net, "--num-slices", "2", "--host", str(j))
        names = [hostname(sl, k) for k in range(2)]
        assert env["TPU_WORKER_ID"] == str(h)
        assert env["TPU_NAME"] == f"v4-16-{sl}"
        assert env["TPU_WORKER_HOSTNAMES"] == ",".join(names)
        assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
            f"{n}:{p}" for n in names for p in range(8471, 8475))
        assert env["RAY_CLOUD_INSTANCE_ID"] == f"{CLUSTER}-v4-16-worker-{j}"
        assert not any(k.startswith("MEGASCALE_") for k in env)
    # One slice: exactly the environment without the flag.
    assert _env_of("v4-2x2x2", "--net", net, "--num-slices", "1", "--host", "1") == \
        _env_of("v4-2x2x2", "--net", net, "--host", "1")
    for bad in ("0", "-1", "two"):
        res = subprocess.run([str(SCRIPT), "env", "v4-2x2x2", "--num-slices", bad],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 2 and "--num-slices: expected a positive integer" in res.stderr
    res = subprocess.run([str(SCRIPT), "env", "v4-2x2x2", "--num-slices", "2", "--host", "4"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "0..3" in res.stderr


@pytest.mark.skipif(not IS_ROOT, reason="network namespaces need root")
def test_two_slices_up_placement_down(cluster: Cluster) -> None:
    """2 x v4-2x2x2 in network namespaces: Ray derives one slice name and one
    TPU-v4-16-head per slice, and ray.util.tpu.slice_placement_group(num_slices=2)
    reserves both slices through their worker 0 and places 4 bundles on every host."""
    shm_before = _shm()
    t0 = time.monotonic()
    cluster.up("v4-2x2x2", "--net", "netns", "--num-slices", "2")
    t_up = time.monotonic() - t0
    res = cluster.run("exec", "--", str(PYTHON), str(PROBE), "--topology", "2x2x2",
                      "--accelerator-type", "TPU-V4", "--num-slices", "2")
    assert res.returncode == 0, f"slice probe failed:\n{res.stdout}\n{res.stderr[-4000:]}"
    probe = json.loads(res.stdout.strip().splitlines()[-1])
    t_probe = time.monotonic() - t0 - t_up

    tpu = [n for n in probe["nodes"] if n["resources"].get("TPU")]
    assert len(tpu) == 4
    where: Dict[str, Tuple[int, int]] = {}  # node id -> (slice, worker)
    for n in tpu:
        labels, res_ = n["labels"], n["resources"]
        name, worker = labels["ray.io/tpu-slice-name"], int(labels["ray.io/tpu-worker-id"])
        sl = int(name.rsplit("-", 1)[1])
        assert name == f"v4-16-{sl}" and res_[name] == 1
        assert n["ip"] == f"10.250.0.{sl * 2 + worker + 2}"
        assert ("TPU-v4-16-head" in res_) == (worker == 0)
        assert labels["ray.io/tpu-pod-type"] == "v4-16"
        where[n["id"]] = (sl, worker)
    assert sorted(where.values()) == [(0, 0), (0, 1), (1, 0), (1, 1)]

    sl_info = probe["slice"]
    assert sl_info["num_bundles"] == 16 and sl_info["num_hosts"] == 4
    assert sorted(where[n] for n in sl_info["head_reservation_nodes"]) == [(0, 0), (1, 0)]
    per_host: Dict[Tuple[int, int], int] = {}
    for i, node in enumerate(sl_info["bundle_nodes"]):
        per_host[where[node]] = per_host.get(where[node], 0) + 1
        # Bundles 0-7 are one slice, 8-15 the other, each pinned by its slice name.
        want = sl_info["bundle_label_selector"][i]["ray.io/tpu-slice-name"]
        assert want == f"v4-16-{where[node][0]}"
        assert sl_info["bundle_label_selector"][i] == sl_info["bundle_label_selector"][i // 8 * 8]
    assert per_host == {k: 4 for k in where.values()}
    for a in probe["actors"]:
        sl, worker = where[a["node_id"]]
        names = [f"v4-16-{sl}-{h}.{CLUSTER}-headless" for h in range(2)]
        assert a["env"]["TPU_NAME"] == f"v4-16-{sl}" == a["pod_name"]
        assert a["env"]["TPU_WORKER_ID"] == str(worker)
        assert a["env"]["TPU_WORKER_HOSTNAMES"] == ",".join(names)
        assert a["resolved"] == {names[h]: f"10.250.0.{sl * 2 + h + 2}" for h in range(2)}

    procs, suffix = cluster.footprint()
    cluster.down()
    t_down = time.monotonic() - t0 - t_up - t_probe
    _assert_down_clean(cluster, procs, suffix, shm_before)
    print(f"\n2 x v4-2x2x2 --net netns: up {t_up:.1f}s, probe {t_probe:.1f}s "
          f"(slices ready {probe['seconds']['slice_ready']}s), down {t_down:.1f}s")


# Joins the GCS at argv[1] as `ray start --address` does (node.py's GcsClient)
# and says whether Ray's token authentication let it in: fast (no retries on
# InvalidAuthToken), unlike ray.init's ~20 s of reconnects.
_JOIN_GCS = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1])
except Exception as e:
    print("refused:", type(e).__name__, str(e).splitlines()[0][:200])
    sys.exit(1)
print("joined")
"""


def _joins(address: str, env: Dict[str, str]) -> bool:
    res = subprocess.run([str(PYTHON), "-c", _JOIN_GCS, address], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    return res.returncode == 0


def _environ(pid: int) -> Dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(v.decode().split("=", 1) for v in raw if b"=" in v)


@pytest.mark.parametrize("auth, home_token", [
    pytest.param("token", True, id="token-with-home-token"),
    pytest.param("token", False, id="token-without-home-token"),
    pytest.param("disabled", True, id="disabled-with-home-token"),
])
def test_auth_mode_is_explicit_and_the_same_on_every_node(cluster: Cluster, tmp_path: Path,
                                                          auth: str, home_token: bool) -> None:
    """Ray 2.60 turns token auth on for a head when ~/.ray/auth_token exists
    (any local ray.init() writes one) but never for `ray start --address`:
    the TPU hosts were refused (InvalidAuthToken). The script now picks the
    mode itself for every node and driver; smallest cluster: head + 1 host."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    user_token = home / ".ray" / "auth_token"
    if home_token:  # what a local ray.init() leaves behind
        user_token.write_text(secrets.token_hex(32))
        user_token.chmod(0o600)
    before = user_token.read_bytes() if home_token else None
    cluster.env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH_")}
    cluster.env["HOME"] = str(home)
    shm_before = _shm()
    args = ["v6e-1x1", "--net", "loopback"] + (["--auth", auth] if auth != "token" else [])
    res = cluster.up(*args)  # the default is token
    assert f"auth: {auth}" in res.stdout, res.stdout
    status = cluster.run("status")
    assert status.returncode == 0 and f"auth: {auth}" in status.stdout, status.stdout

    procs, suffix = cluster.footprint()
    roots = [int(line.split()[1]) for line in (cluster.state / "pids").read_text().splitlines()]
    assert len(roots) == 2
    token_file = cluster.state / "auth_token"
    for pid in roots:  # head and TPU host: the same explicit mode and token
        env = _environ(pid)
        assert env["RAY_AUTH_MODE"] == auth and "RAY_AUTH_TOKEN" not in env
        assert env.get("RAY_AUTH_TOKEN_PATH") == (str(token_file) if auth == "token" else None)

    head = "127.0.1.254:6379"
    outsider = {"PATH": os.environ["PATH"], "HOME": str(home)}
    if auth == "token":
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text()
        assert len(token) == 64 and token.encode() != before  # the cluster's own token
        assert not _joins(head, outsider)  # mode unset: no token sent
        assert not _joins(head, dict(outsider, RAY_AUTH_MODE="token",
                                     RAY_AUTH_TOKEN=secrets.token_hex(32)))
        if home_token:  # the caller's own ~/.ray/auth_token is not the cluster's
            assert not _joins(head, dict(outsider, RAY_AUTH_MODE="token"))
        assert _joins(head, dict(outsider, RAY_AUTH_MODE="token",
                                 RAY_AUTH_TOKEN_PATH=str(token_file)))
    else:
        assert not token_file.exists()
        assert _joins(head, outsider)
    # `exec` drivers get the cluster's mode, whatever the caller's environment says.
    stray = dict(cluster.env, RAY_AUTH_MODE="disabled", RAY_AUTH_TOKEN=secrets.token_hex(32))
    res = subprocess.run([str(SCRIPT), "exec", "--", str(PYTHON), "-c", _JOIN_GCS, head], env=stray,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "joined" in res.stdout, res.stdout + res.stderr

    cluster.down()
    _assert_down_clean(cluster, procs, suffix, shm_before)
    # The caller's token is neither changed nor created.
    assert (user_token.read_bytes() if user_token.exists() else None) == before


def test_auth_mode_reaches_every_node_env_and_is_checked() -> None:
    for host in ("head", "0", "1"):
        env = _env_of("v4-2x2x2", "--host", host)
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN_PATH"].endswith("/auth_token")
        env = _env_of("v4-2x2x2", "--host", host, "--auth", "disabled")
        assert env["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN_PATH" not in env
    res = subprocess.run([str(SCRIPT), "env", "v4-2x2x2", "--auth", "none"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 2 and "--auth: expected token or disabled" in res.stderr
    res = subprocess.run([str(SCRIPT), "env", "v4-2x2x2"], capture_output=True, text=True,
                         timeout=60, check=False,
                         env=dict(os.environ, TPU_DIST_RAY_PASS_ENV="HOME RAY_AUTH_TOKEN"))
    assert res.returncode == 2 and "names RAY_AUTH_TOKEN" in res.stderr
