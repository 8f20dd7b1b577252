"""Per-step fault tolerance over tpu_dist with torchft (issue 33 item 3).

    .venv/bin/python examples/python/ft_hsdp.py [--replica-groups 3] [--ranks-per-group 1]
        [--kill-group 1] [--kill-at-step 10] [--steps-after-rejoin 10] [--out DIR]

The driver starts torchft's Lighthouse on a free loopback port and R replica
groups of K ranks each (one process per rank, torch.set_num_threads(1)).
Inside a replica group the ranks are data-parallel over a tpu_dist group
(gradients all-reduced AVG, DDP); across replica groups rank k of every group
is in torchft's replica dimension, a `tpu_dist.torchft.ProcessGroupTpuDist`
re-formed per quorum (HSDP's replicate dimension with a 1-wide shard
dimension). Every step: start_quorum (synchronous), forward/backward on the
batch of (step, replica group, rank), intra-group all-reduce, manager
all-reduce AVG over the quorum's participants, should_commit, SGD with
momentum. The rank of --kill-group stalls before its all-reduce of step
--kill-at-step (the others are already waiting in theirs) and the driver
SIGKILLs all its ranks there, then starts them again at once: the other
groups keep stepping (their in-flight all-reduce fails within milliseconds
-- tpu_dist sees the dead peer --, that step is not committed, and the
Lighthouse forms a quorum without the dead group once its heartbeat times
out), and the restarted group joins a later quorum and heals from a live
peer through torchft's checkpoint transport (HTTP): model and optimizer
state at the quorum's step. No group is restarted from a checkpoint. Once the
restarted group has committed a step, the driver writes DIR/stop (an
absolute step --steps-after-rejoin ahead) and every rank stops there;
without a kill the run stops at --steps.

Oracle (checked at the end, exit status 1 on a mismatch): every rank logs,
per step attempt, the step number, the quorum id and the quorum's
participant count just before the manager all-reduce ("pre"), and whether
the step was committed after should_commit ("post"). A committed step's
participants are the replica groups that logged "pre" for that step in the
quorum that committed it (their number must equal the logged count; a step
committed in two quorums is an error). The replay, in plain torch on one
process, starts from the same seeded model and for each committed step in
order averages the gradients of the participants' batches (each group's own
K-rank average first) and takes the same SGD step; its final weights must
equal every rank's final weights (fp32, max abs difference <= --tolerance,
default 1e-5, for sums taken in another order than the replay's; measured
0.0 at K = 1).

Measured and printed: the steps the survivors committed while the killed
group was down (they never stopped), the steps the killed group missed, the
uncommitted attempts (the broken step), and the seconds from the kill (and
from its restart) to the restarted group's first committed step, split into
process start to Manager ready (Python, torch, torchft imports) and Manager
ready to the first committed step (quorum, live-state transfer, the step); a
JSON summary goes to DIR/summary.json. docs/fault_tolerance.md compares the
figures with a restart of the whole job from its last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any, Optional

import torch

IN_DIM, HIDDEN, BATCH = 16, 32, 8
LR, MOMENTUM = 0.05, 0.9


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(IN_DIM, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, 1))


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def batch(step: int, group: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of (step, replica group, rank in group): the same wherever
    and whenever it is computed."""
    g = torch.Generator().manual_seed(1_000_003 * step + 1009 * group + rank)
    x = torch.randn(BATCH, IN_DIM, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x, y


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one rank ----------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore
    from torchft import Manager

    import tpu_dist  # noqa: F401  (registers the backend)
    from tpu_dist.torchft import ProcessGroupTpuDist

    group, rank, k = args.group, args.rank, args.ranks_per_group
    log = open(args.log, "a", buffering=1)
    timeout = timedelta(seconds=args.op_timeout)
    store = TCPStore("127.0.0.1", args.store_port, is_master=(rank == 0),
                     wait_for_workers=False, timeout=timedelta(seconds=60))
    intra = None
    if k > 1:  # the replica group's own data-parallel group over tpu_dist
        dist.init_process_group("tpu_dist", store=PrefixStore("intra", store), rank=rank,
                                world_size=k, timeout=timeout)
        intra = dist.group.WORLD
    model = make_model()
    optim = make_optimizer(model)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        optim.load_state_dict(sd["optim"])

    pg = ProcessGroupTpuDist(timeout=timeout)
    manager = Manager(pg=pg, load_state_dict=load_state_dict, state_dict=state_dict,
                      min_replica_size=1, use_async_quorum=False,
                      timeout=timedelta(seconds=args.op_timeout * 2),
                      quorum_timeout=timedelta(seconds=60),
                      connect_timeout=timedelta(seconds=30),
                      rank=rank, world_size=k, store_addr="127.0.0.1",
                      store_port=args.store_port, lighthouse_addr=args.lighthouse,
                      replica_id=f"ft_{group}", hostname="127.0.0.1",
                      init_sync=False)
    params = list(model.parameters())
    log.write(json.dumps({"kind": "ready", "t": time.time(), "group": group, "rank": rank,
                          "inc": args.incarnation, "pid": os.getpid()}) + "\n")
    if args.incarnation == 0:
        start_barrier(args)
    try:
        while manager.current_step() < target_steps(args):
            manager.start_quorum()
            step = manager.current_step()
            if step >= target_steps(args):  # healed to the end
                break
            optim.zero_grad(set_to_none=False)
            x, y = batch(step, group, rank)
            loss_of(model, x, y).backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            if intra is not None:
                dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=intra)
            # Logged before the all-reduce: a rank killed after it still
            # counts where its gradient did.
            quorum = manager._quorum_id
            log.write(json.dumps({
                "kind": "pre", "t": time.time(), "group": group, "rank": rank,
                "inc": args.incarnation, "step": step, "quorum": quorum,
                "participants": manager.num_participants()}) + "\n")
            if step == args.stall_at_step:  # the driver SIGKILLs this rank now
                time.sleep(120)
            manager.allreduce(flat).wait()
            committed = manager.should_commit()
            if committed:
                off = 0
                for p in params:
                    p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                    off += p.numel()
                optim.step()
            log.write(json.dumps({
                "kind": "post", "t": time.time(), "group": group, "rank": rank,
                "inc": args.incarnation, "step": step, "quorum": quorum,
                "committed": committed}) + "\n")
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
        torch.save({n: t.clone() for n, t in model.state_dict().items()}, args.final)
        log.write(json.dumps({"t": time.time(), "done": True, "group": group, "rank": rank,
                              "reconfigures": pg.reconfigures,
                              "instances": pg.instances_created}) + "\n")
    finally:
        manager.shutdown(wait=False)
        pg.shutdown()
        if intra is not None:
            dist.destroy_process_group()
        log.close()
    return 0


