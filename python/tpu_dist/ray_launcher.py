"""tpu_dist-ray-run: run one of our C++ binaries on a TPU slice under Ray.

    tpu_dist-ray-run --topology 4x4 --accelerator-type TPU-V6E --max-failures 2 -- \\
        build/examples/gemma_finetune --storage_path /shared/runs --run_name demo

Reserves one intact slice with Ray's TPU placement API
(`ray.util.tpu.slice_placement_group(topology, accelerator_version,
resources_per_bundle={"TPU": 1})`, as the seed's Ray program), starts one
actor per device (tpu_dist.ray_rank_process.RankProcess) and in each the
binary, with the environment that device has on a KubeRay TPU host (the
webhook's TPU_WORKER_ID, TPU_WORKER_HOSTNAMES, TPU_TOPOLOGY, ... and Ray's
TPU_VISIBLE_CHIPS, as the node carries them) plus what TorchTPU's launch adds
for one process per device:

    LOCAL_RANK              the TPU id Ray assigned the actor (device index on its host)
    MASTER_ADDR, MASTER_PORT  the first TPU_WORKER_HOSTNAMES entry; a free port there
    TPU_DIST_JOB_ID         one id per launch (kept across restarts: run names and
                            checkpoints stay the job's)
    TPU_DIST_RESTART_COUNT  0, 1, ... (also TORCHELASTIC_RESTART_COUNT);
    TORCHELASTIC_MAX_RESTARTS  --max-failures
    TPU_DIST_JOB_SECRET     a random secret per launch (secrets.token_hex(32), kept
                            across restarts) that authenticates the ranks' TCP mesh
                            and coordination calls; --env TPU_DIST_JOB_SECRET=...
                            gives one instead. It reaches each rank actor as a call
                            argument over Ray's own channels, never on a command line.
    TPU_DIST_FLIGHT_RECORDER_DIR  <tmp>/tpu_dist_fr/<job id>/attempt_<n> on each rank's
                            node, unless --env sets it, TORCH_FR_DUMP_TEMP_FILE, or
                            TPU_DIST_FLIGHT_RECORDER_SIZE=0

RANK and WORLD_SIZE are not set: the binary derives them from the TPU
variables (tpu_runtime/env_discovery.h), as on a real slice.

Several slices (--num-slices N, default 1): Ray reserves N whole slices
(`slice_placement_group(..., num_slices=N)`). Each actor's slice is the TPU
slice of its host (TPU_NAME), numbered in bundle order (on multi-host slices
Ray pins each slice's bundles by its ray.io/tpu-slice-name: bundle // devices
per slice; single-host slices carry no such label and the host decides);
every slice must hold one actor per device of it. Every rank then also gets
what Ray computes for its slice (ray.util.tpu.get_tpu_coordinator_env_vars):

    MEGASCALE_COORDINATOR_ADDRESS  slice 0's first host:--megascale-port
    MEGASCALE_PORT          --megascale-port (default 8081, Ray's DEFAULT_MEGASCALE_PORT)
    MEGASCALE_NUM_SLICES    N
    MEGASCALE_SLICE_ID      the rank's slice

and MASTER_ADDR is slice 0's first host; its global rank (which discovery
derives) is slice x devices per slice + TPU_WORKER_ID x devices per host +
LOCAL_RANK, as tpurun --num-slices gives it. These are recomputed from the
live actors on every attempt, never carried over (--env MEGASCALE_* is
refused). When every rank of a slice failed (killed, or its actors or node
died) before the launcher stopped the job, it names the slice ("slice 1
(TPU_NAME ..., ranks 4-7, host ...) lost: ..."), as tpurun does.

Output is streamed rank-prefixed ("[rank  3] ...", as tpurun). When a rank
exits non-zero, is killed, or its actor or node dies, the launcher names it,
stops the others (SIGTERM, SIGKILL after --grace-s), and starts the whole
group again with the restart count raised, up to --max-failures times (Ray
Train FailureConfig semantics: failures allowed; 0 = none); our fine-tune
resumes from its last complete checkpoint. Giving up exits with the failed
rank's status (128 + signal when killed) and one line saying why; success
exits 0. Ctrl-C / SIGTERM stop every rank before exiting. The actors and the
placement group are removed on every exit path.

Flight recorder: when an attempt fails and a rank has written a flight-recorder
dump, the launcher sends SIGUSR1 to the ranks still running that have not (up
to 2 s for their dumps), fetches every rank's dump through its actor into
<tmp>/tpu_dist_fr/<job id>/attempt_<n>_collected on this machine, and prints
torch's analyzer verdict (tpu_dist.fr_verdict: `--fr-analyzer` or
TPU_DIST_FR_ANALYZER, else this Python) in lines starting
"tpu_dist-ray-run: flight recorder: ".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

from tpu_dist import fr_verdict
from tpu_dist.ray_slices import (assign_ranks, lost_slice_line, lost_slices,
                                 megascale_environments, slice_layout_line)

DEFAULT_MASTER_PORT = 29500
PREFIX = "tpu_dist-ray-run: "


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# A rank that stops because another rank failed exits with this
# (tpu_runtime/exit_codes.h); the root cause is the rank that did not.
PEER_FAILURE_EXIT = 75
ROOT_CAUSE_WAIT_S = 3.0
# How long ranks asked (SIGUSR1) for their flight-recorder dumps get.
FR_DUMP_WAIT_S = 2.0
# Several slices: how long after the first failure the launcher still
# collects failures before stopping the rest (a slice is lost all at once;
# tpurun waits 300 ms, Ray's polls are slower).
SLICE_SETTLE_S = 1.0
MEGASCALE_VARS = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_PORT", "MEGASCALE_NUM_SLICES",
                  "MEGASCALE_SLICE_ID")


@dataclasses.dataclass
class _Failure:
    rank: int
    what: str   # "killed by SIGKILL", "exited with status 3", "its Ray actor died: ..."
    code: int   # shell status to exit with
    lost_slices: List[int] = dataclasses.field(default_factory=list)


def _describe(rc: int) -> _Failure:
    if rc < 0:
        return _Failure(-1, f"killed by {signal.Signals(-rc).name}", 128 - rc)
    return _Failure(-1, f"exited with status {rc}", rc)


def _followers_only(followers: List[int], still_running: List[int]) -> _Failure:
    """The report when only ranks that followed another's failure exited."""
    what = (f"stopped because another rank failed (exit {PEER_FAILURE_EXIT}); "
            "no rank failed for a reason of its own")
    if still_running:
        what += f"; still running (hung?): ranks {', '.join(map(str, still_running))}"
    return _Failure(followers[0], what, PEER_FAILURE_EXIT)


