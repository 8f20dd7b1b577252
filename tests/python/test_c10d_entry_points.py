"""The c10d entry points that docs/c10d_support.tsv lists as supported and that
no other test covers, each run on tpu_dist and on torch's Gloo in the same
ranks (a Gloo group over the same ranks is the oracle): functional
collectives (eager and under torch.compile), object collectives, the
coalescing manager, torch 2.15's *_single / gather_into_tensor entry points,
monitored_barrier, the Work API, DDP's comm hooks (but PowerSGD), subgroups
by enumeration, the flight
recorder, and the TORCH_DISTRIBUTED_DEBUG=DETAIL wrapper.

Where Gloo refuses an entry point, the check is that tpu_dist refuses it too
(same outcome as Gloo), unless the table says it differs. The ranks run once
per module (world 2); each test asserts its own part of the results.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

TIMEOUT = datetime.timedelta(seconds=60)
WORLD = 2


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", value) or ("error", exception type name)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the outcome is compared with Gloo's
        return "error", type(e).__name__


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _both(ok: dict[str, bool], name: str, run: Callable[[Any], Any], tpu: Any,
          gloo: Any) -> None:
    """Runs `run(group)` on both groups; records whether tpu_dist's outcome
    (value, or the fact of an error) equals Gloo's, and what each gave."""
    a = _outcome(lambda: run(tpu))
    b = _outcome(lambda: run(gloo))
    ok[name] = a[0] == b[0] and (a[0] == "error" or _same(a[1], b[1]))
    ok[f"{name} outcome"] = (a[0], b[0])


def _x(rank: int, n: int, salt: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float64) * (rank + 1) + salt).to(dtype)


