#!/usr/bin/env python3
"""Issue #16 goal 6: training throughput of our C++ FullyShard vs torch's Python FSDP2, side by side.

    .venv/bin/python bench/python/train_vs_torch.py [--worlds 2 4 16] [--repeats 1] [--quick]
        [--global-batch 16] [--seq 128] [--warmup 2] [--steps 5] [--plan layers|mlp]
        [--freeze-ple] [--binary build/bench/train_vs_torch] [--json-out FILE]

The same tiny Gemma (data/tiny_gemma's config.json and model.safetensors), the same global batch and
sequence length (per-rank batch = global / world), the same ids (torch.randint / at::randint from one
seed), fp32, the same AdamW hyper-parameters, one process per rank and one intra-op thread each:

  ours   bench/train_vs_torch (C++): LoadGemmaFromHf, FullyShard over the tpu_dist backend, AdamW;
         the binary forks its ranks.
  torch  train_vs_torch_fsdp2.py: transformers' Gemma4ForCausalLM, torch.distributed.fsdp.fully_shard
         over Gloo, torch.optim.AdamW; ranks forked from this driver (torch.multiprocessing, "fork",
         after the model is built once here).

Step = zero_grad + forward + shifted causal-LM cross-entropy + backward + optimizer step; --warmup
untimed steps (step 0 among them), then --steps timed ones; rank 0 reports the mean and min. Per
world, --repeats times, the two sides run one after the other (alternating which goes first); a row
shows the load average before and after, the tokens/s ratio (mean step times) and the ratio of the
min step times, and the ratio of CPU time per step (process CPU time of the timed steps, every
thread, summed over the ranks: what a step costs the machine; the least sensitive to the other
load on a shared box). Prints a markdown table; --json-out writes every row. Exits 1 (loudly) when a side fails, when
the step-0 losses (mean over ranks; same weights, same data) differ by more than --loss-tol relative,
or when a side's loss after the last step is not below its step-0 loss. --quick: world 2, global
batch 4 x seq 32, 1 warm-up + 2 timed steps (the ctest smoke; it must run, not meet a number).
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import train_vs_torch_fsdp2 as fsdp2  # noqa: E402


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_ours(args: argparse.Namespace, cfg: dict[str, Any], world: int, tmp: Path) -> dict[str, Any]:
    out = tmp / f"ours_w{world}.json"
    cmd = [str(args.binary), f"--model_dir={args.model_dir}", f"--world={world}",
           f"--global_batch={cfg['global_batch']}", f"--seq={cfg['seq']}", f"--warmup={cfg['warmup']}",
           f"--steps={cfg['steps']}", f"--lr={cfg['lr']!r}", f"--beta1={cfg['beta1']!r}",
           f"--beta2={cfg['beta2']!r}", f"--eps={cfg['eps']!r}",
           f"--weight_decay={cfg['weight_decay']!r}", f"--seed={cfg['seed']}", f"--plan={cfg['plan']}",
           f"--freeze_ple={int(cfg['freeze_ple'])}", f"--backend={args.ours_backend}",
           f"--timeout_s={cfg['timeout_s']}", f"--json_out={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # The binary kills its own ranks after --timeout_s; this bound is the last resort.
    proc = subprocess.run(cmd, env=env, timeout=3 * cfg["timeout_s"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"train_vs_torch: ours, world {world}, exit {proc.returncode}:\n"
                         f"{' '.join(cmd)}\n{proc.stdout}")
    return json.loads(out.read_text())


def run_torch(cfg: dict[str, Any], model: torch.nn.Module, world: int, tmp: Path) -> dict[str, Any]:
    out = tmp / f"torch_w{world}.json"
    init_file = tmp / f"gloo_init_w{world}_{time.monotonic_ns()}"
    ctx = mp.start_processes(fsdp2.rank_main, args=(world, str(init_file), cfg, model, str(out)),
                             nprocs=world, join=False, start_method=cfg["start_method"])
    deadline = time.monotonic() + 3 * cfg["timeout_s"]
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise SystemExit(f"train_vs_torch: torch, world {world}: no result after "
                                 f"{3 * cfg['timeout_s']} s")
    finally:
        for p in ctx.processes:  # only our own children, by pid
            if p.is_alive():
                p.kill()
                p.join(10)
    if not out.exists():
        raise SystemExit(f"train_vs_torch: torch, world {world}: rank 0 wrote no result")
    return json.loads(out.read_text())


def check(row: dict[str, Any], tol: float) -> list[str]:
    errs = []
    o, t = row["ours"], row["torch"]
    scale = max(1.0, abs(t["loss0"]))
    if not abs(o["loss0"] - t["loss0"]) <= tol * scale:
        errs.append(f"world {row['world']}: step-0 loss ours {o['loss0']:.6f} vs torch {t['loss0']:.6f} "
                    f"(tolerance {tol} relative)")
    for side in (o, t):
        if not side["loss_last"] < side["loss0"]:
            errs.append(f"world {row['world']}: {side['side']}'s loss did not decrease: step 0 "
                        f"{side['loss0']:.6f}, after {side['warmup'] + side['steps']} steps "
                        f"{side['loss_last']:.6f}")
    return errs


def table(rows: list[dict[str, Any]], cfg: dict[str, Any], backend: str) -> str:
    lines = [f"tiny Gemma (data/tiny_gemma), fp32, global batch {cfg['global_batch']} x seq {cfg['seq']}, "
             f"plan {cfg['plan']}{', PLE frozen' if cfg['freeze_ple'] else ''}, "
             f"{cfg['warmup']} warm-up + {cfg['steps']} timed steps; ours = C++ FullyShard over "
             f"{backend}, torch = Python FSDP2 over Gloo",
             "",
             "| world | ours tokens/s | torch tokens/s | ours/torch | ours/torch (min step) "
             "| torch/ours CPU per step | ours step ms mean (min) | torch step ms mean (min) "
             "| CPU ms/step ours / torch | loss0 ours / torch | loss last ours / torch "
             "| load before | load after |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|"]
    for r in rows:
        o, t = r["ours"], r["torch"]
        lines.append(f"| {r['world']} | {o['tokens_per_s']:.0f} | {t['tokens_per_s']:.0f} | "
                     f"{r['ratio']:.2f}x | {r['ratio_min']:.2f}x | {r['ratio_cpu']:.2f}x | "
                     f"{o['step_ms_mean']:.1f} ({o['step_ms_min']:.1f}) | "
                     f"{t['step_ms_mean']:.1f} ({t['step_ms_min']:.1f}) | "
                     f"{o['cpu_ms_per_step']:.0f} / {t['cpu_ms_per_step']:.0f} | {o['loss0']:.5f} / "
                     f"{t['loss0']:.5f} | {o['loss_last']:.5f} / {t['loss_last']:.5f} | "
                     f"{r['load_before']} | {r['load_after']} |")
    worlds = sorted({r["world"] for r in rows})
    if any(sum(r["world"] == w for r in rows) > 1 for w in worlds):
        lines.append("")
        for w in worlds:
            rs = sorted(r["ratio"] for r in rows if r["world"] == w)
            ms = sorted(r["ratio_min"] for r in rows if r["world"] == w)
            cs = sorted(r["ratio_cpu"] for r in rows if r["world"] == w)
            lines.append(f"world {w}: ours/torch tokens/s {rs[0]:.2f}x .. {rs[-1]:.2f}x "
                         f"(median {statistics.median(rs):.2f}x), by min step {ms[0]:.2f}x .. {ms[-1]:.2f}x"
                         f", CPU per step {cs[0]:.2f}x .. {cs[-1]:.2f}x over {len(rs)} repeats")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 16])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--plan", choices=["layers", "mlp"], default="layers")
    ap.add_argument("--freeze-ple", action="store_true")
    ap.add_argument("--loss-tol", type=float, default=1e-5,
                    help="step-0 loss agreement, relative to max(1, |loss|)")
    ap.add_argument("--ours-backend", choices=["tpu_dist", "gloo"], default="tpu_dist")
    ap.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per side and world")
    ap.add_argument("--binary", type=Path, default=REPO / "build" / "bench" / "train_vs_torch")
    ap.add_argument("--model-dir", type=Path, default=REPO / "data" / "tiny_gemma")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.worlds, args.global_batch, args.seq, args.warmup, args.steps = [2], 4, 32, 1, 2
    if not args.binary.exists():
        raise SystemExit(f"train_vs_torch: no binary {args.binary} (build the train_vs_torch target)")
    for w in args.worlds:
        if args.global_batch % w:
            raise SystemExit(f"train_vs_torch: --global-batch {args.global_batch} not divisible by world {w}")
    cfg = dict(global_batch=args.global_batch, seq=args.seq, warmup=args.warmup, steps=args.steps,
               lr=args.lr, beta1=args.beta1, beta2=args.beta2, eps=args.eps,
               weight_decay=args.weight_decay, seed=args.seed, plan=args.plan,
               freeze_ple=args.freeze_ple, timeout_s=args.timeout, start_method=args.start_method)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # before any op: the torch ranks are forked from here
    model = fsdp2.load_hf_gemma(args.model_dir)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tpud_train_vs_torch_") as tmp_s:
        tmp = Path(tmp_s)
        for world in args.worlds:
            for rep in range(args.repeats):
                before = load()
                if rep % 2 == 0:  # alternate which side goes first
                    ours = run_ours(args, cfg, world, tmp)
                    theirs = run_torch(cfg, model, world, tmp)
                else:
                    theirs = run_torch(cfg, model, world, tmp)
                    ours = run_ours(args, cfg, world, tmp)
                row = dict(world=world, repeat=rep, ours=ours, torch=theirs, load_before=before,
                           load_after=load(), ratio=ours["tokens_per_s"] / theirs["tokens_per_s"],
                           ratio_min=theirs["step_ms_min"] / ours["step_ms_min"],
                           ratio_cpu=theirs["cpu_ms_per_step"] / ours["cpu_ms_per_step"])
                rows.append(row)
                print(f"world {world} (repeat {rep}): ours {ours['tokens_per_s']:.0f} tokens/s, torch "
                      f"{theirs['tokens_per_s']:.0f} tokens/s, ratio {row['ratio']:.2f}x, "
                      f"load {before} -> {row['load_after']}", flush=True)
    print()
    print(table(rows, cfg, args.ours_backend))
    print(f"\ntorch side: transformers {rows[0]['torch']['transformers']} "
          f"{rows[0]['torch']['model_class']}, torch {rows[0]['torch']['torch']}")
    errs = [e for r in rows for e in check(r, args.loss_tol)]
    if args.json_out:
        args.json_out.write_text(json.dumps(dict(bench="train_vs_torch", config=cfg, rows=rows,
                                                 errors=errs), indent=1) + "\n")
    for e in errs:
        print(f"train_vs_torch: FAILED: {e}", file=sys.stderr)
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