def rank_label(rank: int, world: int) -> str:
    """"[rank  3] " for rank 3 of 16: equal widths, as tpurun prints."""
    return f"[rank {rank:>{len(str(max(world - 1, 0)))}}] "


def _log(msg: str) -> None:
    print(PREFIX + msg, file=sys.stderr, flush=True)


def join_ray(ray: Any) -> Optional[str]:
    """ray.init() (RAY_ADDRESS, else a local cluster); None, or one line saying
    why the launcher could not join. The authentication mode is the caller's
    (Ray's RAY_AUTH_MODE rules): a cluster in token mode (Ray >= 2.52;
    tools/ray_cluster.sh and deploy/'s RayClusters are) refuses a driver
    without its token, which ray.init reports only as a connection failure."""
    try:
        ray.init(log_to_driver=False)
        return None
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        why = f"cannot join the Ray cluster at {os.environ.get('RAY_ADDRESS') or '(auto)'}: {first}"
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            why += ("; if the cluster uses token authentication, set RAY_AUTH_MODE=token and its "
                    "token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (tools/ray_cluster.sh exec "
                    "sets both; on KubeRay, authOptions gives every pod both)")
        return why


class _Attempt:
    """One start of the whole group: actors, binaries, supervision."""

    dumps: Optional[fr_verdict.DumpLocation] = None  # None: no flight-recorder verdict
    num_slices = 1

    def __init__(self, actor_cls: Any, pg: Any, num_bundles: int, devices_per_host: int,
                 args: argparse.Namespace, job_id: str, attempt: int) -> None:
        """Starts the actors and places them: ranks and slices from what each
        actor's host says now (assign_ranks), so that every attempt computes
        its slices and MEGASCALE_* afresh."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.args, self.attempt = ray, args, attempt
        self.world = num_bundles
        self.actors = [actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote()
            for i in range(num_bundles)]
        self.num_slices = args.num_slices
        try:
            places = ray.get([a.place.remote() for a in self.actors], timeout=args.timeout_s)
            order = assign_ranks(places, self.num_slices, devices_per_host)
        except Exception:
            self.close()
            raise
        self.actors = [self.actors[i] for i in order]  # index = rank
        self.places = [places[i] for i in order]
        self.megascale = megascale_environments(self.places, self.num_slices,
                                                args.megascale_port)
        self.job_id = job_id
        self.dumps = fr_verdict.dump_location(args.env, job_id, attempt)

    def start(self, job_secret: str) -> None:
        ray, a = self.ray, self.args
        port = a.master_port or ray.get(self.actors[0].free_port.remote(DEFAULT_MASTER_PORT),
                                        timeout=a.timeout_s)
        master = self.places[0]["hosts"][0]
        envs = rank_environments(self.places, master, port, self.job_id, job_secret, self.attempt,
                                 a.max_failures, a.env,
                                 fr_dir=self.dumps.dir if self.dumps and
                                 self.dumps.set_by_launcher else None,
                                 megascale=self.megascale)
        refs = [actor.start.remote(a.command, env, os.getcwd())
                for actor, env in zip(self.actors, envs)]
        pids = ray.get(refs, timeout=a.timeout_s)
        where = ", ".join(f"{r}:{p['ip']}/{pid}" for r, (p, pid) in enumerate(zip(self.places, pids)))
        if self.num_slices > 1:
            _log(f"attempt {self.attempt}: " + slice_layout_line(self.places, self.num_slices,
                                                                 self.megascale))
        _log(f"attempt {self.attempt}: {self.world} ranks started, MASTER_ADDR={master} "
             f"MASTER_PORT={port} (rank:host/pid {where})")

    def supervise(self, deadline: float) -> Optional[_Failure]:
        """Streams output until every rank exited; returns the root-cause failure.

        A rank exiting with PEER_FAILURE_EXIT stopped because another rank
        failed: the launcher waits up to ROOT_CAUSE_WAIT_S for a rank that
        failed for a reason of its own and reports that one (as tpurun does).
        With several slices it keeps collecting failures for SLICE_SETTLE_S
        after the first one, then names every slice all of whose ranks failed.
        """
        ray = self.ray
        pending = set(range(self.world))
        failure: Optional[_Failure] = None
        failed: List[int] = []  # ranks that failed for a reason of their own
        followers: List[int] = []
        root_deadline = settle_deadline = float("inf")
        while pending and (failure is None or time.monotonic() < settle_deadline):
            refs = {r: self.actors[r].poll.remote() for r in sorted(pending)}
            for r, ref in refs.items():
                try:
                    lines, rc = ray.get(ref, timeout=self.args.timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    failure = failure or _Failure(r, f"its Ray actor died or hung ({type(e).__name__})", 1)
                    failed.append(r)
                    pending.discard(r)
                    continue
                self._print(r, lines)
                if rc is not None:
                    pending.discard(r)
                    if rc == PEER_FAILURE_EXIT:
                        # Also after the root cause showed up in this same pass:
                        # such a rank is reported as a follower, not silently
                        # left out of "stopped the other N ranks".
                        followers.append(r)
                        root_deadline = min(root_deadline, time.monotonic() + ROOT_CAUSE_WAIT_S)
                    elif rc != 0:
                        failed.append(r)
                        if failure is None:
                            failure = dataclasses.replace(_describe(rc), rank=r)
            if failure is None and followers and (not pending or time.monotonic() > root_deadline):
                failure = _followers_only(followers, sorted(pending))
            if failure is not None:
                if settle_deadline == float("inf"):
                    settle_deadline = time.monotonic() + (SLICE_SETTLE_S if self.num_slices > 1
                                                          else 0.0)
            elif pending and time.monotonic() > deadline:
                failure = _Failure(-1, f"job timed out after {self.args.job_timeout_s:.0f} s", 124)
                break
            if pending and (failure is None or time.monotonic() < settle_deadline):
                time.sleep(self.args.poll_s)
        if failure is not None and followers and failure.code != PEER_FAILURE_EXIT:
            failure.what += f"; ranks {', '.join(map(str, followers))} stopped because of it"
        if failure is not None:
            failure.lost_slices = lost_slices(self.places, self.num_slices, failed)
            for s in failure.lost_slices:
                _log(lost_slice_line(self.places, self.num_slices, s))
            collected = self._collect_dumps(pending) if self.dumps is not None else {}
            self._stop_all(pending, failure)
            if collected:
                self._print_verdict(collected)
        return failure

    def _collect_dumps(self, pending: set) -> Dict[int, bytes]:
        """Every rank's flight-recorder dump, fetched through its actor; the
        ranks still running are asked for theirs (SIGUSR1) when any rank has
        dumped (they record: tpu_dist ranks)."""
        ray, where = self.ray, self.dumps
        assert where is not None
        got: Dict[int, bytes] = {}

        def fetch(ranks: List[int], ask: bool) -> None:
            refs = {r: self.actors[r].flight_recorder_dump.remote(where.path(r), ask,
                                                                   FR_DUMP_WAIT_S)
                    for r in ranks}
            for r, ref in refs.items():
                try:
                    data = ray.get(ref, timeout=self.args.timeout_s + FR_DUMP_WAIT_S)
                except Exception:  # noqa: BLE001 - a dead actor: no dump from it
                    data = None
                if data is not None:
                    got[r] = data

        fetch(list(range(self.world)), ask=False)
        missing = [r for r in sorted(pending) if r not in got]
        if got and missing:
            _log(f"waiting up to {FR_DUMP_WAIT_S:g} s for rank{'s' if len(missing) > 1 else ''} "
                 f"{', '.join(map(str, missing))} to write flight-recorder dumps (sent SIGUSR1) "
                 "before stopping them")
            fetch(missing, ask=True)
        return got

    def _print_verdict(self, collected: Dict[int, bytes]) -> None:
        """Writes the fetched dumps into one local directory and prints
        torch's analyzer verdict on them."""
        assert self.dumps is not None
        where = fr_verdict.DumpLocation(
            os.path.join(tempfile.gettempdir(), "tpu_dist_fr", self.job_id,
                         f"attempt_{self.attempt}_collected"), self.dumps.file_prefix)
        os.makedirs(where.dir, exist_ok=True)
        for r, data in collected.items():
            with open(where.path(r), "wb") as f:
                f.write(data)
        for line in fr_verdict.flight_recorder_verdict(where, list(range(self.world)),
                                                       self.args.fr_analyzer,
                                                       self.args.fr_analyzer_timeout_s):
            _log("flight recorder: " + line)

    def _stop_all(self, pending: set, failure: _Failure) -> None:
        ray, t0 = self.ray, time.monotonic()
        refs = {r: self.actors[r].stop.remote(self.args.grace_s) for r in sorted(pending)}
        for r, ref in refs.items():
            try:
                lines, _ = ray.get(ref, timeout=self.args.grace_s + 30)
                self._print(r, lines)
            except Exception as e:  # noqa: BLE001 - a dead actor took its rank with it
                _log(f"rank {r}: could not stop cleanly ({type(e).__name__}); its actor is killed")
        who = self.describe(failure.rank) if failure.rank >= 0 else "the job"
        _log(f"{who} {failure.what}; stopped the other {len(pending)} ranks in "
             f"{time.monotonic() - t0:.1f} s")

    def describe(self, rank: int) -> str:
        p = self.places[rank]
        where = f"slice {p['slice']}, " if self.num_slices > 1 else ""
        return f"rank {rank} ({where}worker {p['worker_id']}, device {p['local_rank']}, {p['ip']})"

    def _print(self, rank: int, lines: List[str]) -> None:
        label = rank_label(rank, self.world)
        for line in lines:
            print(label + line, flush=False)
        if lines:
            sys.stdout.flush()

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass


