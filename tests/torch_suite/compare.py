#!/usr/bin/env python3
"""Runs the same suite selection on Gloo and on tpu_dist and compares them.

    compare.py                         # ci selection, world 2 and 3
    compare.py --worlds 2 --select long --out-dir out/torch_suite
    compare.py --no-run --out-dir out/torch_suite   # compare reports already there

For every world size, every test that passes on Gloo must pass on the other
backend, unless it is listed in expected_failures.txt (one test per line,
`test_name  # reason`, or `test_name@3  # reason` for world 3 only). Prints
passed/failed/skipped/error counts per backend and world, the regressions,
and listed tests that pass now (stale entries). Exit status: 0 when there is
no regression, 1 otherwise, 2 when a run could not be made (for example the
backend's module does not import) or the expected-failures file is malformed.
Runs one suite at a time (2-core CI machines).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import run_suite

HERE = Path(__file__).resolve().parent
DEFAULT_EXPECTED = HERE / "expected_failures.txt"
_LINE = re.compile(r"^(?P<name>test_\w+)(@(?P<world>\d+))?\s*(#\s*(?P<reason>.*))?$")


@dataclass(frozen=True)
class ExpectedFailure:
    test: str
    world: int | None  # None: every world size
    reason: str
    line: int


def load_expected(path: Path) -> list[ExpectedFailure]:
    """Parses the expected-failures file; raises ValueError on a bad line."""
    entries: list[ExpectedFailure] = []
    if not path.exists():
        return entries
    for i, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{path}:{i}: expected `test_name[@world]  # reason`: {raw!r}")
        reason = (m.group("reason") or "").strip()
        if not reason:
            raise ValueError(f"{path}:{i}: {m.group('name')} has no `# reason`")
        world = int(m.group("world")) if m.group("world") else None
        entries.append(ExpectedFailure(m.group("name"), world, reason, i))
    return entries


def expected_for(entries: list[ExpectedFailure], world: int) -> dict[str, str]:
    return {e.test: e.reason for e in entries if e.world in (None, world)}


def compare_reports(base: dict[str, Any], other: dict[str, Any],
                    expected: dict[str, str]) -> dict[str, Any]:
    """Regressions of `other` against `base` (tests passing on base only)."""
    base_tests = base.get("tests", {})
    other_tests = other.get("tests", {})
    regressions: list[dict[str, str]] = []
    allowed: list[dict[str, str]] = []
    stale: list[str] = []
    for name, r in base_tests.items():
        if r["outcome"] != "passed":
            continue
        o = other_tests.get(name, {"outcome": "error", "message": "not run"})
        if o["outcome"] == "passed":
            if name in expected:
                stale.append(name)
            continue
        entry = {"test": name, "outcome": o["outcome"], "message": o.get("message", "")}
        if name in expected:
            allowed.append({**entry, "reason": expected[name]})
        else:
            regressions.append(entry)
    return {"regressions": regressions, "expected_failures": allowed,
            "stale_expected_failures": stale}


_HANG = re.compile(r"(Process \d+ timed out with traceback|Could not retrieve traceback "
                   r"for timed out process)")


def hang_tracebacks(log_path: str | None, max_lines: int = 40) -> list[str]:
    """The ranks' stacks torch's harness logs when a test times out.

    MultiProcessTestCase asks every rank still running at the timeout for a
    faulthandler dump of all its threads and logs it; those blocks (each cut
    to `max_lines`) are what says where a rank hung.
    """
    if not log_path or not Path(log_path).exists():
        return []
    lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if _HANG.search(line):
            blocks.append("\n".join(lines[i:i + max_lines]))
    return blocks


def _counts(report: dict[str, Any] | None) -> str:
    if not report or report.get("fatal"):
        return "not run"
    c = report["counts"]
    gated = len(report.get("gated_as_gloo", []))
    extra = f" ({gated} gated as gloo)" if gated else ""
    return (f"{c['passed']:3d} passed {c['failed']:3d} failed {c['skipped']:3d} skipped "
            f"{c['error']:3d} error  {report['wall_s']:6.0f} s{extra}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="tpu_dist", help="backend compared with gloo")
    p.add_argument("--baseline", default="gloo", help="reference backend (default gloo)")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 3])
    p.add_argument("--expected", type=Path, default=DEFAULT_EXPECTED,
                   help="expected-failures file (default: expected_failures.txt here)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="write <backend>_w<N>.json/.log reports and summary.json here")
    p.add_argument("--no-run", action="store_true",
                   help="compare the reports already in --out-dir")
    p.add_argument("--strict", action="store_true",
                   help="also fail on stale expected failures (listed tests that pass)")
    run_suite.add_common_args(p)
    args = p.parse_args(argv)

    try:
        entries = load_expected(args.expected)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.no_run and not args.out_dir:
        print("error: --no-run needs --out-dir", file=sys.stderr)
        return 2
    patterns, excludes, selection = run_suite.resolve_selection(args)

    reports: dict[tuple[str, int], dict[str, Any]] = {}
    status = 0
    for world in args.worlds:
        for backend in (args.baseline, args.backend):
            path = args.out_dir / f"{backend}_w{world}.json" if args.out_dir else None
            if args.no_run:
                assert path is not None
                reports[(backend, world)] = json.loads(path.read_text(encoding="utf-8"))
                continue
            print(f"--- {backend} world {world} ({selection})", flush=True)
            report = run_suite.run_suite(
                backend=backend, world=world, patterns=patterns, excludes=excludes,
                start=args.start, test_timeout=args.test_timeout,
                log_path=path.with_suffix(".log") if path else None,
                backend_module=args.backend_module if backend == args.backend else None,
                selection_name=selection, verbose=args.verbose)
            if path:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
            reports[(backend, world)] = report
            if report.get("fatal"):
                print(f"error: {backend}: {report['fatal']}", file=sys.stderr)
                status = 2
            elif report.get("unmatched"):
                print(f"error: no such tests in this torch: {report['unmatched']}",
                      file=sys.stderr)
                status = 2
            else:
                print(run_suite.summary_line(report), flush=True)
            if report.get("shm_leftovers"):
                print(f"warning: left in /dev/shm: {report['shm_leftovers']}", file=sys.stderr)
            if status == 2 and backend == args.backend:
                break
        if status == 2:
            break

    summary: dict[str, Any] = {"selection": selection, "worlds": {}}
    hangs: list[str] = []  # printed last: CI shows the tail of the output
    print("\n=== torch distributed suite: counts")
    for world in args.worlds:
        for backend in (args.baseline, args.backend):
            print(f"  {backend:>10s} world {world}: {_counts(reports.get((backend, world)))}")
    for world in args.worlds:
        base = reports.get((args.baseline, world))
        other = reports.get((args.backend, world))
        if not base or not other or base.get("fatal") or other.get("fatal"):
            continue
        if base["counts"]["passed"] == 0:
            print(f"error: {args.baseline} passed nothing at world {world}: harness broken?",
                  file=sys.stderr)
            status = 2
        cmp = compare_reports(base, other, expected_for(entries, world))
        summary["worlds"][world] = {
            args.baseline: base["counts"], args.backend: other["counts"], **cmp}
        for r in cmp["regressions"]:
            print(f"REGRESSION world {world}: {r['test']}: {args.baseline} passed, "
                  f"{args.backend} {r['outcome']}: {r['message'][:400]}")
            status = max(status, 1)
        if any("timed out" in r["message"] for r in cmp["regressions"]):
            hangs += [f"--- world {world}, from {other.get('log')}:\n{b}"
                      for b in hang_tracebacks(other.get("log"))]
        for r in cmp["expected_failures"]:
            print(f"expected failure world {world}: {r['test']} ({r['outcome']}): {r['reason']}")
        for name in cmp["stale_expected_failures"]:
            print(f"note world {world}: {name} is listed in {args.expected.name} but passes")
            if args.strict:
                status = max(status, 1)
        base_bad = [n for n, r in base["tests"].items() if r["outcome"] in ("failed", "error")]
        if base_bad:
            print(f"note world {world}: not passing on {args.baseline} (not required of "
                  f"{args.backend}): {', '.join(base_bad)}")
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n",
                                                   encoding="utf-8")
    print("OK: no regressions" if status == 0 else f"FAILED (status {status})")
    if hangs:
        print("\n=== where the timed-out ranks were (torch's harness dump)")
        print("\n".join(hangs))
    return status


if __name__ == "__main__":
    sys.exit(main())