def _entry_points(rank: int, world: int) -> dict[str, Any]:
    import tpu_dist  # noqa: F401
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group("tpu_dist", timeout=TIMEOUT)
    tpu = dist.group.WORLD
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    ok: dict[str, Any] = {}

    # -- functional collectives (eager): each result waited, compared to Gloo.
    def fc(g: Any) -> list[torch.Tensor]:
        w = funcol.wait_tensor
        outs = [
            w(funcol.all_reduce(_x(rank, 6, 1), "sum", g)),
            w(funcol.all_reduce(_x(rank, 6, 2), "max", g)),
            w(funcol.broadcast(_x(rank, 5, 3), 1, g)),
            w(funcol.all_gather_single(_x(rank, 4, 4), 0, g)),
            w(funcol.reduce_scatter_single(_x(rank, 2 * world, 5), "sum", 0, g)),
            w(funcol.all_to_all_single(_x(rank, 3 * world, 6), [3] * world, [3] * world, g)),
        ]
        outs += funcol.wait_tensors(funcol.all_reduce_coalesced(
            [_x(rank, 3, 7), _x(rank, 2, 8)], "sum", g))
        outs += funcol.wait_tensors(funcol.all_gather_single_coalesced(
            [_x(rank, 3, 9), _x(rank, 1, 10)], g))
        outs += funcol.wait_tensors(funcol.reduce_scatter_single_coalesced(
            [_x(rank, 2 * world, 11), _x(rank, world, 12)], "sum", [0, 0], g))
        return outs

    _both(ok, "functional", fc, tpu, gloo)

    # -- functional collectives under torch.compile (aot_eager: the traced
    # graph's c10d_functional ops run on the group; no C++ compiler needed).
    def compiled(g: Any) -> list[torch.Tensor]:
        torch._dynamo.reset()

        @torch.compile(backend="aot_eager", fullgraph=True)
        def step(x: torch.Tensor) -> torch.Tensor:
            y = funcol.all_reduce(x * 2, "sum", g)
            z = funcol.all_gather_single(y + 1, 0, g)
            return z.sum(0, keepdim=True) + funcol.reduce_scatter_single(z, "sum", 0, g)

        return [step(_x(rank, 4, 13))]

    _both(ok, "functional compiled", compiled, tpu, gloo)

    # -- object collectives.
    def objects(g: Any) -> list[Any]:
        got: list[Any] = []
        out: list[Any] = [None] * world
        dist.all_gather_object(out, {"r": rank, "s": "x" * rank}, group=g)
        got.append(out)
        gl = [None] * world if rank == 0 else None
        dist.gather_object(("g", rank), gl, dst=0, group=g)
        got.append(gl)
        bl = ["b", 3.5, {"k": [1, 2]}] if rank == 1 else [None] * 3
        dist.broadcast_object_list(bl, src=1, group=g)
        got.append(bl)
        sc: list[Any] = [None]
        dist.scatter_object_list(sc, [f"s{r}" for r in range(world)] if rank == 0 else None,
                                 src=0, group=g)
        got.append(sc)
        if rank == 0:
            dist.send_object_list([{"p2p": 1}, "two"], dst=1, group=g)
            got.append(None)
        else:
            rl: list[Any] = [None, None]
            dist.recv_object_list(rl, src=0, group=g)
            got.append(rl)
        return got

    _both(ok, "objects", objects, tpu, gloo)

    # -- coalescing manager (the fast paths: all_reduce, all_gather_single,
    # reduce_scatter_single) and batch_isend_irecv.
    def coalescing(g: Any) -> list[torch.Tensor]:
        a, b = _x(rank, 4, 14), _x(rank, 3, 15)
        with dist._coalescing_manager(group=g):
            dist.all_reduce(a, group=g)
            dist.all_reduce(b, group=g)
        ins = [_x(rank, 2, 16), _x(rank, 3, 17)]
        outs = [torch.empty(world * 2), torch.empty(world * 3)]
        with dist._coalescing_manager(group=g):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=g)
        rs_in = [_x(rank, 2 * world, 18), _x(rank, world, 19)]
        rs_out = [torch.empty(2), torch.empty(1)]
        with dist._coalescing_manager(group=g):
            for o, i in zip(rs_out, rs_in):
                dist.reduce_scatter_tensor(o, i, group=g)
        peer = 1 - rank
        recv = torch.empty(5)
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, _x(rank, 5, 20), peer, g),
                                         dist.P2POp(dist.irecv, recv, peer, g)]):
            r.wait()
        return [a, b, *outs, *rs_out, recv]

    _both(ok, "coalescing", coalescing, tpu, gloo)

    # -- torch 2.15's single-tensor entry points and gather_into_tensor.
    def singles(g: Any) -> list[torch.Tensor]:
        ag = torch.empty(world * 3)
        dist.all_gather_single(ag, _x(rank, 3, 21), group=g)
        rs = torch.empty(2)
        dist.reduce_scatter_single(rs, _x(rank, 2 * world, 22), group=g)
        return [ag, rs]

    _both(ok, "single entry points", singles, tpu, gloo)

    def gather_into_tensor(g: Any) -> list[torch.Tensor]:
        out = torch.empty(world * 3) if rank == 0 else None
        dist.gather_into_tensor(out, _x(rank, 3, 23), dst=0, group=g)
        return [out] if rank == 0 else []

    _both(ok, "gather_into_tensor", gather_into_tensor, tpu, gloo)

    # -- monitored_barrier (all ranks arrive) and the Work API.
    def monitored(g: Any) -> bool:
        dist.monitored_barrier(group=g, timeout=datetime.timedelta(seconds=30),
                               wait_all_ranks=True)
        return True

    _both(ok, "monitored_barrier", monitored, tpu, gloo)

    def work_api(g: Any) -> list[Any]:
        t = _x(rank, 8, 24)
        w = dist.all_reduce(t, group=g, async_op=True)
        w.wait()
        fut = dist.all_reduce(_x(rank, 2, 25), group=g, async_op=True).get_future()
        chained = fut.then(lambda f: f.value()[0] * 2).wait()
        return [w.is_completed(), w.is_success(), w.exception() is None, t,
                [r.clone() for r in w.result()], chained]

    _both(ok, "work api", work_api, tpu, gloo)

    # -- DDP comm hooks (torch's registry; PowerSGD is issue 38 item 1's test).
    from torch.distributed.algorithms.ddp_comm_hooks import (
        DDPCommHookType, register_ddp_comm_hook)

    def ddp_hooks(g: Any) -> list[torch.Tensor]:
        params: list[torch.Tensor] = []
        for hook in ("ALLREDUCE", "FP16_COMPRESS", "BF16_COMPRESS",
                     "QUANTIZE_PER_TENSOR", "QUANTIZE_PER_CHANNEL"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(),
                                        torch.nn.Linear(6, 2))
            ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=g)
            register_ddp_comm_hook(DDPCommHookType[hook], ddp, state=g)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            gen = torch.Generator().manual_seed(rank)
            for _ in range(3):
                opt.zero_grad()
                ddp(torch.randn(4, 8, generator=gen)).square().sum().backward()
                opt.step()
            params += [p.detach().clone() for p in model.parameters()]
        return params

    _both(ok, "ddp hooks", ddp_hooks, tpu, gloo)

    # -- new_subgroups_by_enumeration / new_group(use_local_synchronization).
    sub_t, _ = dist.new_subgroups_by_enumeration([[0], [1]])
    t = _x(rank, 3, 26)
    dist.all_reduce(t, group=sub_t)
    ok["subgroups_by_enumeration"] = torch.equal(t, _x(rank, 3, 26))
    local = dist.new_group([0, 1], use_local_synchronization=True)
    t = _x(rank, 3, 27)
    dist.all_reduce(t, group=local)
    ref = _x(rank, 3, 27)
    dist.all_reduce(ref, group=gloo)
    ok["new_group local sync"] = torch.equal(t, ref) and dist.get_backend(local) == "tpu_dist"

    # -- flight recorder: torch attaches its recording hook to every group that
    # does not record itself (Gloo does); a backend's entries are dumped under
    # its name. tpu_dist records itself, so torch's hook is only attached with
    # TPU_DIST_TORCH_FR_HOOK=1 (the fixture sets it). The same all_reduce is
    # recorded for both groups alike.
    from torch._C._distributed_c10d import _dump_fr_trace_json
    import json

    dist.all_reduce(torch.ones(3))
    dist.all_reduce(torch.ones(3), group=gloo)

    def last_all_reduce(backend: str, group: Any) -> dict[str, Any]:
        entries = json.loads(_dump_fr_trace_json(backend=backend)).get("entries", [])
        mine = [e for e in entries if (e.get("process_group") or [""])[0] == group.group_name
                and e.get("profiling_name", "").endswith("all_reduce")]
        if not mine:
            return {"missing": sorted({e.get("profiling_name", "") for e in entries})}
        e = mine[-1]
        return {k: e.get(k) for k in ("input_sizes", "output_sizes", "input_dtypes", "state",
                                      "is_p2p")} | {"op": e["profiling_name"].split(":")[-1]}

    ok["flight recorder entries"] = (last_all_reduce("tpu_dist", tpu), last_all_reduce("gloo", gloo))
    ok["flight recorder"] = ok["flight recorder entries"][0] == ok["flight recorder entries"][1]

    dist.barrier()
    dist.destroy_process_group()
    return ok