def new_job_secret() -> str:
    """A fresh job secret: 32 random bytes as 64 hex digits (what
    tpu_runtime/job_secret.h parses back to the same bytes)."""
    return secrets.token_hex(32)


def rank_environments(places: List[Dict[str, Any]], master: str, port: int, job_id: str,
                      job_secret: str, attempt: int, max_failures: int,
                      extra: Dict[str, str], fr_dir: Optional[str] = None,
                      megascale: Optional[List[Dict[str, str]]] = None) -> List[Dict[str, str]]:
    """What each rank's binary gets on top of its node's environment, in rank
    order (places[i] is rank i's). `extra` (--env) wins over the rest;
    `fr_dir`: TPU_DIST_FLIGHT_RECORDER_DIR (the launcher's dump directory);
    `megascale`: each rank's MEGASCALE_* (megascale_environments)."""
    base = {"MASTER_ADDR": master, "MASTER_PORT": str(port), "TPU_DIST_JOB_ID": job_id,
            "TPU_DIST_JOB_SECRET": job_secret,
            "TPU_DIST_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(max_failures)}
    if fr_dir:
        base[fr_verdict.DIR_ENV] = fr_dir
    base.update(extra)
    per_rank = megascale or [{} for _ in places]
    return [dict(base, LOCAL_RANK=str(p["local_rank"]), **m) for p, m in zip(places, per_rank)]


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tpu_dist-ray-run", description=__doc__.split("\n")[0])
    p.add_argument("--topology", default="4x4", help="the slice's topology (e.g. 4x4, 2x2x2)")
    p.add_argument("--accelerator-type", default="TPU-V6E", help="e.g. TPU-V6E, TPU-V7X, TPU-V4")
    p.add_argument("--num-slices", type=int, default=1,
                   help="whole slices to reserve; > 1: every rank gets MEGASCALE_* (default 1)")
    p.add_argument("--megascale-port", type=int, default=8081,
                   help="with --num-slices > 1: MEGASCALE_PORT and the coordinator's port")
    p.add_argument("--max-failures", type=int, default=0,
                   help="restarts of the whole group allowed after a failure (default 0)")
    p.add_argument("--grace-s", type=float, default=5.0,
                   help="SIGTERM to SIGKILL when stopping ranks")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="bounds the slice reservation, actor start and each poll")
    p.add_argument("--job-timeout-s", type=float, default=0.0,
                   help="fail the attempt after this long (0: no limit)")
    p.add_argument("--poll-s", type=float, default=0.2, help="output/exit polling interval")
    p.add_argument("--master-port", type=int, default=0,
                   help=f"default {DEFAULT_MASTER_PORT} if free on the first host, else a free one")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra variable for every rank (repeatable)")
    p.add_argument("--fr-analyzer", default=None, metavar="PYTHON",
                   help="Python (with torch) that runs torch's flight-recorder analyzer after a "
                   f"failed attempt (default: {fr_verdict.ANALYZER_ENV}, else this Python); "
                   "none: no analysis")
    p.add_argument("--fr-analyzer-timeout-s", type=float, default=30.0,
                   help="the analyzer is killed after this long")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- BINARY [ARGS...]")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no command: tpu_dist-ray-run [options] -- BINARY [ARGS...]")
    binary = args.command[0]
    resolved = shutil.which(binary) if os.sep not in binary else binary
    if not resolved or not os.access(resolved, os.X_OK):
        p.error(f"{binary}: not an executable file")
    args.command[0] = os.path.abspath(resolved)
    if args.max_failures < 0:
        p.error("--max-failures must be >= 0")
    if args.num_slices < 1:
        p.error(f"--num-slices must be >= 1, got {args.num_slices}")
    if not 1 <= args.megascale_port <= 65535:
        p.error(f"--megascale-port must be 1..65535, got {args.megascale_port}")
    env: Dict[str, str] = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"--env {item!r}: expected NAME=VALUE")
        if name in MEGASCALE_VARS:
            p.error(f"--env {name}: MEGASCALE_* are computed by the launcher from the live "
                    "slices on every attempt (--num-slices, --megascale-port)")
        env[name] = value
    args.env = env
    if args.fr_analyzer is None:
        args.fr_analyzer = os.environ.get(fr_verdict.ANALYZER_ENV) or sys.executable
    if args.fr_analyzer == "none":
        args.fr_analyzer = ""
    if args.fr_analyzer_timeout_s <= 0:
        p.error("--fr-analyzer-timeout-s must be > 0")
    return args


