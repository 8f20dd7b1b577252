#!/usr/bin/env python3
"""The c10d support table: docs/c10d_support.tsv, rendered into docs/collectives.md.

    .venv/bin/python tools/c10d_support_table.py           # exit 1 when docs and source disagree
    .venv/bin/python tools/c10d_support_table.py --write   # rewrite the docs' table from the source
    .venv/bin/python tools/c10d_support_table.py --check   # also every check of the source (torch needed)

docs/c10d_support.tsv is the source (its header says what the columns mean);
the table between the two markers in docs/collectives.md is generated from it.
tests/python/test_c10d_support_table.py runs these checks in CI.

The checks of the source (`problems()`):
- every row well formed, entries unique;
- every virtual of torch's c10d::Backend and c10d::ProcessGroup (the headers
  in the installed torch) has a row, and every Backend::/ProcessGroup:: row
  names one;
- Backend rows agree with the headers: "supported" is overridden by
  ProcessGroupTpuDist (collectives/process_group_tpu_dist.h) or forwarded by
  c10d to one it overrides; "inherited" is not overridden by tpu_dist; the
  gloo column is "yes" exactly when ProcessGroupGloo overrides it (or its
  forwarding partner), else "no" ("same" for an inherited row);
- "supported" rows name at least one test, and each test named exists and runs
  in CI: py:<file>::<name> is a module-level test function of a file under
  tests/python (ctest runs each file) without a skip/xfail mark;
  suite:<name> is in the torch suite's CI selection and not in its expected
  failures; cc:<file>:<Suite>.<Name> is a TEST/TEST_F/TEST_P in that file.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "docs" / "c10d_support.tsv"
DOC = ROOT / "docs" / "collectives.md"
BEGIN = "<!-- c10d-support-table: generated from docs/c10d_support.tsv by tools/c10d_support_table.py --write; do not edit -->"
END = "<!-- c10d-support-table: end -->"
TPU_DIST_HEADER = ROOT / "collectives" / "process_group_tpu_dist.h"
COLUMNS = ("entry", "python", "status", "gloo", "tests", "notes")
STATUSES = ("supported", "differs", "not", "inherited")
GLOO = ("yes", "no", "same")
STATUS_WORDS = {"supported": "supported", "differs": "differs from Gloo",
                "not": "not supported", "inherited": "c10d default"}

# c10d::Backend's default of one name of each pair calls the other (torch 2.15
# renamed the *_base / *_coalesced entry points): overriding either serves both.
FORWARDING = {
    "all_gather_single": "_allgather_base",
    "all_gather_single_coalesced": "allgather_into_tensor_coalesced",
    "gather_single": "gather_into_tensor",
    "reduce_scatter_single": "_reduce_scatter_base",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "alltoall_base",
}
FORWARDING.update({v: k for k, v in list(FORWARDING.items())})


@dataclass(frozen=True)
class Row:
    line: int
    entry: str
    python: str
    status: str
    gloo: str
    tests: tuple[str, ...]
    notes: str


def load(path: Path = SOURCE) -> tuple[list[Row], list[str]]:
    """(rows, format problems) of the source file."""
    rows: list[Row] = []
    problems: list[str] = []
    header_seen = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if not header_seen:
            header_seen = True
            if tuple(cols) != COLUMNS:
                problems.append(f"{path.name}:{n}: header must be {'<TAB>'.join(COLUMNS)}")
            continue
        if len(cols) != len(COLUMNS):
            problems.append(f"{path.name}:{n}: {len(cols)} tab-separated columns, want {len(COLUMNS)}")
            continue
        entry, python, status, gloo, tests, notes = (c.strip() for c in cols)
        rows.append(Row(n, entry, python, status, gloo, tuple(tests.split()), notes))
    return rows, problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(rows: list[Row]) -> str:
    """The Markdown table the docs carry (between BEGIN and END)."""
    out = ["| c10d entry point | reached from | tpu_dist | Gloo | tests | notes |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        entry = f"`{r.entry}`" if "::" in r.entry or r.entry.isidentifier() else r.entry
        tests = ", ".join(f"`{t}`" for t in r.tests)
        gloo = {"same": "same"}.get(r.gloo, r.gloo)
        out.append("| " + " | ".join(_cell(c) for c in (
            entry, r.python, STATUS_WORDS.get(r.status, r.status), gloo, tests, r.notes)) + " |")
    return "\n".join(out) + "\n"


def doc_table(doc: str) -> str | None:
    """The generated table in the docs' text, or None without markers."""
    if BEGIN not in doc or END not in doc:
        return None
    return doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def with_table(doc: str, table: str) -> str:
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def doc_problems(rows: list[Row], doc_path: Path = DOC) -> list[str]:
    table = doc_table(doc_path.read_text())
    if table is None:
        return [f"{doc_path.name}: no generated table (markers {BEGIN!r} ... {END!r})"]
    if table != render(rows):
        return [f"{doc_path.name}: its c10d table differs from docs/c10d_support.tsv; "
                "run tools/c10d_support_table.py --write"]
    return []