def _detail_wrapper(rank: int, world: int, backend: str) -> dict[str, Any]:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the backend in torch's
    ProcessGroupWrapper (a Gloo helper group checks every op's signature
    first): ops work, and a shape mismatch is reported by the wrapper
    (the first line of its message, which names this rank's op)."""
    import tpu_dist  # noqa: F401

    dist.set_debug_level_from_env()  # torch read the variable at import, before run_ranks set it
    dist.init_process_group(backend, timeout=TIMEOUT)
    ok: dict[str, Any] = {"wrapped": type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__}
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    ok["all_reduce"] = torch.equal(t, torch.full((4,), 3.0))
    try:
        dist.all_reduce(torch.ones(3 + rank))
        ok["mismatch detected"] = False
    except RuntimeError as e:
        ok["mismatch detected"] = str(e).splitlines()[0][:200]
    dist.destroy_process_group()
    return ok


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_entry_points, WORLD, timeout_s=300, env={"TPU_DIST_TORCH_FR_HOOK": "1"})


def _assert(results: list[dict[str, Any]], key: str) -> None:
    for rank, r in enumerate(results):
        assert r[key] is True, (rank, key, r.get(f"{key} outcome"))


def test_functional_collectives_match_gloo(results) -> None:
    _assert(results, "functional")
    assert results[0]["functional outcome"] == ("ok", "ok")


