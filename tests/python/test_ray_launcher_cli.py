"""tpu_dist-ray-run's command line and reporting (no Ray cluster: the cluster
runs are tests/ray/test_ray_programs.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tpu_dist import ray_launcher, ray_slices
from tpu_dist.ray_launcher import _describe, _parse, rank_label

ROOT = Path(__file__).resolve().parents[2]
TRUE = shutil.which("true")


def test_rank_labels_have_equal_widths_as_tpurun() -> None:
    assert rank_label(3, 16) == "[rank  3] "
    assert rank_label(15, 16) == "[rank 15] "
    assert rank_label(0, 1) == "[rank 0] "
    assert rank_label(7, 8) == "[rank 7] "


def test_exit_statuses_are_described_with_the_shell_code() -> None:
    killed = _describe(-signal.SIGKILL)
    assert (killed.what, killed.code) == ("killed by SIGKILL", 137)
    failed = _describe(3)
    assert (failed.what, failed.code) == ("exited with status 3", 3)


def test_parse_takes_the_command_after_the_separator() -> None:
    args = _parse(["--topology", "2x2x2", "--accelerator-type", "TPU-V4", "--max-failures", "2",
                   "--env", "A=1", "--env", "B=x=y", "--", "true", "--flag", "--", "x"])
    assert (args.topology, args.accelerator_type, args.max_failures) == ("2x2x2", "TPU-V4", 2)
    assert args.command == [TRUE, "--flag", "--", "x"]  # resolved on PATH, the rest untouched
    assert args.env == {"A": "1", "B": "x=y"}


@pytest.mark.parametrize("argv, message", [
    ([], "no command"),
    (["--"], "no command"),
    (["--", "/nonexistent/binary"], "/nonexistent/binary: not an executable file"),
    (["--", str(ROOT / "README.md")], "README.md: not an executable file"),
    (["--max-failures", "-1", "--", "true"], "--max-failures must be >= 0"),
    (["--env", "NOVALUE", "--", "true"], "--env 'NOVALUE': expected NAME=VALUE"),
])
def test_parse_rejects_bad_command_lines(argv: list, message: str,
                                         capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_console_script_is_installed_and_fails_fast_without_a_command() -> None:
    script = ROOT / ".venv" / "bin" / "tpu_dist-ray-run"
    assert script.exists(), "pip install -e python/ installs the tpu_dist-ray-run console script"
    res = subprocess.run([str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "no command" in res.stderr


def test_module_docstring_names_every_variable_it_sets() -> None:
    doc = ray_launcher.__doc__ or ""
    for name in ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TPU_DIST_JOB_ID",
                 "TPU_DIST_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"):
        assert name in doc


class _FakeRemote:
    def __init__(self, fn) -> None:
        self.remote = fn


class _FakeActor:
    """A rank whose poll() replays `exits`: None while running, then its code."""

    def __init__(self, exits: list) -> None:
        self._exits = list(exits)
        self.stopped = False
        self.poll = _FakeRemote(self._poll)
        self.stop = _FakeRemote(self._stop)

    def _poll(self):
        rc = self._exits.pop(0) if len(self._exits) > 1 else self._exits[0]
        return ([], rc)

    def _stop(self, grace_s: float):
        self.stopped = True
        return ([], None)


class _FakeRay:
    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        class RayActorError(Exception):
            pass

        class GetTimeoutError(Exception):
            pass

    @staticmethod
    def get(ref, timeout=None):
        return ref


def _attempt(exits_per_rank: list) -> "ray_launcher._Attempt":
    attempt = object.__new__(ray_launcher._Attempt)
    attempt.ray = _FakeRay
    attempt.world = len(exits_per_rank)
    attempt.actors = [_FakeActor(e) for e in exits_per_rank]
    attempt.places = [{"worker_id": 0, "local_rank": r, "ip": "127.0.0.1"}
                      for r in range(attempt.world)]
    attempt.args = _parse(["--", TRUE])
    attempt.args.poll_s = 0.01
    return attempt


def test_root_cause_is_the_rank_that_failed_not_its_followers(capsys) -> None:
    # Ranks 0 and 2 exit 75 (a peer failed) first; rank 1 fails with 3 later.
    attempt = _attempt([[None, 75], [None, None, None, 3], [75], [None] * 6 + [0]])
    failure = attempt.supervise(deadline=float("inf"))
    assert failure is not None
    assert failure.rank == 1 and failure.code == 3
    assert "ranks 2, 0 stopped because of it" in failure.what or \
        "ranks 0, 2 stopped because of it" in failure.what
    assert attempt.actors[3].stopped
    assert "rank 1 (worker 0, device 1" in capsys.readouterr().err


def test_a_follower_exiting_in_the_same_pass_as_the_root_cause_is_named() -> None:
    # Rank 1 is killed (-9); rank 2 saw it and exited 75 before the launcher's
    # pass reached it: it is a follower, and only rank 0 is left to stop.
    attempt = _attempt([[None], [-9], [75]])
    failure = attempt.supervise(deadline=float("inf"))
    assert failure is not None and failure.rank == 1
    assert "ranks 2 stopped because of it" in failure.what
    assert attempt.actors[0].stopped and not attempt.actors[2].stopped


def test_only_followers_name_the_ranks_still_running(monkeypatch) -> None:
    monkeypatch.setattr(ray_launcher, "ROOT_CAUSE_WAIT_S", 0.05)
    attempt = _attempt([[75], [None]])  # rank 1 never exits: hung
    failure = attempt.supervise(deadline=float("inf"))
    assert failure is not None
    assert failure.code == ray_launcher.PEER_FAILURE_EXIT
    assert "still running (hung?): ranks 1" in failure.what
    assert attempt.actors[1].stopped


def test_every_rank_gets_the_jobs_secret_and_variables() -> None:
    places = [{"local_rank": r % 4} for r in range(8)]
    secret = ray_launcher.new_job_secret()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert ray_launcher.new_job_secret() != secret  # fresh per job
    envs = ray_launcher.rank_environments(places, "10.0.0.2", 29500, "rayrun_x", secret,
                                          attempt=1, max_failures=2, extra={"A": "1"})
    assert len(envs) == 8
    for rank, env in enumerate(envs):
        assert env["TPU_DIST_JOB_SECRET"] == secret
        assert env["LOCAL_RANK"] == str(rank % 4)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["TPU_DIST_JOB_ID"]) == \
            ("10.0.0.2", "29500", "rayrun_x")
        assert env["TPU_DIST_RESTART_COUNT"] == env["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert env["A"] == "1"
    # --env TPU_DIST_JOB_SECRET=... gives the job's secret instead.
    given = ray_launcher.rank_environments(places[:1], "h", 1, "j", secret, 0, 0,
                                           {"TPU_DIST_JOB_SECRET": "f" * 64})
    assert given[0]["TPU_DIST_JOB_SECRET"] == "f" * 64


def test_rank_process_drops_a_node_secret_file_when_given_a_secret(monkeypatch) -> None:
    from tpu_dist.ray_rank_process import RankProcess

    monkeypatch.setenv("TPU_DIST_JOB_SECRET_FILE", "/node/secret")
    proc = RankProcess()
    proc.start(["sh", "-c", 'echo "[$TPU_DIST_JOB_SECRET] [$TPU_DIST_JOB_SECRET_FILE]"'],
               {"TPU_DIST_JOB_SECRET": "ab" * 32}, "/")
    deadline = time.monotonic() + 20
    lines, code = [], None
    while code is None and time.monotonic() < deadline:
        out, code = proc.poll()
        lines += out
        time.sleep(0.05)
    out, _ = proc.poll()
    lines += out
    assert code == 0
    assert lines == [f"[{'ab' * 32}] []"]


class _RefusingRay:
    """ray.init as Ray 2.60 fails against a token-mode cluster without its token."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        class AuthenticationError(Exception):
            pass

    @staticmethod
    def init(**_kwargs):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379\ndetails")