# ---------------------------------------------------------------- headers

def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def virtuals(header: Path, after: str) -> list[str]:
    """Names of the virtual member functions declared in `header` after the
    first occurrence of `after` (to skip nested Options structs)."""
    text = header.read_text()
    text = _strip_comments(text[text.index(after):])
    names = [m.group(1) for m in re.finditer(r"\bvirtual\s[^;{(]*?\b(~?\w+)\s*\(", text)]
    return [n for n in dict.fromkeys(names) if not n.startswith("~")]


def overrides(header: Path) -> set[str]:
    """Names of the member functions `header` declares `override`."""
    text = _strip_comments(header.read_text())
    pat = r"(\w+)\s*\(((?:[^()]|\([^()]*\))*)\)\s*(?:const\s*)?(?:noexcept\s*)?override\b"
    return {m.group(1) for m in re.finditer(pat, text)}


def torch_c10d_include() -> Path:
    import torch  # noqa: PLC0415 - only the checks need torch

    return Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" / "c10d"


def header_problems(rows: list[Row]) -> list[str]:
    inc = torch_c10d_include()
    backend = virtuals(inc / "Backend.hpp", "explicit Backend(")
    pg_only = [n for n in virtuals(inc / "ProcessGroup.hpp", "class TORCH_API ProcessGroup")
               if n not in backend]
    gloo = overrides(inc / "ProcessGroupGloo.hpp")
    ours = overrides(TPU_DIST_HEADER)
    problems: list[str] = []
    by_entry = {r.entry: r for r in rows}
    wanted = [f"Backend::{n}" for n in backend] + [f"ProcessGroup::{n}" for n in pg_only]
    for name in wanted:
        if name not in by_entry:
            problems.append(f"torch 2.15's {name} has no row in docs/c10d_support.tsv")
    for r in rows:
        if "::" in r.entry and r.entry not in wanted:
            problems.append(f"line {r.line}: {r.entry} is not a virtual of torch's "
                            "c10d::Backend / c10d::ProcessGroup")
        if not r.entry.startswith("Backend::"):
            continue
        name = r.entry.split("::", 1)[1]
        served = {name, FORWARDING.get(name, name)}
        if r.status == "supported" and not served & ours:
            problems.append(f"line {r.line}: {r.entry} is 'supported' but "
                            f"{TPU_DIST_HEADER.name} overrides neither {' nor '.join(sorted(served))}")
        if r.status == "inherited":
            if name in ours:
                problems.append(f"line {r.line}: {r.entry} is 'inherited' but tpu_dist overrides it")
            want = "yes" if served & gloo else "same"
            if r.gloo != want:
                problems.append(f"line {r.line}: {r.entry}: an 'inherited' row's gloo column is "
                                f"{want!r} (ProcessGroupGloo {'overrides' if want == 'yes' else 'does not override'} it)")
            if want == "yes" and not r.notes:
                problems.append(f"line {r.line}: {r.entry}: Gloo overrides it; the notes say how they compare")
        elif r.gloo != ("yes" if served & gloo else "no"):
            problems.append(f"line {r.line}: {r.entry}: gloo column {r.gloo!r}, but "
                            f"ProcessGroupGloo {'overrides' if served & gloo else 'does not override'} it")
    return problems


