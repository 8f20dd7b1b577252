#!/usr/bin/env python3
"""PyTorch's own test/distributed files, run on Gloo and on tpu_dist and compared.

    upstream_files.py                      # every file of upstream_files.tsv present in the cache
    upstream_files.py --files test/distributed/test_c10d_object_collectives.py -v
    upstream_files.py --backends gloo      # one backend only (no comparison)
    upstream_files.py --list               # what the manifest names and what the cache holds

The files are not in the torch wheel, and this repository does not carry
copies of them: they are read from a cache folder, `$TPU_DIST_PYTORCH_TESTS`
(default ~/.cache/tpu_dist/pytorch-tests), laid out as in the pytorch/pytorch
repository (`<cache>/test/distributed/<file>`). upstream_files.tsv names each
file, the pytorch/pytorch commit it was taken from, its sha256 (a file in the
cache with other bytes is refused: results belong to the bytes listed), and
the tests of it that are run (a pytest -k expression; "all" for every test).
README.md says where the files come from and how to put them in the cache.

Each file runs under pytest twice, once per backend, with
tests/torch_suite/upstream/shim first on PYTHONPATH: its sitecustomize turns
the files' "gloo" groups into tpu_dist groups in the tpu_dist run
(TPU_DIST_UPSTREAM_BACKEND=tpu_dist) and, in both runs, forks the ranks of
torch's MultiProcessTestCase from a forkserver instead of spawning them. Every
test that passes on Gloo must pass on tpu_dist unless
upstream_expected_failures.txt lists it (`<file>::<Class>::<test>  # reason`);
a listed test that passes is reported as stale; a run that leaves tpu_dist or
torch segments in /dev/shm fails. Exit status: 0 no regression,
1 regressions, 2 nothing could be run (a file missing or with other bytes, a
malformed list). A file absent from the cache is skipped with a message when
--allow-missing is given (what CI does on a machine without the cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "upstream_files.tsv"
EXPECTED = HERE / "upstream_expected_failures.txt"
SHIM = HERE / "upstream" / "shim"
SHIMS_EXPECTTEST = HERE / "_shims"
DEFAULT_CACHE = Path.home() / ".cache" / "tpu_dist" / "pytorch-tests"
BACKENDS = ("gloo", "tpu_dist")
_EXPECTED_LINE = re.compile(r"^(?P<id>[\w./-]+\.py::\w+::\w+)\s*#\s*(?P<reason>\S.*)$")


@dataclass(frozen=True)
class UpstreamFile:
    path: str      # in the pytorch repository, e.g. test/distributed/test_c10d_common.py
    commit: str    # the pytorch/pytorch commit it was taken from
    sha256: str
    select: str    # pytest -k expression, or "all"
    note: str


def cache_dir() -> Path:
    return Path(os.environ.get("TPU_DIST_PYTORCH_TESTS") or DEFAULT_CACHE)


def load_manifest(path: Path = MANIFEST) -> list[UpstreamFile]:
    files: list[UpstreamFile] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 5 or cols[0] == "path":
            if cols[0] == "path":
                continue
            raise ValueError(f"{path.name}:{n}: want 5 tab-separated columns: "
                             "path, commit, sha256, select, note")
        files.append(UpstreamFile(*(c.strip() for c in cols)))
    return files


def load_expected(path: Path = EXPECTED) -> dict[str, str]:
    """{"<file>::<Class>::<test>": reason}; raises ValueError on a bad line."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _EXPECTED_LINE.match(line)
        if not m:
            raise ValueError(f"{path.name}:{n}: expected `<file>::<Class>::<test>  # reason`: {raw!r}")
        out[m.group("id")] = m.group("reason").strip()
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_file(f: UpstreamFile, cache: Path) -> str | None:
    """None when the cache holds exactly the listed bytes, else why not."""
    local = cache / f.path
    if not local.is_file():
        return (f"{f.path} is not in {cache} (put pytorch/pytorch's {f.path} at commit "
                f"{f.commit[:12]} there; see tests/torch_suite/README.md)")
    got = sha256(local)
    if got != f.sha256:
        return f"{local}: sha256 {got[:16]}..., upstream_files.tsv lists {f.sha256[:16]}..."
    return None