def test_a_cluster_that_refuses_the_driver_is_one_line_naming_the_auth_variables(
        monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    why = ray_launcher.join_ray(_RefusingRay)
    assert why is not None and "\n" not in why
    assert why.startswith("cannot join the Ray cluster at 10.0.0.1:6379: Failed to connect")
    assert "RAY_AUTH_MODE=token" in why and "RAY_AUTH_TOKEN_PATH" in why
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # already in token mode: no hint
    assert "RAY_AUTH_MODE=token" not in ray_launcher.join_ray(_RefusingRay)


class _PlaceRay:
    """What RankProcess.place asks Ray: the node's address and the TPU id."""

    class util:  # noqa: N801 - mirrors ray.util
        @staticmethod
        def get_node_ip_address() -> str:
            return "10.0.0.7"

    class _Context:
        @staticmethod
        def get_accelerator_ids() -> dict:
            return {"TPU": ["2"]}

    @classmethod
    def get_runtime_context(cls) -> "_PlaceRay._Context":
        return cls._Context()


def test_rank_process_place_comes_from_discoverys_python_mirror(monkeypatch) -> None:
    # The actor reads its host's place through tpu_dist.env.tpu_host_place (the
    # one Python reader of TPU_* besides the C++ discovery), which names a bad
    # variable; the old inline read took TPU_WORKER_ID=5 of 2 hosts silently
    # and failed on "x" with int()'s message.
    from tpu_dist import ray_rank_process

    monkeypatch.setattr(ray_rank_process, "ray", _PlaceRay)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1")
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    place = ray_rank_process.RankProcess().place()
    assert (place["worker_id"], place["hosts"], place["local_rank"], place["ip"]) == \
        (1, ["w0", "w1"], 2, "10.0.0.7")
    monkeypatch.setenv("TPU_WORKER_ID", "5")
    with pytest.raises(ValueError, match=r'TPU_WORKER_ID="5": expected 0\.\.1'):
        ray_rank_process.RankProcess().place()
    monkeypatch.setenv("TPU_WORKER_ID", "x")
    with pytest.raises(ValueError, match='TPU_WORKER_ID="x"'):
        ray_rank_process.RankProcess().place()
    monkeypatch.delenv("TPU_WORKER_ID")
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
    place = ray_rank_process.RankProcess().place()
    assert (place["worker_id"], place["hosts"]) == (0, ["10.0.0.7"])  # one host: its own


def test_tpu_host_place_reads_as_discovery_does() -> None:
    from tpu_dist.env import tpu_host_place

    assert tpu_host_place({}) == (0, [])
    assert tpu_host_place({"TPU_WORKER_ID": "3", "TPU_WORKER_HOSTNAMES": "a, b ,c,d"}) == \
        (3, ["a", "b", "c", "d"])
    assert tpu_host_place({"TPU_WORKER_ID": "7"}) == (7, [])  # no host list to check against
    with pytest.raises(ValueError, match='TPU_WORKER_HOSTNAMES="a,,b"'):
        tpu_host_place({"TPU_WORKER_HOSTNAMES": "a,,b"})
    with pytest.raises(ValueError, match='TPU_WORKER_ID="-1"'):
        tpu_host_place({"TPU_WORKER_ID": "-1"})


def test_the_actor_class_ships_by_value_without_torch(tmp_path: Path) -> None:
    # As ray_launcher.main ships it: a fresh interpreter loads the actor class
    # and its host-place reader without importing torch or tpu_dist.
    import sys

    from ray import cloudpickle

    from tpu_dist import env as tpu_env
    from tpu_dist import ray_rank_process

    cloudpickle.register_pickle_by_value(ray_rank_process)
    cloudpickle.register_pickle_by_value(tpu_env)
    try:
        blob = cloudpickle.dumps(ray_rank_process.RankProcess)
    finally:
        cloudpickle.unregister_pickle_by_value(ray_rank_process)
        cloudpickle.unregister_pickle_by_value(tpu_env)
    (tmp_path / "actor.pkl").write_bytes(blob)
    child = (
        "import pickle, sys\n"
        f"cls = pickle.loads(open({str(tmp_path / 'actor.pkl')!r}, 'rb').read())\n"
        "place = cls.place.__globals__['tpu_host_place']\n"
        "print(place({'TPU_WORKER_ID': '1', 'TPU_WORKER_HOSTNAMES': 'a,b'}),\n"
        "      'torch' in sys.modules, 'tpu_dist' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(1, ['a', 'b']) False False"


def test_a_group_without_rank_info_is_placed_on_the_tpu_host(monkeypatch) -> None:
    # Ray Train numbers its workers without regard to hosts: discovery refuses
    # RANK=0 on TPU_WORKER_ID=1, and the group is placed by tpu_dist.env
    # (slice_host_<id>, this host's entry) as the C++ rule without a RankInfo
    # used to do; TPU_DIST_HOST_ID still wins.
    from tpu_dist import backend
    from tpu_dist.env import host_placement_without_rank_info, rank_info_or_none

    env = {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2",
           "TPU_ACCELERATOR_TYPE": "v4-16", "TPU_TOPOLOGY": "2x2x2", "RANK": "0",
           "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for name in ("TPU_DIST_HOST_ID", "MEGASCALE_SLICE_ID", "MEGASCALE_NUM_SLICES"):
        monkeypatch.delenv(name, raising=False)
    assert rank_info_or_none() is None
    assert host_placement_without_rank_info() == ("slice_host_1", "10.0.0.2")
    options = backend._options_from_host_place()
    assert (options.host_id, options.worker_hostname) == ("slice_host_1", "10.0.0.2")
    monkeypatch.setenv("TPU_DIST_HOST_ID", "127.0.1.2")
    assert backend._options_from_host_place().host_id == "127.0.1.2"
    # Slice 1 of 2: its host 1 is the job's host 3, never slice 0's host 1.
    monkeypatch.setenv("MEGASCALE_SLICE_ID", "1")
    assert host_placement_without_rank_info() == ("slice_host_3", "10.0.0.2")
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
    assert host_placement_without_rank_info() == ("slice_1_host_1", "")
    monkeypatch.setenv("MEGASCALE_SLICE_ID", "x")
    with pytest.raises(ValueError, match="MEGASCALE_SLICE_ID"):
        host_placement_without_rank_info()
    monkeypatch.delenv("MEGASCALE_SLICE_ID")
    monkeypatch.delenv("TPU_WORKER_ID")
    assert host_placement_without_rank_info() is None
    assert backend._options_from_host_place() is None


def _places(names_by_bundle: list, devices_per_host: int = 4) -> list:
    """Single-host slices: bundle i on a host of slice names_by_bundle[i]."""
    seen: dict = {}
    out = []
    for name in names_by_bundle:
        local = seen.get(name, 0)
        seen[name] = local + 1
        out.append({"worker_id": 0, "local_rank": local, "tpu_name": name,
                    "ip": f"10.0.0.{2 + sorted(set(names_by_bundle)).index(name)}",
                    "hosts": [f"10.0.0.{2 + sorted(set(names_by_bundle)).index(name)}"]})
    return out


def test_several_slices_are_numbered_by_tpu_name_in_bundle_order() -> None:
    # Ray spread single-host slices' bundles: the host's TPU_NAME decides.
    places = _places(["v6e-4-1", "v6e-4-0", "v6e-4-1", "v6e-4-1", "v6e-4-0", "v6e-4-0",
                      "v6e-4-1", "v6e-4-0"])
    order = ray_slices.assign_ranks(places, 2, 4)
    by_rank = [places[i] for i in order]
    assert [p["rank"] for p in by_rank] == list(range(8))
    assert [p["slice"] for p in by_rank] == [0] * 4 + [1] * 4
    assert {p["tpu_name"] for p in by_rank[:4]} == {"v6e-4-1"}  # first in bundle order
    envs = ray_slices.megascale_environments(by_rank, 2, 8081)
    for rank, env in enumerate(envs):
        assert env == {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.3:8081", "MEGASCALE_PORT": "8081",
                       "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": str(rank // 4)}
    full = ray_launcher.rank_environments(by_rank, "10.0.0.3", 29500, "j", "ab" * 32, 1, 1, {},
                                          megascale=envs)
    assert full[5]["MEGASCALE_SLICE_ID"] == "1" and full[5]["LOCAL_RANK"] == "1"
    line = ray_slices.slice_layout_line(by_rank, 2, envs)
    assert line == ("2 slices: slice 0 (TPU_NAME v6e-4-1, ranks 0-3, host 10.0.0.3); "
                    "slice 1 (TPU_NAME v6e-4-0, ranks 4-7, host 10.0.0.2); "
                    "MEGASCALE_COORDINATOR_ADDRESS=10.0.0.3:8081 MEGASCALE_PORT=8081 "
                    "MEGASCALE_NUM_SLICES=2, MEGASCALE_SLICE_ID by rank 0,0,0,0,1,1,1,1")
    # One slice: no MEGASCALE_* from the launcher, ranks as before.
    one = _places(["a"] * 4)
    assert ray_slices.assign_ranks(one, 1, 4) == [0, 1, 2, 3]
    assert ray_slices.megascale_environments(one, 1, 8081) == [{}] * 4


def test_multi_host_slices_rank_slice_major() -> None:
    # 2 slices x 2 hosts x 2 devices, bundles in Ray's order (slice-major).
    places = [{"worker_id": (b % 4) // 2, "local_rank": b % 2, "tpu_name": f"v4-8-{b // 4}",
               "ip": f"10.0.{b // 4}.{(b % 4) // 2}", "hosts": [f"h{b // 4}-0", f"h{b // 4}-1"]}
              for b in range(8)]
    order = ray_slices.assign_ranks(places, 2, 2)
    assert order == list(range(8))
    envs = ray_slices.megascale_environments([places[i] for i in order], 2, 9000)
    assert envs[7]["MEGASCALE_COORDINATOR_ADDRESS"] == "h0-0:9000"
    assert [e["MEGASCALE_SLICE_ID"] for e in envs] == ["0"] * 4 + ["1"] * 4


@pytest.mark.parametrize("names, message", [
    (["a"] * 4 + ["b"] * 2 + ["c"] * 2,
     "the actors run on 3 TPU slices (TPU_NAME 'a', 'b', 'c'), expected --num-slices 2"),
    (["a"] * 8, "the actors run on 1 TPU slices (TPU_NAME 'a'), expected --num-slices 2"),
])
def test_a_placement_that_is_not_whole_slices_is_refused(names: list, message: str) -> None:
    with pytest.raises(RuntimeError) as e:
        ray_slices.assign_ranks(_places(names), 2, 4)
    assert str(e.value) == message


def test_a_slice_without_one_actor_per_device_is_refused() -> None:
    places = _places(["a"] * 4 + ["b"] * 4)
    places[5]["local_rank"] = 0  # two actors on device 0 of slice b
    with pytest.raises(RuntimeError, match=r"TPU_NAME='b': the actors on this slice's hosts have "
                                           r"ranks \[0, 0, 2, 3\] in the slice, expected 0\.\.3"):
        ray_slices.assign_ranks(places, 2, 4)


def test_megascale_variables_and_slice_counts_are_not_taken_from_the_command_line(
        capsys: pytest.CaptureFixture) -> None:
    for argv, message in [
            (["--env", "MEGASCALE_NUM_SLICES=3", "--", "true"],
             "--env MEGASCALE_NUM_SLICES: MEGASCALE_* are computed by the launcher"),
            (["--num-slices", "0", "--", "true"], "--num-slices must be >= 1, got 0"),
            (["--megascale-port", "0", "--", "true"], "--megascale-port must be 1..65535")]:
        with pytest.raises(SystemExit):
            _parse(argv)
        assert message in capsys.readouterr().err
    args = _parse(["--num-slices", "2", "--", "true"])
    assert (args.num_slices, args.megascale_port) == (2, 8081)


def test_a_slice_whose_ranks_all_fail_is_named(capsys) -> None:
    # Slice 1 (ranks 2, 3) is killed; rank 3's death shows one poll later,
    # within the settle time; slice 0's ranks exit 75 after it.
    attempt = _attempt([[None, None, 75], [None, None, None, 75], [-9], [None, -9]])
    attempt.num_slices = 2
    attempt.places = [dict(p, slice=r // 2, rank=r, tpu_name=f"v6e-4-{r // 2}",
                           ip=f"10.0.0.{2 + r // 2}") for r, p in enumerate(attempt.places)]
    failure = attempt.supervise(deadline=float("inf"))
    assert failure is not None and failure.rank == 2 and failure.code == 137
    assert failure.lost_slices == [1]
    err = capsys.readouterr().err
    assert ("tpu_dist-ray-run: slice 1 (TPU_NAME v6e-4-1, ranks 2-3, host 10.0.0.3) lost: all 2 "
            "of its ranks failed before tpu_dist-ray-run stopped the job") in err
    assert "rank 2 (slice 1, worker 0, device 2, 10.0.0.3) killed by SIGKILL" in err
    assert "slice 0 (" not in err
    # One rank of a slice is not a lost slice.
    attempt = _attempt([[None, 75], [None, 75], [-9], [None, None, 0]])
    attempt.num_slices = 2
    attempt.places = [dict(p, slice=r // 2, rank=r, tpu_name=f"v6e-4-{r // 2}")
                      for r, p in enumerate(attempt.places)]
    assert attempt.supervise(deadline=float("inf")).lost_slices == []