def test_compiled_functional_collectives_match_gloo(results) -> None:
    _assert(results, "functional compiled")
    assert results[0]["functional compiled outcome"] == ("ok", "ok")


def test_object_collectives_match_gloo(results) -> None:
    _assert(results, "objects")
    assert results[0]["objects outcome"] == ("ok", "ok")


def test_coalescing_manager_and_batch_p2p_match_gloo(results) -> None:
    _assert(results, "coalescing")
    assert results[0]["coalescing outcome"] == ("ok", "ok")


def test_single_tensor_entry_points_match_gloo(results) -> None:
    _assert(results, "single entry points")


def test_gather_into_tensor_same_outcome_as_gloo(results) -> None:
    """torch 2.15's gather_into_tensor: neither backend implements it (the
    c10d default refuses it); the table says so."""
    _assert(results, "gather_into_tensor")
    assert results[0]["gather_into_tensor outcome"] == ("error", "error")


def test_monitored_barrier_all_ranks_arrive(results) -> None:
    _assert(results, "monitored_barrier")
    assert results[0]["monitored_barrier outcome"] == ("ok", "ok")


def test_work_api_matches_gloo(results) -> None:
    _assert(results, "work api")
    assert results[0]["work api outcome"] == ("ok", "ok")


def test_ddp_comm_hooks_match_gloo(results) -> None:
    _assert(results, "ddp hooks")
    assert results[0]["ddp hooks outcome"] == ("ok", "ok")


def test_subgroups_by_enumeration_and_local_sync_groups(results) -> None:
    _assert(results, "subgroups_by_enumeration")
    _assert(results, "new_group local sync")


def test_flight_recorder_records_tpu_dist_ops_as_gloos(results) -> None:
    for r in results:
        assert r["flight recorder"] is True, r["flight recorder entries"]


def _torch_fr_hook_attached(rank: int, world: int) -> dict[str, Any]:
    import tpu_dist  # noqa: F401  (registers the backend)

    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=60))
    hooks = dist.distributed_c10d._world.pg_flight_recorder_hooks
    t = torch.ones(3)
    dist.all_reduce(t)
    out = {"attached": dist.group.WORLD in hooks, "sum": t.tolist()}
    dist.destroy_process_group()
    return out


def test_torch_flight_recorder_hook_is_off_by_default() -> None:
    """tpu_dist records its ops itself: without TPU_DIST_TORCH_FR_HOOK=1
    torch's FlightRecorderHook (a second entry per op, with a Python stack)
    is not attached to its groups."""
    for r in run_ranks(_torch_fr_hook_attached, WORLD, timeout_s=120):
        assert r == {"attached": False, "sum": [WORLD * 1.0] * 3}, r


def test_detail_debug_wrapper_as_over_gloo() -> None:
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    ours = run_ranks(_detail_wrapper, WORLD, "tpu_dist", timeout_s=180, env=env)
    gloo = run_ranks(_detail_wrapper, WORLD, "gloo", timeout_s=180, env=env)
    for rank, (r, g) in enumerate(zip(ours, gloo)):
        assert r["wrapped"] == g["wrapped"] == "_ProcessGroupWrapper", (r, g)
        assert r["all_reduce"] and g["all_reduce"], (r, g)
        assert str(r["mismatch detected"]).startswith(
            "Detected mismatch between collectives on ranks."), r
        assert r["mismatch detected"] == g["mismatch detected"], (rank, r, g)