# ---------------------------------------------------------------- tests

_SKIP_MARKS = ("skip", "skipif", "xfail")


def _python_tests(path: Path) -> dict[str, bool]:
    """Module-level test functions of a file -> runs (no skip/xfail mark)."""
    tree = ast.parse(path.read_text())
    out: dict[str, bool] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            marks = [ast.unparse(d) for d in node.decorator_list]
            out[node.name] = not any(f"mark.{m}" in d for d in marks for m in _SKIP_MARKS)
    return out


def _suite_ci_names() -> set[str]:
    sys.path.insert(0, str(ROOT / "tests" / "torch_suite"))
    try:
        import run_suite  # noqa: PLC0415

        return {n for fam in run_suite.CI_FAMILIES.values() for n in fam}
    finally:
        sys.path.pop(0)


def _suite_expected_failures() -> set[str]:
    names = set()
    for line in (ROOT / "tests" / "torch_suite" / "expected_failures.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(line.split("@", 1)[0])
    return names


def test_problems(rows: list[Row]) -> list[str]:
    problems: list[str] = []
    suite_ci = _suite_ci_names()
    suite_xfail = _suite_expected_failures()
    py_cache: dict[Path, dict[str, bool]] = {}
    for r in rows:
        if r.status == "supported" and not r.tests:
            problems.append(f"line {r.line}: {r.entry} is 'supported' but names no test")
        for t in r.tests:
            kind, _, ref = t.partition(":")
            if kind == "py":
                file, _, name = ref.partition("::")
                path = ROOT / file
                if not (file.startswith("tests/python/test_") and path.is_file()):
                    problems.append(f"line {r.line}: {t}: no such file under tests/python")
                    continue
                tests = py_cache.setdefault(path, _python_tests(path))
                if name not in tests:
                    problems.append(f"line {r.line}: {t}: {file} has no test function {name}")
                elif not tests[name]:
                    problems.append(f"line {r.line}: {t}: marked skip/xfail, so it proves nothing")
            elif kind == "suite":
                if ref not in suite_ci:
                    problems.append(f"line {r.line}: {t}: not in the torch suite's CI selection "
                                    "(tests/torch_suite/run_suite.py CI_FAMILIES)")
                if ref in suite_xfail and r.status == "supported":
                    problems.append(f"line {r.line}: {t}: an expected failure of the torch suite, "
                                    "so it does not show the row is supported")
            elif kind == "cc":
                file, _, test = ref.rpartition(":")
                suite, _, name = test.partition(".")
                path = ROOT / file
                pat = rf"^TEST(?:_F|_P)?\(\s*{re.escape(suite)}\s*,\s*{re.escape(name)}\s*\)"
                if not path.is_file() or not re.search(pat, path.read_text(), re.M):
                    problems.append(f"line {r.line}: {t}: no TEST*({suite}, {name}) in {file}")
            else:
                problems.append(f"line {r.line}: {t}: unknown kind {kind!r} (py:, suite:, cc:)")
    return problems


def problems(path: Path = SOURCE) -> list[str]:
    rows, found = load(path)
    seen: set[str] = set()
    for r in rows:
        if r.entry in seen:
            found.append(f"line {r.line}: {r.entry} listed twice")
        seen.add(r.entry)
        if r.status not in STATUSES:
            found.append(f"line {r.line}: status {r.status!r} not one of {STATUSES}")
        if r.gloo not in GLOO:
            found.append(f"line {r.line}: gloo {r.gloo!r} not one of {GLOO}")
        if r.status in ("differs", "not") and not r.notes:
            found.append(f"line {r.line}: a '{r.status}' row says in its notes what the user sees")
    return found + header_problems(rows) + test_problems(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the docs' table")
    p.add_argument("--check", action="store_true", help="also check the source")
    args = p.parse_args(argv)
    rows, found = load()
    if found:
        print("\n".join(found), file=sys.stderr)
        return 1
    if args.write:
        DOC.write_text(with_table(DOC.read_text(), render(rows)))
    found = doc_problems(rows) + (problems() if args.check else [])
    if found:
        print("\n".join(found), file=sys.stderr)
        return 1
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    print(f"{len(rows)} rows: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