def target_steps(args: argparse.Namespace) -> int:
    """The step to stop at: the driver's stop file once written (the same
    absolute step for every rank, written well ahead of it), else --steps."""
    try:
        with open(os.path.join(args.out, "stop")) as f:
            return min(args.steps, int(f.read()))
    except (FileNotFoundError, ValueError):
        return args.steps


def write_stop(args: argparse.Namespace, step: int) -> None:
    tmp = os.path.join(args.out, "stop.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(args.out, "stop"))


def start_barrier(args: argparse.Namespace) -> None:
    """The first incarnations wait for each other's Managers before the
    first quorum (else the first quorum holds whoever imported torch first,
    and the rest join later by healing: correct, but not this example)."""
    open(os.path.join(args.out, f"ready_g{args.group}_r{args.rank}"), "w").close()
    want = [os.path.join(args.out, f"ready_g{g}_r{r}")
            for g in range(args.replica_groups) for r in range(args.ranks_per_group)]
    deadline = time.time() + 120
    while not all(os.path.exists(w) for w in want):
        if time.time() > deadline:
            raise TimeoutError(f"ft_hsdp: replica group {args.group} rank {args.rank}: "
                               f"the other ranks were not ready after 120 s")
        time.sleep(0.05)


# --- the replay oracle --------------------------------------------------------


def read_log(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def participants_per_step(records: list[dict[str, Any]], steps: int) -> dict[int, list[int]]:
    """step -> sorted replica groups whose gradients the committed step
    averaged: the groups that logged ("pre") that step in the quorum that
    committed it; their number must equal the logged participant count."""
    committed: dict[int, set[Any]] = {}
    for r in records:
        if r.get("kind") == "post" and r["committed"]:
            committed.setdefault(r["step"], set()).add(r["quorum"])
    parts: dict[int, list[int]] = {}
    for s in range(steps):
        quorums = committed.get(s, set())
        if len(quorums) != 1:
            raise AssertionError(f"step {s}: committed in quorums {sorted(quorums)} (want one)")
        (q,) = quorums
        pre = [r for r in records if r.get("kind") == "pre" and r["step"] == s and r["quorum"] == q]
        groups = sorted({r["group"] for r in pre})
        counts = {r["participants"] for r in pre}
        if counts != {len(groups)}:
            raise AssertionError(f"step {s} (quorum {q}): groups {groups} took part but the "
                                 f"logged participant counts are {sorted(counts)}")
        parts[s] = groups
    return parts


def replay(parts: dict[int, list[int]], steps: int,
           ranks_per_group: int) -> dict[str, torch.Tensor]:
    """Plain torch, one process: the committed steps in order, each averaging
    the gradients of its participants' batches (a group's K ranks first)."""
    model = make_model()
    optim = make_optimizer(model)
    params = list(model.parameters())
    for s in range(steps):
        total = [torch.zeros_like(p) for p in params]
        for g in parts[s]:
            for r in range(ranks_per_group):
                model.zero_grad(set_to_none=False)
                x, y = batch(s, g, r)
                loss_of(model, x, y).backward()
                for acc, p in zip(total, params):
                    acc += p.grad / ranks_per_group
        for acc, p in zip(total, params):
            p.grad.copy_(acc / len(parts[s]))
        optim.step()
    return {n: t.clone() for n, t in model.state_dict().items()}


# --- the driver ---------------------------------------------------------------


class Rank:
    def __init__(self, args: argparse.Namespace, group: int, rank: int, store_port: int,
                 lighthouse: str, incarnation: int) -> None:
        self.group, self.rank, self.store_port = group, rank, store_port
        out = args.out
        cmd = [sys.executable, os.path.abspath(__file__), "--worker",
               "--group", str(group), "--rank", str(rank),
               "--replica-groups", str(args.replica_groups),
               "--ranks-per-group", str(args.ranks_per_group), "--steps", str(args.steps),
               "--out", out,
               "--store-port", str(store_port), "--lighthouse", lighthouse,
               "--incarnation", str(incarnation), "--op-timeout", str(args.op_timeout),
               "--step-sleep", str(args.step_sleep),
               "--stall-at-step", str(args.kill_at_step if incarnation == 0 and
                                      group == args.kill_group else -1),
               "--log", os.path.join(out, f"g{group}_r{rank}.jsonl"),
               "--final", os.path.join(out, f"final_g{group}_r{rank}.pt")]
        env = dict(os.environ, OMP_NUM_THREADS="1", TPU_DIST_JOB_ID=args.job_id)
        self.stderr = open(os.path.join(out, f"g{group}_r{rank}_i{incarnation}.err"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.stderr, stderr=subprocess.STDOUT)


def start_group(args: argparse.Namespace, group: int, lighthouse: str,
                incarnation: int) -> list[Rank]:
    port = free_port()
    return [Rank(args, group, r, port, lighthouse, incarnation)
            for r in range(args.ranks_per_group)]


def last_step(args: argparse.Namespace, group: int, kind: str = "post") -> int:
    recs = [r for r in read_log(os.path.join(args.out, f"g{group}_r0.jsonl"))
            if r.get("kind") == kind]
    return recs[-1]["step"] if recs else -1


def drive(args: argparse.Namespace) -> int:
    from torchft.coordination import LighthouseServer

    os.makedirs(args.out, exist_ok=True)
    lighthouse = LighthouseServer(bind=f"127.0.0.1:{free_port()}", min_replicas=1,
                                  join_timeout_ms=args.join_timeout_ms,
                                  heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    lh_addr = lighthouse.address()
    groups = {g: start_group(args, g, lh_addr, 0) for g in range(args.replica_groups)}
    all_ranks = [r for rs in groups.values() for r in rs]
    kill_t: Optional[float] = None
    restart_t: Optional[float] = None
    stop_written = False
    if args.kill_group < 0:
        write_stop(args, args.steps)
    deadline = time.time() + args.deadline_s
    rc = 0
    try:
        while True:
            if time.time() > deadline:
                raise TimeoutError(f"ft_hsdp: not done after {args.deadline_s}s "
                                   f"(logs in {args.out})")
            if kill_t is None and args.kill_group >= 0 and \
                    last_step(args, args.kill_group, "pre") >= args.kill_at_step:
                for r in groups[args.kill_group]:
                    r.proc.send_signal(signal.SIGKILL)
                for r in groups[args.kill_group]:
                    r.proc.wait(timeout=30)
                kill_t = time.time()
                print(f"ft_hsdp: SIGKILLed replica group {args.kill_group} in its step "
                      f"{last_step(args, args.kill_group, 'pre')} (entering the all-reduce)",
                      flush=True)
                time.sleep(args.restart_delay)
                groups[args.kill_group] = start_group(args, args.kill_group, lh_addr, 1)
                all_ranks += groups[args.kill_group]
                restart_t = time.time()
            if restart_t is not None and not stop_written:
                back = [r for r in read_log(os.path.join(args.out, f"g{args.kill_group}_r0.jsonl"))
                        if r.get("kind") == "post" and r["inc"] == 1 and r["committed"]]
                if back:
                    stop_at = max(last_step(args, g) for g in groups) + args.steps_after_rejoin
                    write_stop(args, stop_at)
                    stop_written = True
            live = [r for rs in groups.values() for r in rs]
            codes = [r.proc.poll() for r in live]
            if any(c not in (None, 0) for c in codes):
                bad = [(r.group, r.rank, c) for r, c in zip(live, codes) if c not in (None, 0)]
                raise RuntimeError(f"ft_hsdp: ranks failed (group, rank, exit): {bad}; "
                                   f"logs in {args.out}")
            if all(c == 0 for c in codes) and (kill_t is not None or args.kill_group < 0):
                break
            time.sleep(0.05)
    except BaseException:
        rc = 1
        raise
    finally:
        for r in all_ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait()
            r.stderr.close()
        lighthouse.shutdown()
        if rc:
            print(f"ft_hsdp: failed; logs in {args.out}", file=sys.stderr)
    ports = [int(lh_addr.rsplit(":", 1)[1].strip("/"))] + sorted({r.store_port for r in all_ranks})
    return check(args, kill_t, restart_t, ports)


def check(args: argparse.Namespace, kill_t: Optional[float], restart_t: Optional[float],
          ports: list[int]) -> int:
    records = []
    for g in range(args.replica_groups):
        for r in range(args.ranks_per_group):
            records += read_log(os.path.join(args.out, f"g{g}_r{r}.jsonl"))
    steps = [r for r in records if "step" in r]
    final_step = target_steps(args)
    parts = participants_per_step(steps, final_step)
    expected = replay(parts, final_step, args.ranks_per_group)
    worst = 0.0
    for g in range(args.replica_groups):
        for r in range(args.ranks_per_group):
            final = torch.load(os.path.join(args.out, f"final_g{g}_r{r}.pt"))
            for name, t in expected.items():
                worst = max(worst, (final[name] - t).abs().max().item())
    summary: dict[str, Any] = {"steps": final_step, "replica_groups": args.replica_groups,
                               "ranks_per_group": args.ranks_per_group,
                               "oracle_max_abs_diff": worst, "ports": ports,
                               "participants": {str(s): p for s, p in sorted(parts.items())}}
    if kill_t is not None and restart_t is not None:
        kg = args.kill_group
        posts = [r for r in steps if r.get("kind") == "post"]
        back = [r for r in posts if r["group"] == kg and r["inc"] == 1 and r["committed"]]
        first_back = min(back, key=lambda r: r["t"])
        survivors = [r for r in posts if r["group"] != kg and r["rank"] == 0 and r["committed"]
                     and kill_t <= r["t"] <= first_back["t"]]
        missed = [s for s, p in parts.items() if kg not in p]
        ready = [r for r in records if r.get("kind") == "ready" and r["group"] == kg
                 and r["inc"] == 1]
        summary.update({
            "seconds_restart_to_manager_ready": round(max(r["t"] for r in ready) - restart_t, 3),
            "seconds_manager_ready_to_rejoin": round(first_back["t"] - max(r["t"] for r in ready),
                                                      3),
            "killed_group": kg,
            "survivor_steps_committed_while_down": len({r["step"] for r in survivors}),
            "steps_missed_by_killed_group": len(missed),
            "rejoined_at_step": first_back["step"],
            "seconds_kill_to_rejoin": round(first_back["t"] - kill_t, 3),
            "seconds_restart_to_rejoin": round(first_back["t"] - restart_t, 3),
            # Step attempts that were not committed (the one the kill broke).
            "uncommitted_attempts": len({(r["step"], r["quorum"]) for r in posts
                                         if not r["committed"]}),
        })
    summary["done"] = [r for r in records if r.get("done")]
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("participants", "done")}),
          flush=True)
    if worst > args.tolerance:
        print(f"ft_hsdp: FAIL: final weights differ from the replay by {worst:.3g} "
              f"(> {args.tolerance})", flush=True)
        return 1
    print(f"ft_hsdp: OK: every rank's final weights equal the replay of the recorded "
          f"participants (max abs diff {worst:.3g})", flush=True)
    return 0


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replica-groups", type=int, default=3)
    p.add_argument("--ranks-per-group", type=int, default=1)
    p.add_argument("--steps", type=int, default=400,
                   help="the step to stop at without a kill; with one, a cap (the driver "
                        "stops the run --steps-after-rejoin steps after the rejoin)")
    p.add_argument("--steps-after-rejoin", type=int, default=10)
    p.add_argument("--kill-group", type=int, default=1, help="-1: kill none")
    p.add_argument("--kill-at-step", type=int, default=10)
    p.add_argument("--restart-delay", type=float, default=0.0)
    p.add_argument("--op-timeout", type=float, default=5.0)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--join-timeout-ms", type=int, default=2000)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--deadline-s", type=float, default=300.0)
    p.add_argument("--out", default="")
    p.add_argument("--job-id", default=f"ft_hsdp_{os.getpid()}")
    # Worker side (the driver passes these).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--store-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    p.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stall-at-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--log", default="", help=argparse.SUPPRESS)
    p.add_argument("--final", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.worker:
        return worker(args)
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="ft_hsdp_")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