def _place_attempt(ray: Any, actor_cls: Any, slice_pg: Any, n: int, devices_per_host: int,
                   args: argparse.Namespace, job_id: str, k: int) -> Optional[_Attempt]:
    """Attempt k's actors, placed: waits for the placement group (a lost
    node's bundles are rescheduled onto another host once Ray has marked the
    node dead, ~15 s of missed heartbeats) and starts again while a new actor
    dies before it is placed (it was scheduled on the dead node), up to
    --timeout-s. None after one line saying why it gave up."""
    deadline = time.monotonic() + args.timeout_s
    while True:
        try:
            ray.get(slice_pg.placement_group.ready(),
                    timeout=max(1.0, deadline - time.monotonic()))
            return _Attempt(actor_cls, slice_pg.placement_group, n, devices_per_host, args,
                            job_id, k)
        except ray.exceptions.GetTimeoutError:
            _log(f"giving up: attempt {k}: the placement group of "
                 f"{args.num_slices} x {args.accelerator_type} {args.topology} is not ready within "
                 f"{args.timeout_s:.0f} s (--timeout-s; were a lost slice's hosts not replaced?); "
                 "exit 1")
            return None
        except ray.exceptions.RayActorError as e:
            if time.monotonic() > deadline:
                _log(f"giving up: attempt {k}: rank actors still die before they are placed after "
                     f"{args.timeout_s:.0f} s (--timeout-s): {type(e).__name__}; exit 1")
                return None
            _log(f"attempt {k}: a rank actor died before it was placed ({type(e).__name__}: its "
                 "node is gone?); placing the attempt again once the placement group is ready")
            time.sleep(1.0)
        except RuntimeError as e:  # the actors' hosts do not make the slices asked for
            _log(f"giving up: attempt {k}: {e}; exit 1")
            return None


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(argv)
    import ray
    import ray.util.tpu

    from ray import cloudpickle

    from tpu_dist import env as tpu_env
    from tpu_dist import ray_rank_process
    from tpu_dist.ray_rank_process import RankProcess

    # Ship the actor class (and the host-place reader it calls) by value:
    # importing tpu_dist in each actor would load torch there for nothing.
    cloudpickle.register_pickle_by_value(ray_rank_process)
    cloudpickle.register_pickle_by_value(tpu_env)

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Interrupted(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    why = join_ray(ray)
    if why is not None:
        _log(why)
        return 2
    actor_cls = ray.remote(resources={"TPU": 1})(RankProcess)
    t0 = time.monotonic()
    slice_pg = ray.util.tpu.slice_placement_group(
        topology=args.topology,
        accelerator_version=ray.util.tpu.get_tpu_version_from_type(args.accelerator_type),
        num_slices=args.num_slices, resources_per_bundle={"TPU": 1},
        # Several slices: PACK, so that single-host slices (which carry no
        # ray.io/tpu-slice-name to pin their bundles) each fill one host;
        # SPREAD, Ray's default, scatters them over every free host. Multi-host
        # slices are pinned by their label either way. One slice: the seed's.
        **({"strategy": "PACK"} if args.num_slices > 1 else {}))
    attempt: Optional[_Attempt] = None
    try:
        ray.get(slice_pg.placement_group.ready(), timeout=args.timeout_s)
        n, hosts = slice_pg.num_bundles, slice_pg.num_hosts
        slices = f"{args.num_slices} x " if args.num_slices > 1 else ""
        _log(f"reserved {slices}{args.accelerator_type} {args.topology}: {hosts} hosts x "
             f"{n // hosts} devices ({time.monotonic() - t0:.1f} s)")
        job_id = f"rayrun_{uuid.uuid4().hex[:12]}"
        job_secret = new_job_secret()  # one per job: the same for every attempt
        for k in range(args.max_failures + 1):
            attempt = _place_attempt(ray, actor_cls, slice_pg, n, n // hosts, args, job_id, k)
            if attempt is None:
                return 1
            attempt.start(job_secret)
            deadline = time.monotonic() + (args.job_timeout_s or float("inf"))
            failure = attempt.supervise(deadline)
            attempt.close()
            if failure is None:
                _log(f"all {n} ranks succeeded in {time.monotonic() - t0:.1f} s"
                     + (f" (after {k} restart{'s' if k != 1 else ''})" if k else ""))
                return 0
            if k == args.max_failures:
                who = attempt.describe(failure.rank) if failure.rank >= 0 else "the job"
                if failure.lost_slices:
                    plural = "s" if len(failure.lost_slices) > 1 else ""
                    lost = ", ".join(map(str, failure.lost_slices))
                    failure.what += f" (slice{plural} {lost} lost)"
                _log(f"giving up: {who} {failure.what}"
                     + (f" (after {k} restart{'s' if k != 1 else ''})" if k else "")
                     + f"; exit {failure.code}")
                return failure.code
            _log(f"restarting all ranks (restart {k + 1} of {args.max_failures})")
        return 1  # not reached
    except _Interrupted as e:
        _log(f"interrupted by {e}; stopping every rank")
        if attempt is not None:
            try:
                attempt._stop_all(set(range(attempt.world)), _Failure(-1, f"interrupted by {e}", 0))
            except Exception:  # noqa: BLE001
                pass
        return 128 + e.signum
    finally:
        if attempt is not None:
            attempt.close()
        slice_pg.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
