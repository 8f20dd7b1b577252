"""tools/bench.sh and tools/plot_bench, the writers of bench/results/latest.*.

bench.sh runs against stub binaries here (shell scripts that print a table
and write the JSON part the real binary writes), so the test checks the
driver: every stage is timed and recorded with its exit status, a failing
stage does not stop the others, the markdown and the PNG are written, and the
script exits 1 when a stage failed. plot_bench draws one panel per (op,
world) with one line per library and skips the points a library lacks.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLOT = REPO / "tools" / "plot_bench"
BENCH_SH = REPO / "tools" / "bench.sh"


def _row(op: str, world: int, nbytes: int, t: float, gloo: float | None) -> dict:
    return {"op": op, "dtype": "fp32", "world": world, "bytes": nbytes, "time_us": t,
            "gloo_time_us": gloo, "memcpy_time_us": t / 4}


def _collectives(world: int, hosts: int, gloo_at_16m: float | None = 900.0) -> dict:
    return {"bench": "collectives", "world": world, "hosts": hosts, "load_before": 1.0,
            "load_after": 1.5,
            "rows": [_row("all_reduce", world, 8, 2.0, 150.0),
                     _row("all_reduce", world, 65536, 40.0, 300.0),
                     _row("all_reduce", world, 16 << 20, 3000.0, gloo_at_16m),
                     _row("all_gather", world, 16 << 20, 2500.0, 9000.0)]}


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def test_plot_bench_draws_one_panel_per_op_and_world(tmp_path: Path) -> None:
    doc = {"date": "2026-12-06T03:00:00Z", "machine": "Test CPU", "cpus": 2, "load_end": "1 1 1",
           "results": [_collectives(2, 1), _collectives(4, 2, gloo_at_16m=None),
                       {"bench": "train", "world": 2, "rows": []}]}
    src = tmp_path / "latest.json"
    src.write_text(json.dumps(doc))
    png = tmp_path / "latest.png"
    res = _run([sys.executable, str(PLOT), str(src), "-o", str(png), "--print-series"])
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    # 2 ops x 2 columns x 3 libraries, ops down, columns in file order.
    assert len(lines) == 12
    assert lines[0] == "all_reduce | world 2 | tpu_dist | 8:2 65536:40 16777216:3000"
    assert lines[1] == "all_reduce | world 2 | Gloo | 8:150 65536:300 16777216:900"
    assert lines[2] == "all_reduce | world 2 | memcpy | 8:0.5 65536:10 16777216:750"
    # Gloo has no 16 MiB row in the 2-host run: that point is left out.
    assert lines[4] == "all_reduce | world 4, 2 hosts | Gloo | 8:150 65536:300"
    assert lines[6].startswith("all_gather | world 2 | tpu_dist | 16777216:2500")
    w, h = _png_size(png)
    assert w > 2 * 300 and h > 2 * 210  # two panel columns and rows at least


def test_plot_bench_refuses_a_file_without_collectives(tmp_path: Path) -> None:
    src = tmp_path / "x.json"
    src.write_text(json.dumps({"results": [{"bench": "train", "rows": []}]}))
    res = _run([sys.executable, str(PLOT), str(src), "-o", str(tmp_path / "x.png")])
    assert res.returncode != 0
    assert "no collectives rows" in res.stderr
    assert not (tmp_path / "x.png").exists()


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


@pytest.mark.skipif(shutil.which("jq") is None, reason="tools/bench.sh needs jq")
def test_bench_sh_times_every_stage_and_survives_a_failing_one(tmp_path: Path) -> None:
    bench = tmp_path / "build" / "bench"
    bench.mkdir(parents=True)
    part = tmp_path / "part_w{w}_h{h}.json"
    for w, h in ((2, 1), (4, 1), (4, 2)):
        Path(str(part).format(w=w, h=h)).write_text(json.dumps(_collectives(w, h)))
    # collectives_bench: copies the prepared part to --json_out; world 4 on
    # one host fails after printing its table (as a rank failure would).
    _stub(bench / "collectives_bench", f"""
w=2; h=1; out=""
for a in "$@"; do case $a in --world=*) w=${{a#--world=}};; --hosts=*) h=${{a#--hosts=}};;
  --json_out=*) out=${{a#--json_out=}};; esac; done
echo "startup noise"; echo "== collectives, $w ranks, $h hosts =="
cp "{tmp_path}/part_w${{w}}_h${{h}}.json" "$out"
if [[ $w == 4 && $h == 1 ]]; then exit 3; fi
""")
    _stub(bench / "p2p_bench", """
echo "noise"; echo; echo "== send/recv ping-pong, 2 ranks $1 =="; echo "1MiB | 100.0"
""")
    out = tmp_path / "results" / "latest.json"
    res = _run(["bash", str(BENCH_SH), "--build", str(tmp_path / "build"), "--out", str(out),
                "--worlds", "2 4", "--skip_train", "--skip_gemma", "--skip_python"],
               env={**os.environ, "PATH": os.environ.get("PATH", "")})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "stage collectives_bench --world=4 failed (exit 3" in res.stderr
    doc = json.loads(out.read_text())
    stages = [(s["stage"], s["rc"]) for s in doc["stages"]]
    assert stages == [("collectives_bench --world=2", 0), ("collectives_bench --world=4", 3),
                      ("collectives_bench --world=4 --hosts=2", 0), ("p2p_bench --hosts=1", 0),
                      ("p2p_bench --hosts=2", 0)]
    assert all(s["seconds"] >= 0 for s in doc["stages"])
    assert doc["load_start"] and doc["load_end"] and doc["machine"] is not None
    kinds = [(r["bench"], r.get("world"), r.get("hosts")) for r in doc["results"]]
    assert kinds == [("collectives", 2, 1), ("collectives", 4, 2), ("p2p", None, 1), ("p2p", None, 2)]
    assert "1MiB | 100.0" in doc["results"][2]["text"]
    md = out.with_suffix(".md").read_text()
    assert "| `collectives_bench --world=4` |" in md and "| 3 |" in md
    assert "== send/recv ping-pong, 2 ranks --hosts=2 ==" in md
    assert "startup noise" not in md and "\nnoise" not in md
    assert "| all_reduce | fp32 | 4 (2 hosts) | 16MiB | 3000 |" in md
    _png_size(out.with_suffix(".png"))
    assert not (tmp_path / "results" / "python-latest.json").exists()
