"""bench/peers (tools/bench.sh peers): the parts that need only the project's deps.

The peers themselves (Open MPI, MPICH, Intel MPI, DeepSpeed) are never installed
here. What is checked: run.py's table, ratios, JSON, markdown and plot on a fake
result set (the ratio is tpu_dist over the fastest peer of the row; memcpy joins
rows by bytes; a library without a number shows "-"), and torch_peers.py, the
torch.distributed timer, on 2 ranks of Gloo and of tpu_dist at 8 B: one result
line per op with the bytes every timer uses.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_PY = REPO / "bench" / "peers" / "run.py"
TORCH_PEERS = REPO / "bench" / "peers" / "torch_peers.py"


def _load_run():
    spec = importlib.util.spec_from_file_location("peers_run", RUN_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(lib: str, op: str, world: int, nbytes: int, t: float) -> dict:
    return {"lib": lib, "op": op, "world": world, "bytes": nbytes, "time_us": t}


FAKE = [
    _rec("tpu_dist_cpp", "all_reduce", 2, 8, 1.2),
    _rec("tpu_dist_torch", "all_reduce", 2, 8, 40.0),
    _rec("gloo_torch", "all_reduce", 2, 8, 200.0),
    _rec("openmpi", "all_reduce", 2, 8, 0.4),
    _rec("impi", "all_reduce", 2, 8, 0.3),
    _rec("deepspeed_shm", "all_reduce", 2, 8, 5.0),
    _rec("tpu_dist_cpp", "all_gather", 4, 16, 3.0),
    _rec("mpich", "all_gather", 4, 16, 6.0),
    {"lib": "memcpy", "op": "memcpy", "world": 1, "bytes": 8, "time_us": 0.02},
]


def test_rows_ratios_and_memcpy() -> None:
    run = _load_run()
    rows = run.merge(FAKE)
    assert [(r["op"], r["world"], r["bytes"]) for r in rows] == [
        ("all_reduce", 2, 8), ("all_gather", 4, 16)]
    ar, ag = rows
    assert ar["best_peer"] == "impi"
    assert ar["cpp_over_best_peer"] == 4.0  # 1.2 / 0.3
    assert ar["best_python_peer"] == "deepspeed_shm"
    assert ar["torch_over_best_python_peer"] == 8.0  # 40 / 5
    assert ar["memcpy_us"] == 0.02
    assert ag["cpp_over_best_peer"] == 0.5 and ag["torch_over_best_python_peer"] is None
    assert "memcpy_us" not in ag
    text = run.table(rows, [k for k, _, _ in run.LIBS])
    lines = text.splitlines()
    assert "C++ / best peer" in lines[0] and "torch.dist / best Python peer" in lines[0]
    assert lines[2].startswith("| all_reduce | 2 | 8 B |") and "| Intel MPI | 4.00 | 8.00 |" in lines[2]
    assert lines[3].startswith("| all_gather | 4 | 16 B |") and lines[3].endswith("| MPICH | 0.50 | - |")
    assert [run.case_bytes("reduce_scatter", 8, 16), run.case_bytes("all_reduce", 8, 16),
            run.parse_size("64K"), run.parse_size("16MiB")] == [64, 8, 65536, 16 << 20]


def test_repeats_give_the_median_of_their_medians() -> None:
    run = _load_run()
    recs = FAKE + [_rec("tpu_dist_cpp", "all_reduce", 2, 8, 9.0),
                   _rec("tpu_dist_cpp", "all_reduce", 2, 8, 1.0),
                   _rec("impi", "all_reduce", 2, 8, 0.5)]
    ar = run.merge(recs)[0]
    assert ar["tpu_dist_cpp_us"] == 1.2 and ar["tpu_dist_cpp_us_repeats"] == [1.2, 9.0, 1.0]
    assert ar["impi_us"] == 0.4  # median of 0.3 and 0.5
    assert ar["cpp_over_best_peer"] == 3.0  # 1.2 / 0.4 (openmpi 0.4 ties; either is 0.4)
    assert "deepspeed_shm_us_repeats" not in ar  # one run: no list


def test_ratios_by_host_state() -> None:
    """Runs after a short core round trip (under twice the shortest) and after a
    long one are compared within their own state."""
    run = _load_run()

    def rec(lib: str, t: float, rtt: float | None) -> dict:
        return {**_rec(lib, "all_reduce", 2, 8, t), "core_rtt_us": rtt}

    recs = [rec("tpu_dist_cpp", 0.7, 0.1), rec("tpu_dist_cpp", 0.8, 0.11),
            rec("tpu_dist_cpp", 1.2, 0.45), rec("impi", 0.35, 0.1), rec("impi", 0.8, 0.42),
            rec("openmpi", 0.5, 0.09), rec("deepspeed_shm", 0.1, 0.1),  # not an MPI
            rec("tpu_dist_cpp", 9.0, None),  # no round trip measured: left out
            {**_rec("tpu_dist_cpp", "all_gather", 4, 16, 3.0), "core_rtt_us": 0.1}]  # no peer
    rows = run.by_host_state(recs)
    assert rows == [{"op": "all_reduce", "world": 2, "bytes": 8, "near_ratio": 2.143,
                     "near_runs": 2, "far_ratio": 1.5, "far_runs": 1}]  # 0.75/0.35, 1.2/0.8
    assert run.by_host_state(FAKE) == []  # no round trips at all
    doc = run.document(recs, [], [k for k, _, _ in run.LIBS],
                       {"date": "d", "machine": "m", "cpus": 2, "load_start": "1",
                        "load_end": "1", "seconds": 1.0})
    assert "| all_reduce | 2 | 8 B | 2.14 (2) | 1.50 (1) |" in run.report(doc)


def test_torch_vs_deepspeed_at_each_librarys_fastest_run() -> None:
    """Each library's fastest run, and the bound (no-op floor + C++ op) against
    DeepSpeed; rows without all four libraries are left out."""
    run = _load_run()
    def ar(lib: str, *times: float) -> list[dict]:
        return [_rec(lib, "all_reduce", 2, 8, t) for t in times]

    recs = (ar("tpu_dist_torch", 7.3, 20.0) + ar("torch_floor", 10.9, 4.9) +
            ar("tpu_dist_cpp", 0.7, 1.3) + ar("deepspeed_shm", 5.0, 11.0) +
            [_rec(lib, "all_gather", 2, 8, t)  # no DeepSpeed all_gather: left out
             for lib, t in (("tpu_dist_torch", 6.0), ("torch_floor", 7.0),
                            ("tpu_dist_cpp", 0.8))])
    rows = run.torch_vs_deepspeed(recs)
    assert rows == [{"op": "all_reduce", "world": 2, "bytes": 8, "tpu_dist_torch_best_us": 7.3,
                     "torch_floor_best_us": 4.9, "tpu_dist_cpp_best_us": 0.7,
                     "deepspeed_shm_best_us": 5.0, "ratio": 1.46, "bound_ratio": 1.12}]
    doc = run.document(recs, [], [k for k, _, _ in run.LIBS],
                       {"date": "d", "machine": "m", "cpus": 2, "load_start": "1",
                        "load_end": "1", "seconds": 1.0})
    assert "| all_reduce | 2 | 8 B | 7.3 | 4.9 | 0.7 | 5 | 1.46 | 1.12 |" in run.report(doc)


def test_json_markdown_and_plot_from_a_fake_run(tmp_path: Path) -> None:
    src = tmp_path / "in.json"
    runs = [{"lib": "openmpi", "world": 2, "seconds": 0.5, "load_before": "1 1 1",
             "load_after": "1 1 1", "status": "ok", "version": "Open MPI v4.1.4",
             "core_rtt_us": 0.41},
            {"lib": "impi", "world": 2, "seconds": 0.4, "load_before": "1 1 1",
             "load_after": "1 1 1", "status": "ok", "core_rtt_us": 0.2},
            {"lib": "mpich", "world": 2, "seconds": 0.0, "load_before": "1 1 1",
             "load_after": "1 1 1", "status": "skipped: not built", "core_rtt_us": None}]
    src.write_text(json.dumps({
        "date": "2026-12-06T08:00:00Z", "commit": "abc", "machine": "Test CPU", "cpus": 2,
        "load_start": "1 1 1", "load_end": "2 2 2", "seconds": 12.0, "quick": True,
        "libs": [k for k, _, _ in _load_run().LIBS], "runs": runs, "records": FAKE}))
    out = tmp_path / "peers.json"
    res = subprocess.run([sys.executable, str(RUN_PY), "--from-json", str(src), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert [s["key"] for s in doc["series"]] == [
        "tpu_dist_cpp_us", "tpu_dist_torch_us", "gloo_torch_us", "openmpi_us", "mpich_us",
        "impi_us", "deepspeed_shm_us", "memcpy_us"]
    assert [(p["world"], len(p["rows"])) for p in doc["results"]] == [(2, 1), (4, 1)]
    md = out.with_suffix(".md").read_text()
    assert "Test CPU" in md and "load average 1 1 1 at start, 2 2 2 at end" in md
    assert "| Open MPI | Open MPI v4.1.4 | 2 | 0.5 | 1 1 1 -> 1 1 1 | 0.410 | ok |" in md
    assert "| MPICH | - | 2 | 0.0 | 1 1 1 -> 1 1 1 | - | skipped: not built |" in md
    # The host's core-to-core round trip over the runs that measured it.
    assert "each library run: 0.200 - 0.305 - 0.410 us (min - median - max over 2 runs)" in md
    png = out.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 700 and height > 500  # 2 worlds across, 2 ops down


def test_torch_peers_times_every_op_on_gloo_tpu_dist_and_the_no_op_floor() -> None:
    for lib, key in (("gloo", "gloo_torch"), ("tpu_dist", "tpu_dist_torch"),
                     ("fake", "torch_floor")):
        res = subprocess.run(
            [sys.executable, str(TORCH_PEERS), "--lib", lib, "--world", "2", "--sizes", "8",
             "--max-iters", "5", "--timeout", "120", "--op-timeout", "60"],
            capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-2000:]
        recs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        assert "library_version" in recs[0]
        got = [(r["lib"], r["op"], r["world"], r["bytes"], r["iters"]) for r in recs[1:]]
        assert got == [(key, op, 2, 8, 5) for op in
                       ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")]
        assert all(r["time_us"] > 0 for r in recs[1:])