def _junit_outcomes(xml_path: Path, file_name: str) -> dict[str, dict[str, str]]:
    """{"<file>::<Class>::<test>": {"outcome", "message"}} from pytest's junit XML."""
    out: dict[str, dict[str, str]] = {}
    if not xml_path.exists():
        return out
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        test_id = f"{file_name}::{cls}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or el.text or "").strip().splitlines()[0:1]
                message = message[0][:300] if message else ""
                break
        out[test_id] = {"outcome": outcome, "message": message}
    return out


def _shm_entries() -> set[str]:
    """The shared-memory segments tpu_dist and torch name (as run_suite.py)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("torch_", "tpud_"))}
    except OSError:
        return set()


def run_file(f: UpstreamFile, backend: str, cache: Path, out_dir: Path,
             timeout_s: float, verbose: bool, only: list[str] | None = None,
             tag: str = "") -> dict[str, Any]:
    """Runs one file on one backend (or only the given tests of it, as
    "<file>::<Class>::<test>"); the per-test outcomes and the counts."""
    file_name = Path(f.path).name
    xml_path = out_dir / f"{file_name}.{backend}{tag}.xml"
    log_path = out_dir / f"{file_name}.{backend}{tag}.log"
    env = dict(os.environ)
    path = [str(SHIM)]
    try:
        import expecttest  # noqa: F401, PLC0415
    except ImportError:
        path.append(str(SHIMS_EXPECTTEST))
    env.update(
        PYTHONPATH=os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p]),
        TPU_DIST_UPSTREAM_BACKEND=backend,
        TPU_DIST_UPSTREAM_START="forkserver",
        OMP_NUM_THREADS="1",
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=env.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120"),
        TPU_DIST_UPSTREAM_LOG=str(out_dir / f"{file_name}.{backend}{tag}.groups"),
    )
    Path(env["TPU_DIST_UPSTREAM_LOG"]).write_text("")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--durations=8",
           "--junitxml", str(xml_path)]
    if only:
        cmd += [f"{cache / f.path}::{t.split('::', 1)[1]}" for t in only]
    else:
        cmd.append(str(cache / f.path))
        if f.select != "all":
            cmd += ["-k", f.select]
    shm_before = _shm_entries()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tpu_dist_upstream_") as work, \
            open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.monotonic() - start
    tests = _junit_outcomes(xml_path, file_name)
    counts = {k: sum(t["outcome"] == k for t in tests.values())
              for k in ("passed", "failed", "error", "skipped")}
    groups = Path(env["TPU_DIST_UPSTREAM_LOG"]).read_text().splitlines()
    redirected = sum(line.endswith("-> 'tpu_dist'") or ":tpu_dist" in line for line in groups)
    if verbose:
        print(f"  {backend}: {file_name}: {counts} in {wall:.0f} s, {redirected} of "
              f"{len(groups)} group creations made tpu_dist (pytest exit {rc}; log {log_path})")
    return {"file": f.path, "backend": backend, "rc": rc, "wall_s": round(wall, 1),
            "counts": counts, "tests": tests, "log": str(log_path),
            "groups_created": len(groups), "groups_tpu_dist": redirected,
            "shm_leftovers": sorted(_shm_entries() - shm_before)}


def compare(gloo: dict[str, Any], ours: dict[str, Any],
            expected: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(regressions, expected failures seen, stale expected entries) of one file."""
    regressions, seen, stale = [], [], []
    for test_id, g in sorted(gloo["tests"].items()):
        t = ours["tests"].get(test_id, {"outcome": "missing", "message": ""})
        if g["outcome"] != "passed":
            continue
        if t["outcome"] == "passed":
            if test_id in expected:
                stale.append(test_id)
            continue
        if test_id in expected:
            seen.append(test_id)
        else:
            regressions.append(f"{test_id}: {t['outcome']} on tpu_dist: {t['message']}")
    return regressions, seen, stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", nargs="*", help="paths as in upstream_files.tsv (default: all)")
    p.add_argument("--backends", nargs="*", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--out-dir", type=Path, help="keep logs, junit XML and report.json here")
    p.add_argument("--timeout", type=float, default=900, help="seconds per file and backend")
    p.add_argument("--allow-missing", action="store_true",
                   help="skip files absent from the cache instead of failing")
    p.add_argument("--list", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    try:
        manifest = load_manifest()
        expected = load_expected()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    cache = cache_dir()
    files = [f for f in manifest if not args.files or f.path in args.files]
    unknown = sorted(set(args.files or []) - {f.path for f in manifest})
    if unknown:
        print(f"not in upstream_files.tsv: {unknown}", file=sys.stderr)
        return 2
    bad = {f.path: why for f in files if (why := check_file(f, cache))}
    if args.list:
        for f in files:
            print(f"{f.path}  {f.commit[:12]}  select={f.select!r}  "
                  f"{'MISSING: ' + bad[f.path] if f.path in bad else 'in cache'}")
        return 0
    if bad and not args.allow_missing:
        print("\n".join(bad.values()), file=sys.stderr)
        return 2
    for path, why in bad.items():
        print(f"skipped: {why}")
    files = [f for f in files if f.path not in bad]
    if not files:
        print("no upstream file to run")
        return 0
    known = {f"{Path(f.path).name}" for f in manifest}
    for test_id in expected:
        if test_id.split("::", 1)[0] not in known:
            print(f"upstream_expected_failures.txt: {test_id}: file not in upstream_files.tsv",
                  file=sys.stderr)
            return 2
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="tpu_dist_upstream_out_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"cache": str(cache), "files": {}}
    status = 0
    totals = {b: {"passed": 0, "failed": 0, "error": 0, "skipped": 0} for b in args.backends}
    for f in files:
        runs = {b: run_file(f, b, cache, out_dir, args.timeout, args.verbose) for b in args.backends}
        entry: dict[str, Any] = {"commit": f.commit, "select": f.select, "runs": runs}
        for b, r in runs.items():
            for k, v in r["counts"].items():
                totals[b][k] += v
            if not r["tests"]:
                print(f"{f.path} on {b}: no test ran (pytest exit {r['rc']}); log {r['log']}")
                status = 1
            if r["shm_leftovers"]:
                print(f"{f.path} on {b}: left in /dev/shm: {r['shm_leftovers']}")
                status = 1
            if b == "tpu_dist" and r["counts"]["passed"] and not r["groups_tpu_dist"]:
                print(f"{f.path}: no group of the tpu_dist run was made tpu_dist: "
                      "the file did not exercise the backend")
                status = 1
        if set(BACKENDS) <= set(runs):
            regressions, seen, stale = compare(runs["gloo"], runs["tpu_dist"], expected)
            if regressions:
                # Once more, alone: on a loaded 2-core machine a test with a
                # fixed limit of its own can time out on either backend.
                again = [r.split(": ", 1)[0] for r in regressions]
                rerun = run_file(f, "tpu_dist", cache, out_dir, args.timeout, args.verbose,
                                 only=again, tag=".rerun")
                entry["rerun"] = rerun
                flaky = [t for t in again if rerun["tests"].get(t, {}).get("outcome") == "passed"]
                for t in flaky:
                    print(f"passed when run again (flaky, not a regression): {t}")
                regressions = [r for r in regressions if r.split(": ", 1)[0] not in flaky]
            entry.update(regressions=regressions, expected_failures=seen, stale=stale)
            for line in regressions:
                print(f"REGRESSION: {line}")
            for test_id in stale:
                print(f"stale expected failure (passes on tpu_dist now): {test_id}")
            if regressions:
                status = 1
        report["files"][f.path] = entry
    report["totals"] = totals
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    for b, c in totals.items():
        print(f"{b}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, "
              f"{c['error']} error ({len(files)} files)")
    return status


if __name__ == "__main__":
    sys.exit(main())
