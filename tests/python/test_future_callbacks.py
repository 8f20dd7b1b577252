"""Work futures and the callbacks chained on them, side by side with Gloo
(issue 38 item 1): a callback that issues a collective and waits for it (what
DDP's PowerSGD hook does) used to deadlock tpu_dist, because callbacks ran on
the op thread, where the nested op queued behind the op whose completion ran
the callback; nothing timed out. Now futures complete on callback threads.

Every DDP comm hook of torch.distributed.algorithms.ddp_comm_hooks that runs
on CPU trains a small model to the same losses and weights as over Gloo, to
the bit (world 2: a sum of two addends is the same in any order). Not here,
because they cannot run on CPU with Gloo either:
* DDP(mixed_precision=...) (mixed_precision_hooks._reducer_allreduce_and_upcast_hook)
  and _apply_optimizer_in_backward (optimizer_overlap_hooks.
  _apply_optim_in_backward_hook) create a torch.Stream(): CUDA only.
* ddp_zero_hook.hook_with_zero_step[_interleaved] refuses every backend but
  NCCL/HCCL ("Gloo backend using Overlapping DDP with ZeRO may meet hangs").
batched_powerSGD_hook is in the list but fails in torch 2.15 itself (an
AssertionError in _orthogonalize at its first compressed step, over Gloo too):
tpu_dist must fail the same way.

A callback that raises fails the future then() returned, with that exception,
as over Gloo; the group's next ops work and its op thread lives on.
Every run has a deadline (ranks.run_ranks kills ranks still running).
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks, thread_names

TIMEOUT = datetime.timedelta(seconds=30)
MIB_FLOATS = (1 << 20) // 4


def _init() -> dist.ProcessGroup:
    """tpu_dist as the default group; returns a Gloo group over the same ranks."""
    import tpu_dist  # noqa: F401

    dist.init_process_group("tpu_dist", timeout=TIMEOUT)
    return dist.new_group(backend="gloo", timeout=TIMEOUT)


def _nested(group: dist.ProcessGroup, n: int, variant: str) -> list[torch.Tensor]:
    rank = dist.get_rank()
    outer = torch.full((n,), float(rank + 1))
    if variant == "async":
        def cb(fut):
            return dist.all_reduce(torch.ones(n), group=group,
                                   async_op=True).get_future().wait()[0]
    elif variant == "blocking":
        def cb(fut):
            x = torch.ones(n)
            dist.all_reduce(x, group=group)
            return x
    else:  # "chain": two nested ops, each in its own callback, as PowerSGD
        def cb(fut):
            x = fut.value()[0] * 2
            return dist.all_reduce(x, group=group, async_op=True).get_future().wait()[0]
    # A 64 MiB op ahead keeps the outer one pending until then() is attached,
    # so the callback runs where completions run, not here at once.
    dist.all_reduce(torch.ones(16 << 20), group=group, async_op=True)
    fut = dist.all_reduce(outer, group=group, async_op=True).get_future().then(cb)
    if variant == "chain":
        fut = fut.then(lambda f: dist.all_reduce(
            f.value() + 1, group=group, async_op=True).get_future().wait()[0])
    inner = fut.wait()
    return [outer, inner]


def _nested_rank(rank: int, world: int, n: int, variant: str) -> bool:
    gloo = _init()
    want = _nested(gloo, n, variant)
    got = _nested(dist.group.WORLD, n, variant)
    # The group still works, in issue order, after the nested ops.
    after = torch.full((3,), float(rank))
    dist.all_reduce(after)
    same = all(torch.equal(a, b) for a, b in zip(got, want))
    dist.destroy_process_group()
    # destroy_process_group stops the callback threads with the op thread.
    left = thread_names("tpud-")
    return (same and torch.equal(after, torch.full((3,), float(sum(range(world)))))
            and not left)


@pytest.mark.parametrize("variant", ["async", "blocking", "chain"])
@pytest.mark.parametrize("n", [4, MIB_FLOATS], ids=["16B", "1MiB"])
def test_collective_nested_in_a_future_callback(n: int, variant: str) -> None:
    assert all(run_ranks(_nested_rank, 2, n, variant, timeout_s=60))


def _waits_for_a_later_op(rank: int, world: int) -> bool:
    """A's callback waits on B's future, B issued after A on the same group
    (queued behind A on the op thread)."""
    gloo = _init()
    results = []
    for group in (gloo, dist.group.WORLD):
        box: dict[str, torch.futures.Future] = {}
        # A 64 MiB op ahead keeps A pending until then() is attached below
        # (on a completed future then() would run the callback here, at once).
        dist.all_reduce(torch.ones(16 << 20), group=group, async_op=True)
        a = dist.all_reduce(torch.ones(4), group=group, async_op=True)
        fut = a.get_future().then(lambda f: box["b"].wait()[0] + f.value()[0])
        box["b"] = dist.all_reduce(torch.full((4,), 2.0), group=group,
                                   async_op=True).get_future()
        results.append(fut.wait())
    dist.destroy_process_group()
    return torch.equal(results[0], results[1])


def test_callback_waiting_on_an_op_issued_after_its_own() -> None:
    assert all(run_ranks(_waits_for_a_later_op, 2, timeout_s=60))


def _nested_times_out(rank: int, world: int) -> tuple[str, float]:
    """Rank 1 never joins the nested op: rank 0's fails at the group's 2 s
    deadline (it used to queue behind its parent forever, and no deadline
    fired)."""
    import time

    import tpu_dist  # noqa: F401

    dist.init_process_group("tpu_dist", timeout=TIMEOUT)
    short = dist.new_group(backend="tpu_dist", timeout=datetime.timedelta(seconds=2))
    dist.all_reduce(torch.ones(16 << 20), group=short, async_op=True)
    fut = dist.all_reduce(torch.ones(4), group=short, async_op=True).get_future()
    if rank == 0:
        fut = fut.then(lambda f: dist.all_reduce(torch.ones(4), group=short,
                                                 async_op=True).get_future().wait())
    t0 = time.monotonic()
    try:
        fut.wait()
        error = "no error"
    except Exception as e:  # noqa: BLE001 - checked by the caller
        error = str(e).splitlines()[0]
    took = time.monotonic() - t0
    dist.barrier()  # the world group is unaffected
    dist.destroy_process_group()
    return error, took


def test_an_op_nested_in_a_callback_keeps_its_deadline() -> None:
    (error, took), (error1, _) = run_ranks(_nested_times_out, 2, timeout_s=60)
    assert "DEADLINE_EXCEEDED" in error and "allreduce" in error, error
    assert 1.5 < took < 10, took
    assert error1 == "no error", error1


def _raising(rank: int, world: int) -> dict[str, object]:
    gloo = _init()
    out: dict[str, object] = {}
    for name, group in (("gloo", gloo), ("tpu_dist", dist.group.WORLD)):
        def boom(fut):
            raise ValueError(f"boom from {name} on rank {rank}")
        fut = dist.all_reduce(torch.ones(4), group=group, async_op=True).get_future().then(boom)
        try:
            fut.wait()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001 - compared with Gloo's below
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        # A raising done-callback is logged by torch; nothing else breaks.
        work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
        work.get_future().add_done_callback(lambda f: 1 / 0)
        work.wait()
        x = torch.full((4,), float(rank))
        dist.all_reduce(x, group=group)
        out[name + " next op"] = torch.equal(x, torch.full((4,), float(sum(range(world)))))
    out["op thread alive"] = "tpud-op" in thread_names()
    dist.destroy_process_group()
    return out


def test_a_raising_callback_fails_its_future_and_harms_no_thread() -> None:
    for rank, out in enumerate(run_ranks(_raising, 2, timeout_s=60)):
        # torch wraps it: "RuntimeError: Got the following error when running
        # the callback: ValueError: boom from gloo on rank 0".
        assert out["gloo"].endswith(f"ValueError: boom from gloo on rank {rank}"), out
        assert out["tpu_dist"] == out["gloo"].replace("gloo", "tpu_dist"), out
        assert out["gloo next op"] and out["tpu_dist next op"], out
        assert out["op thread alive"], out


# ---------------------------------------------------------------- DDP hooks

STEPS = 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    # Matrices big enough that PowerSGD compresses them (rank 1 and 2).
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8))


def _hooks(group: dist.ProcessGroup, backend: str):
    """name -> (hook, state factory, extra setup) for one group."""
    from torch.distributed.algorithms.ddp_comm_hooks import (
        debugging_hooks, default_hooks, powerSGD_hook, post_localSGD_hook,
        quantization_hooks)

    def psgd(rank: int, warm: bool = True, feedback: bool = True):
        return lambda: powerSGD_hook.PowerSGDState(
            process_group=group, matrix_approximation_rank=rank, start_powerSGD_iter=2,
            min_compression_rate=0.5, warm_start=warm, use_error_feedback=feedback,
            random_seed=7)

    def local_sgd():
        # Local SGD within each rank (subgroups of one) from step 2 on.
        sub, _ = dist.new_subgroups(group_size=1, backend=backend)
        return post_localSGD_hook.PostLocalSGDState(
            process_group=group, subgroup=sub, start_localSGD_iter=2)

    same = lambda: group  # noqa: E731
    return {
        "allreduce": (default_hooks.allreduce_hook, same),
        "fp16_compress": (default_hooks.fp16_compress_hook, same),
        "bf16_compress": (default_hooks.bf16_compress_hook, same),
        "quantization_pertensor": (quantization_hooks.quantization_pertensor_hook, same),
        "quantization_perchannel": (quantization_hooks.quantization_perchannel_hook, same),
        "powerSGD rank 1": (powerSGD_hook.powerSGD_hook, psgd(1)),
        "powerSGD rank 2 no warm start": (powerSGD_hook.powerSGD_hook, psgd(2, warm=False)),
        "powerSGD rank 1 no error feedback": (powerSGD_hook.powerSGD_hook,
                                              psgd(1, feedback=False)),
        "batched powerSGD rank 1": (powerSGD_hook.batched_powerSGD_hook, psgd(1)),
        "batched powerSGD rank 2": (powerSGD_hook.batched_powerSGD_hook, psgd(2)),
        "fp16_compress_wrapper(powerSGD)": (
            default_hooks.fp16_compress_wrapper(powerSGD_hook.powerSGD_hook), psgd(1)),
        "bf16_compress_wrapper(batched powerSGD)": (
            default_hooks.bf16_compress_wrapper(powerSGD_hook.batched_powerSGD_hook), psgd(1)),
        "post_localSGD": (post_localSGD_hook.post_localSGD_hook, local_sgd),
        "noop": (debugging_hooks.noop_hook, lambda: None),
        "fused SGD after allreduce (_register_fused_optim)": (None, same),
        "post_localSGD + PeriodicModelAverager": (post_localSGD_hook.post_localSGD_hook,
                                                  local_sgd),
    }


def _train(group: dist.ProcessGroup, backend: str, name: str) -> tuple[list[float], list]:
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    hook, state = _hooks(group, backend)[name]
    ddp = DDP(_model(), process_group=group)
    if hook is None:
        ddp._register_fused_optim(torch.optim.SGD, lr=0.05)
        opt = None
    else:
        ddp.register_comm_hook(state(), hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        if "Averager" in name:
            opt = PostLocalSGDOptimizer(opt, averagers.PeriodicModelAverager(
                period=2, warmup_steps=2, process_group=group))
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in ddp.parameters()]


def _train_or_error(group: dist.ProcessGroup, backend: str, name: str):
    try:
        return _train(group, backend, name)
    except Exception as e:  # noqa: BLE001 - compared with Gloo's
        return f"{type(e).__name__}: {e}", None


def _ddp_hooks_rank(rank: int, world: int) -> dict[str, tuple[bool, object, object]]:
    gloo = _init()
    out = {}
    for name in _hooks(gloo, "gloo"):
        want_loss, want_params = _train_or_error(gloo, "gloo", name)
        got_loss, got_params = _train_or_error(dist.group.WORLD, "tpu_dist", name)
        if want_params is None:  # torch's hook fails over Gloo: the same way
            same = got_loss == want_loss
        else:
            same = got_params is not None and got_loss == want_loss and all(
                torch.equal(a, b) for a, b in zip(got_params, want_params))
        out[name] = (same, got_loss, want_loss)
    dist.destroy_process_group()
    return out


def test_ddp_every_comm_hook_trains_like_gloo() -> None:
    for out in run_ranks(_ddp_hooks_rank, 2, timeout_s=240):
        bad = {k: v for k, v in out.items() if not v[0]}
        assert not bad, bad
        # The hooks did train (losses moved), PowerSGD among them.
        for name in ("powerSGD rank 1", "powerSGD rank 2 no warm start", "quantization_pertensor",
                     "post_localSGD + PeriodicModelAverager"):
            assert isinstance(out[name][1], list) and out[name][1][0] != out[name][1][-1], out[name]
        # torch 2.15's batched_powerSGD_hook hands a 2-D Q to _orthogonalize,
        # which wants 3-D: AssertionError at its first compressed step, over
        # Gloo as over tpu_dist (compared above). Fails here once torch fixes it.
        assert out["batched powerSGD rank 1"][2] == "AssertionError: ", out["batched powerSGD rank 1"]


def _raising_hook_rank(rank: int, world: int) -> dict[str, object]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = _init()
    out: dict[str, object] = {}
    for name, group in (("gloo", gloo), ("tpu_dist", dist.group.WORLD)):
        def bad_hook(state, bucket):
            def boom(fut):
                raise ValueError(f"hook boom {name}")
            return dist.all_reduce(bucket.buffer(), group=state,
                                   async_op=True).get_future().then(boom)
        ddp = DDP(_model(), process_group=group)
        ddp.register_comm_hook(group, bad_hook)
        try:
            ddp(torch.randn(4, 32)).sum().backward()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001 - compared with Gloo's below
            out[name] = f"hook boom {name}" in str(e)
        x = torch.ones(4)
        dist.all_reduce(x, group=group)
        out[name + " next op"] = torch.equal(x, torch.full((4,), float(world)))
    out["op thread alive"] = "tpud-op" in thread_names()
    dist.destroy_process_group()
    return out


def test_a_comm_hook_whose_future_raises_fails_backward_like_gloo() -> None:
    for out in run_ranks(_raising_hook_rank, 2, timeout_s=60):
        assert out == {"gloo": True, "gloo next op": True, "tpu_dist": True,
                       "tpu_dist next op": True, "op thread alive": True}, out
