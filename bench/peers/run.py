#!/usr/bin/env python3
"""bench/peers/run.py: tpu_dist against the strongest CPU peers, one run, one method.

    tools/bench.sh peers [flags]      (= bench/peers/run.py [flags])
        [--worlds 2 4 16] [--ops all_reduce,reduce_scatter,...]
        [--sizes 8,4K,64K,1M,16M] [--libs tpu_dist_cpp,openmpi,...]
        [--max-iters 200] [--repeats N] [--quick] [--skip-install] [--out FILE]
        [--build DIR]

Installs the peers (bench/peers/install.sh: Open MPI and MPICH from Debian, Intel
MPI and DeepSpeed from PyPI into a scratch venv, all pinned; our MPI benchmark
bench/peers/mpi_peers.c built against each MPI), then times every (op, size)
for each world on each library, world by world, one library after the other:

  tpu_dist_cpp    build/bench/collectives_bench --stat=median (C++ process group)
  tpu_dist_torch  tpu_dist through torch.distributed (bench/peers/torch_peers.py)
  gloo_torch      Gloo through torch.distributed (the same script)
  openmpi, mpich, impi   mpi_peers.c on Open MPI, MPICH, Intel MPI
  deepspeed_shm   deepspeed.comm.inference_all_reduce (its shm op), all_reduce only
  torch_floor     torch.distributed over torch's own no-op backend ("fake",
                  FakeProcessGroup): what torch's Python and dispatcher cost per
                  op with a backend that does nothing; a floor, not a peer
  memcpy          one thread, one process, memcpy of the same bytes

Before every library run, the host's core-to-core round trip (one cache line
bounced between two threads pinned to two CPUs, `mpi_peers_memcpy --pingpong`)
is timed and kept with that run (`core_rtt_us`): every shared-memory
synchronisation pays it, and on a virtual machine it moves with the host. The
report adds C++ / best MPI per row within each host state (runs after a round
trip under twice the run's shortest, and the others).

The method, the same in all: one process per rank, one intra-op thread each, fp32
SUM; per case barrier, one warm-up op, barrier, N ops each timed on its own,
rank 0's median; N = clamp(512 MiB / size, 5, --max-iters). --repeats R: the
whole sweep R times, round-robin over worlds and libraries, each cell the
median of its R medians (all R kept in the JSON as <lib>_us_repeats). Sizes as in
bench/README.md (split ops round to world x 4 B).

Prints the CPU model, the load average, a table with every library's time per
row and tpu_dist / best peer (C++ against every peer; torch.distributed against
the Python peers, Gloo and DeepSpeed); writes FILE (default
bench/results/peers-latest.json), the same table as markdown beside it (.md) and
a PNG plot (.png; tools/plot_bench, one line per library). A library that is not
installed or fails is reported and left out; the others still run. --quick:
worlds 2 and 4, all_reduce / reduce_scatter / all_gather, every size,
--max-iters 50.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# (key, label, kind) in run order; kind: "ours" or "peer" (python: a peer
# called from Python) or "ref".
LIBS = [
    ("tpu_dist_cpp", "tpu_dist C++", "ours"),
    ("tpu_dist_torch", "tpu_dist torch.dist", "ours"),
    ("gloo_torch", "Gloo torch.dist", "python"),
    ("openmpi", "Open MPI", "peer"),
    ("mpich", "MPICH", "peer"),
    ("impi", "Intel MPI", "peer"),
    ("deepspeed_shm", "DeepSpeed shm", "python"),
    ("torch_floor", "torch.dist no-op floor", "ref"),
    ("memcpy", "memcpy 1 thread", "ref"),
]
LABEL = {k: label for k, label, _ in LIBS}
PEERS = [k for k, _, kind in LIBS if kind in ("peer", "python")]
PY_PEERS = [k for k, _, kind in LIBS if kind == "python"]
OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"]
SIZES = "8,4K,64K,1M,16M"


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def size_name(b: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def case_bytes(op: str, size: int, world: int) -> int:
    """The bytes of one case, as every timer computes them (bench/README.md)."""
    if op in ("all_reduce", "broadcast"):
        return max(4, size // 4 * 4)
    unit = world * 4
    return max(unit, size // unit * unit)


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


# ---------------------------------------------------------------- the table


def merge(records: list[dict]) -> list[dict]:
    """Rows keyed by (op, world, bytes), one `<lib>_us` per library; memcpy
    (world-free) joins every row of its bytes."""
    memcpy = {r["bytes"]: r["time_us"] for r in records if r.get("lib") == "memcpy"}
    rows: dict[tuple, dict] = {}
    times: dict[tuple, list[float]] = {}
    for r in records:
        if r.get("lib") == "memcpy" or "op" not in r:
            continue
        key = (r["op"], r["world"], r["bytes"])
        rows.setdefault(key, {"op": r["op"], "dtype": "fp32", "world": r["world"],
                              "bytes": r["bytes"]})
        times.setdefault(key + (r["lib"],), []).append(r["time_us"])
    # --repeats: a library's cell is the median of its repeats' medians, and
    # every repeat is kept beside it (`<lib>_us_repeats`).
    for (op, world, nbytes, lib), ts in times.items():
        row = rows[(op, world, nbytes)]
        row[f"{lib}_us"] = round(statistics.median(ts), 4)
        if len(ts) > 1:
            row[f"{lib}_us_repeats"] = ts
    order = {op: i for i, op in enumerate(OPS)}
    out = sorted(rows.values(), key=lambda r: (order.get(r["op"], 99), r["world"], r["bytes"]))
    for row in out:
        if row["bytes"] in memcpy:
            row["memcpy_us"] = memcpy[row["bytes"]]
        best = min(((row[f"{p}_us"], p) for p in PEERS if row.get(f"{p}_us")), default=None)
        best_py = min(((row[f"{p}_us"], p) for p in PY_PEERS if row.get(f"{p}_us")),
                      default=None)
        row["best_peer"] = best[1] if best else None
        row["best_python_peer"] = best_py[1] if best_py else None
        cpp, py = row.get("tpu_dist_cpp_us"), row.get("tpu_dist_torch_us")
        row["cpp_over_best_peer"] = round(cpp / best[0], 3) if cpp and best else None
        row["torch_over_best_python_peer"] = (round(py / best_py[0], 3) if py and best_py
                                              else None)
    return out


def case_order(case: tuple) -> tuple:
    """Sort key of an (op, world, bytes) case: OPS order, then world, then size."""
    return (OPS.index(case[0]) if case[0] in OPS else 99, case[1], case[2])


def by_host_state(records: list[dict]) -> list[dict]:
    """C++ / best MPI per row, separately for the runs timed after a short core
    round trip ("near": under twice the run's shortest) and after a long one
    ("far"): the host moves two vCPUs between cache-sharing cores and not, and
    every library moves with it. Rows where C++ and a peer ran in the state."""
    rtts = [r["core_rtt_us"] for r in records if r.get("core_rtt_us")]
    if not rtts:
        return []
    cut = 2 * min(rtts)
    cells: dict[tuple, list[float]] = {}
    for r in records:
        if r.get("core_rtt_us") is None or "op" not in r or r.get("lib") == "memcpy":
            continue
        state = "near" if r["core_rtt_us"] < cut else "far"
        cells.setdefault((r["op"], r["world"], r["bytes"], state, r["lib"]), []).append(
            r["time_us"])
    mpis = [k for k, _, kind in LIBS if kind == "peer"]
    out = []
    for op, world, nbytes in sorted({k[:3] for k in cells}, key=case_order):
        row = {"op": op, "world": world, "bytes": nbytes}
        for state in ("near", "far"):
            cpp = cells.get((op, world, nbytes, state, "tpu_dist_cpp"))
            peers = [(statistics.median(v), lib) for lib in mpis
                     if (v := cells.get((op, world, nbytes, state, lib)))]
            if cpp and peers:
                best = min(peers)
                row[f"{state}_ratio"] = round(statistics.median(cpp) / best[0], 3)
                row[f"{state}_runs"] = len(cpp)
        if any(k.endswith("_ratio") for k in row):
            out.append(row)
    return out


def torch_vs_deepspeed(records: list[dict]) -> list[dict]:
    """torch.distributed against DeepSpeed's shm all-reduce, each library at its
    fastest run (the host swings every Python loop about 2x between runs, the
    no-op backend's included), with the bound that a backend as fast as our
    C++ path meets through torch.distributed: torch's no-op floor plus our
    C++ op. bound_ratio > 1: even that loses to DeepSpeed (which calls its op
    through torch.ops, not dist.all_reduce); <= 1: the rest of the gap is
    ours. Rows where all four were timed."""
    best: dict[tuple, float] = {}
    for r in records:
        if "op" not in r or not r.get("time_us"):
            continue
        key = (r["op"], r["world"], r["bytes"], r["lib"])
        best[key] = min(best.get(key, float("inf")), r["time_us"])
    out = []
    for op, world, nbytes in sorted({k[:3] for k in best}, key=case_order):
        got = {lib: best.get((op, world, nbytes, lib))
               for lib in ("tpu_dist_torch", "torch_floor", "tpu_dist_cpp", "deepspeed_shm")}
        if any(v is None for v in got.values()):
            continue
        ds = got["deepspeed_shm"]
        out.append({"op": op, "world": world, "bytes": nbytes,
                    **{f"{lib}_best_us": v for lib, v in got.items()},
                    "ratio": round(got["tpu_dist_torch"] / ds, 3),
                    "bound_ratio": round((got["torch_floor"] + got["tpu_dist_cpp"]) / ds, 3)})
    return out


def fmt_us(v) -> str:
    if v is None:
        return "-"
    if v >= 10000:
        return f"{v / 1000:.1f}k"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def table(rows: list[dict], libs: list[str]) -> str:
    libs = [k for k, _, _ in LIBS if k in libs and any(r.get(f"{k}_us") for r in rows)]
    head = (["op", "world", "size"] + [f"{LABEL[k]} us" for k in libs] +
            ["best peer", "C++ / best peer", "torch.dist / best Python peer"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratio = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        cells = ([r["op"], str(r["world"]), size_name(r["bytes"])] +
                 [fmt_us(r.get(f"{k}_us")) for k in libs] +
                 [LABEL.get(r["best_peer"], "-"), ratio(r["cpp_over_best_peer"]),
                  ratio(r["torch_over_best_python_peer"])])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(doc: dict) -> str:
    """The markdown of a run: header, the table, each library run's time."""
    libs = doc["libs"]
    out = [f"Run {doc['date']}, commit {doc.get('commit', '?')}, {doc['machine']}, "
           f"{doc['cpus']} CPUs; load average {doc['load_start']} at start, "
           f"{doc['load_end']} at end; {doc['seconds']:.0f} s in all"
           f"{' (--quick)' if doc.get('quick') else ''}"
           f"{f'; each cell the median of {r} runs' if (r := doc.get('repeats', 1)) > 1 else ''}"
           f"{' (PARTIAL: the run was stopped)' if doc.get('partial') else ''}.",
           "",
           "Times in us, rank 0's median per op (fp32 SUM, one process per rank, one "
           "thread each). Ratios: tpu_dist's time over the best peer's (above 1: slower); "
           "C++ against every peer, torch.distributed against Gloo and DeepSpeed from Python.",
           "",
           table(doc["rows"], libs),
           "",
           "| library | version | world | wall s | load before -> after | core round trip us "
           "| status |",
           "|---|---|---|---|---|---|---|"]
    for run in doc["runs"]:
        rtt = run.get("core_rtt_us")
        out.append(f"| {LABEL.get(run['lib'], run['lib'])} | {run.get('version') or '-'} | "
                   f"{run.get('world', '-')} | {run['seconds']:.1f} | {run['load_before']} -> "
                   f"{run['load_after']} | {'-' if rtt is None else f'{rtt:.3f}'} | "
                   f"{run['status']} |")
    rtts = sorted(r["core_rtt_us"] for r in doc["runs"] if r.get("core_rtt_us"))
    if rtts:
        out += ["", f"Core-to-core round trip (one cache line, two pinned threads) before "
                f"each library run: {rtts[0]:.3f} - {statistics.median(rtts):.3f} - "
                f"{rtts[-1]:.3f} us (min - median - max over {len(rtts)} runs)."]
    states = doc.get("by_host_state") or []
    if states:
        ratio = lambda r, s: (f"{r[s + '_ratio']:.2f} ({r[s + '_runs']})"  # noqa: E731
                              if s + "_ratio" in r else "-")
        out += ["", "C++ / best MPI by host state: runs after a core round trip under twice "
                "the shortest (near) and the others (far); in brackets the C++ runs.", "",
                "| op | world | size | near | far |", "|---|---|---|---|---|"]
        out += [f"| {r['op']} | {r['world']} | {size_name(r['bytes'])} | {ratio(r, 'near')} | "
                f"{ratio(r, 'far')} |" for r in states]
    vs_ds = doc.get("torch_vs_deepspeed") or []
    if vs_ds:
        out += ["", "torch.distributed vs DeepSpeed's shm all-reduce, each library's fastest "
                "run; bound: torch's no-op floor + our C++ op, what a backend as fast as our "
                "C++ path reaches through dist.all_reduce (above 1: not reachable).", "",
                "| op | world | size | tpu_dist torch.dist us | no-op floor us | tpu_dist C++ us "
                "| DeepSpeed shm us | torch.dist / DeepSpeed | bound / DeepSpeed |",
                "|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['op']} | {r['world']} | {size_name(r['bytes'])} | "
                f"{fmt_us(r['tpu_dist_torch_best_us'])} | {fmt_us(r['torch_floor_best_us'])} | "
                f"{fmt_us(r['tpu_dist_cpp_best_us'])} | {fmt_us(r['deepspeed_shm_best_us'])} | "
                f"{r['ratio']:.2f} | {r['bound_ratio']:.2f} |" for r in vs_ds]
    return "\n".join(out) + "\n"


def write_outputs(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(doc))
    plot = subprocess.run([sys.executable, str(REPO / "tools" / "plot_bench"), str(out), "-o",
                           str(out.with_suffix(".png")),
                           "--ops", ",".join(sorted({r["op"] for r in doc["rows"]},
                                                    key=OPS.index))],
                          capture_output=True, text=True) if doc["results"] else None
    if plot is not None and plot.returncode != 0:
        print(f"run.py: no plot: {plot.stderr.strip()}", file=sys.stderr)


def document(records: list[dict], runs: list[dict], libs: list[str], meta: dict) -> dict:
    """The JSON document (tools/plot_bench reads "results" and "series")."""
    rows = merge(records)
    worlds = sorted({r["world"] for r in rows})
    present = [k for k, _, _ in LIBS if k in libs and any(r.get(f"{k}_us") for r in rows)]
    return {**meta, "bench": "peers", "libs": libs,
            "series": [{"label": LABEL[k], "key": f"{k}_us"} for k in present],
            "runs": runs, "rows": rows, "by_host_state": by_host_state(records),
            "torch_vs_deepspeed": torch_vs_deepspeed(records),
            # tools/plot_bench's shape: one "collectives" part per world.
            "results": ([{"bench": "collectives", "world": w, "hosts": 1,
                          "rows": [r for r in rows if r["world"] == w]} for w in worlds]
                        if rows else []),
            }


# ---------------------------------------------------------------- running


def run_cmd(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out, f"over {timeout:.0f}s"
    except OSError as e:
        return 127, "", str(e)


def lib_command(lib: str, world: int, ops: str, sizes: str, args) -> tuple[list, dict] | str:
    """The command that times `lib` at `world`, or why it cannot run."""
    peers = Path(args.peers_dir)
    mi = str(args.max_iters)
    if lib == "tpu_dist_cpp":
        exe = Path(args.build) / "bench" / "collectives_bench"
        if not exe.exists():
            return f"{exe} not built (tools/build.sh collectives_bench)"
        return ([str(exe), f"--world={world}", f"--ops={ops}", "--dtypes=fp32",
                 f"--sizes={sizes}", f"--max_iters={mi}", "--stat=median", "--gloo=0",
                 "--floor_rounds=0", "--json_out=@JSON@"], {})
    if lib in ("tpu_dist_torch", "gloo_torch", "deepspeed_shm", "torch_floor"):
        py = (peers / "venv" / "bin" / "python" if lib == "deepspeed_shm"
              else REPO / ".venv" / "bin" / "python")
        if not py.exists():
            return f"{py} missing (bench/peers/install.sh)"
        if lib == "deepspeed_shm":
            if "all_reduce" not in ops.split(","):
                return "all_reduce only"
            ops = "all_reduce"
        name = {"tpu_dist_torch": "tpu_dist", "gloo_torch": "gloo", "deepspeed_shm": "deepspeed",
                "torch_floor": "fake"}
        return ([str(py), str(HERE / "torch_peers.py"), "--lib", name[lib], "--world",
                 str(world), "--ops", ops, "--sizes", sizes, "--max-iters", mi,
                 "--timeout", str(args.timeout)],
                {"TORCH_EXTENSIONS_DIR": str(peers / "torch_extensions")})
    exe = peers / "bin" / f"mpi_peers_{lib}"
    if not exe.exists():
        return f"{exe} not built (bench/peers/install.sh)"
    tail = [str(exe), "--ops", ops, "--sizes", sizes, "--max_iters", mi, "--lib", lib]
    if lib == "openmpi":
        return (["mpirun.openmpi", "-np", str(world), "--oversubscribe", "--bind-to", "none"] +
                tail, {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                       "OMPI_MCA_btl": "self,vader"})
    if lib == "mpich":
        return (["mpirun.mpich", "-np", str(world)] + tail, {})
    if lib == "impi":
        return ([str(peers / "venv" / "bin" / "mpiexec"), "-n", str(world)] + tail,
                {"I_MPI_FABRICS": "shm", "I_MPI_PIN": "0"})
    return f"unknown library {lib}"


def shm_segments() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def remove_shm(names: set[str], prefix: str) -> int:
    """Unlinks the /dev/shm entries among `names` that start with `prefix`."""
    removed = 0
    for name in sorted(names):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join("/dev/shm", name))
                removed += 1
            except OSError:
                pass
    return removed


def core_rtt_us(args) -> float | None:
    """The core-to-core round trip now (us), or None where it cannot run."""
    exe = Path(args.peers_dir) / "bin" / "mpi_peers_memcpy"
    rc, out, _ = run_cmd([str(exe), "--pingpong", "20000"], 60)
    times = [r["time_us"] for r in json_lines(out) if r.get("op") == "round_trip"]
    return times[0] if rc == 0 and times else None


def time_lib(lib: str, world: int, ops: str, sizes: str, args, tmp: Path):
    """Runs one library at one world: (records, run summary)."""
    rtt = core_rtt_us(args)
    lb, t0 = load(), time.monotonic()
    cmd = lib_command(lib, world, ops, sizes, args)
    run = {"lib": lib, "world": world, "load_before": lb, "core_rtt_us": rtt}
    records: list[dict] = []
    if isinstance(cmd, str):
        run.update(seconds=0.0, load_after=lb, status=f"skipped: {cmd}")
        return records, run
    argv, env = cmd
    env = {"OMP_NUM_THREADS": "1", **env}
    json_out = tmp / f"{lib}_w{world}.json"
    argv = [a.replace("@JSON@", str(json_out)) for a in argv]
    shm_before = shm_segments()
    rc, out, err = run_cmd(argv, args.timeout, env)
    if lib == "deepspeed_shm":
        # DeepSpeed's shm op never unlinks its buffers: remove the ones this run made.
        run["shm_removed"] = remove_shm(shm_segments() - shm_before, "deepspeed_allreduce_buffer_")
    if lib == "tpu_dist_cpp" and json_out.exists():
        doc = json.loads(json_out.read_text())
        run["version"] = f"commit {args.commit}"
        if doc.get("stat") != "median":  # a binary older than --stat: another method
            rc, err = 1, "collectives_bench has no --stat=median (rebuild it)"
        else:
            records = [{"lib": lib, "op": r["op"], "world": world, "bytes": r["bytes"],
                        "time_us": r["time_us"]} for r in doc.get("rows", [])]
    else:
        for rec in json_lines(out):
            if "library_version" in rec:
                run["version"] = rec["library_version"]
            elif "time_us" in rec:
                records.append(rec)
    status = "ok" if rc == 0 else f"exit {rc}: {(err.strip().splitlines() or ['?'])[-1][:160]}"
    run.update(seconds=round(time.monotonic() - t0, 1), load_after=load(), status=status,
               cases=len(records))
    return records, run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 16])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default=SIZES, help="bytes, or with K/M suffixes (KiB, MiB)")
    p.add_argument("--libs", default=",".join(k for k, _, _ in LIBS))
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=1,
                   help="run every (world, library) N times, round-robin; a cell is the "
                        "median of the N medians (this box swings 2x between runs)")
    p.add_argument("--quick", action="store_true",
                   help="worlds 2 4, all_reduce,reduce_scatter,all_gather, --max-iters 50")
    p.add_argument("--skip-install", action="store_true", help="do not run install.sh first")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per library and world")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "peers-latest.json"))
    p.add_argument("--build", default=str(REPO / "build"))
    p.add_argument("--peers-dir", default=os.environ.get(
        "PEERS_DIR", str(Path.home() / ".cache" / "tpu_dist" / "peers")))
    p.add_argument("--from-json", help=argparse.SUPPRESS)  # re-render a document (tests)
    args = p.parse_args()
    if args.from_json:  # the table, markdown and plot of a written document
        doc = json.loads(Path(args.from_json).read_text())
        doc = {**doc, **document(doc["records"], doc["runs"], doc["libs"], {})}
        print(table(doc["rows"], doc["libs"]))
        write_outputs(doc, Path(args.out))
        return 0
    if args.quick:
        if args.worlds == [2, 4, 16]:
            args.worlds = [2, 4]
        if args.ops == ",".join(OPS):
            args.ops = "all_reduce,reduce_scatter,all_gather"
        if args.max_iters == 200:
            args.max_iters = 50
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    unknown = [lib for lib in libs if lib not in LABEL]
    ops = [o for o in args.ops.split(",") if o]
    if unknown or any(o not in OPS for o in ops):
        print(f"run.py: unknown libraries {unknown} or ops {ops} (libraries: "
              f"{', '.join(LABEL)}; ops: {', '.join(OPS)})", file=sys.stderr)
        return 2
    sizes = ",".join(str(parse_size(s)) for s in args.sizes.split(",") if s)
    args.commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip() or "unknown"
    t_start = time.monotonic()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": args.commit, "machine": cpu_model(), "cpus": os.cpu_count(),
            "load_start": load(), "quick": args.quick, "max_iters": args.max_iters,
            "repeats": args.repeats,
            "method": "rank 0's median of per-op times after barrier, warm-up, barrier; "
                      "fp32 SUM; one process per rank, one intra-op thread each"}
    print(f"{meta['machine']}, {meta['cpus']} CPUs, load average {meta['load_start']}")
    if not args.skip_install:
        rc = subprocess.run([str(HERE / "install.sh")],
                            env={**os.environ, "PEERS_DIR": args.peers_dir}).returncode
        if rc != 0:
            print("run.py: install.sh built no MPI; going on with what is there",
                  file=sys.stderr)
    tmp = Path(args.peers_dir) / "run"
    tmp.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    runs: list[dict] = []
    for rep, world, lib in ((rep, w, lib) for rep in range(args.repeats)
                            for w in args.worlds for lib in libs):
        if lib == "memcpy":
            continue
        recs, run = time_lib(lib, world, ",".join(ops), sizes, args, tmp)
        run["repeat"] = rep
        for rec in recs:  # the host state each number was measured in
            rec["core_rtt_us"] = run.get("core_rtt_us")
        records += recs
        runs.append(run)
        print(f"  world {world:2d} {LABEL[lib]:20s} {run['seconds']:7.1f} s  load "
              f"{run['load_before']} -> {run['load_after']}  {run['status']}", flush=True)
        # What is measured so far, in case the run is stopped (marked partial).
        partial = document(records, runs, libs, {**meta, "partial": True, "load_end": load(),
                                                 "seconds": time.monotonic() - t_start})
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({**partial, "records": records}, indent=1))
    if "memcpy" in libs:  # every byte count any case used
        all_bytes = sorted({r["bytes"] for r in records} or
                           {case_bytes(o, int(s), w) for o in ops for s in sizes.split(",")
                            for w in args.worlds})
        lb, t0 = load(), time.monotonic()
        exe = Path(args.peers_dir) / "bin" / "mpi_peers_memcpy"
        rc, out, err = run_cmd([str(exe), "--sizes", ",".join(map(str, all_bytes)),
                                "--max_iters", str(args.max_iters)], args.timeout)
        records += json_lines(out)
        runs.append({"lib": "memcpy", "world": 1, "load_before": lb, "load_after": load(),
                     "seconds": round(time.monotonic() - t0, 1),
                     "status": "ok" if rc == 0 else f"exit {rc}: {err.strip()[-160:]}"})
    meta.update(load_end=load(), seconds=round(time.monotonic() - t_start, 1))
    doc = document(records, runs, libs, meta)
    doc["records"] = records
    print()
    print(report(doc))
    write_outputs(doc, Path(args.out))
    print(f"JSON: {args.out}; markdown: {Path(args.out).with_suffix('.md')}; "
          f"plot: {Path(args.out).with_suffix('.png')}")
    return 0 if any(r.get("time_us") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
