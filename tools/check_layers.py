#!/usr/bin/env python3
"""The layering check: the repo's C++ includes against docs/layers.toml.

    .venv/bin/python tools/check_layers.py           # exit 1 and one line per problem
    .venv/bin/python tools/check_layers.py --write   # re-render docs/architecture.md's tables
    .venv/bin/python tools/check_layers.py --graph   # the folder include graph, bottom-up

docs/layers.toml is the source of the rules; the tables between the two
markers in docs/architecture.md are rendered from it (so the doc and the check
cannot drift: a stale table is a problem too). ctest runs it (check_layers,
label static_check); tests/lint/test_check_layers.py shows each rule failing
on a small fake tree.

What is checked, over every .h / .cc / .cpp file (build*/, .venv/, .git/
left out) and every .py file for the environment rule:
- includes: each `#include "..."` of ours (a path from the repo root, or next
  to the including file, or under one of the rules' top folders: generated
  headers) goes to the file's own folder or to one its rule allows; a test
  file (the `test_files` patterns) may also include the folder's
  `tests_may_include` (default: the top-level one) and test files of the
  folders it may include;
- no include cycle between folders (test files of a folder are a node of their
  own: they sit above testing/) and none between files, a .h/.cc pair counted
  as one unit (collectives/group_registry.cc included process_group_tpu_dist.h
  and process_group_tpu_dist.cc group_registry.h: a loop);
- the rules themselves form no cycle (they define the layers);
- no read of a TPU_* / MEGASCALE_* hardware variable (getenv, GetEnv / GetInt
  on an EnvMap, os.environ, os.getenv) outside the `env_reads` allowances
  (tpu_runtime/, python/tpu_dist/env.py and the reasons listed there);
  TPU_DIST_* are the project's own configuration and allowed anywhere;
- every header's guard is TPU_DIST_<PATH>_H_ (#ifndef, #define, and
  `#endif  // <guard>` last);
- no namespace named `testing` of ours (it shadows GoogleTest's).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
RULES = Path("docs/layers.toml")
DOC = Path("docs/architecture.md")
BEGIN = ("<!-- layers-table: generated from docs/layers.toml by tools/check_layers.py --write; "
         "do not edit -->")
END = "<!-- layers-table: end -->"
CPP_SUFFIXES = (".h", ".cc", ".cpp")
SKIP_DIRS = {".git", ".venv", ".pytest_cache", "__pycache__", "node_modules"}

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)
HW_VAR = r'"((?:TPU|MEGASCALE)_(?!DIST_)[A-Z0-9_]*)"'
CPP_ENV_READ = re.compile(
    r"\b(?:std::)?(?:secure_)?getenv\s*\(\s*" + HW_VAR
    + r"|\b(?:GetEnv|GetInt|HasEnv)\s*\(\s*[\w.\->]+\s*,\s*" + HW_VAR)
PY_HW_VAR = r"""['"]((?:TPU|MEGASCALE)_(?!DIST_)[A-Z0-9_]*)['"]"""
PY_ENV_READ = re.compile(
    r"\bos\.environ(?:\.get)?\s*[\[(]\s*" + PY_HW_VAR
    + r"|\bos\.getenv\s*\(\s*" + PY_HW_VAR
    + r"|" + PY_HW_VAR + r"\s+(?:not\s+)?in\s+os\.environ\b")
NAMESPACE_TESTING = re.compile(r"\bnamespace\s+((?:\w+::)*testing)\s*\{")


@dataclass
class Part:
    """Files of a folder (globs on the name) that may include more."""
    files: List[str]
    may_include: List[str]
    note: str = ""


@dataclass
class Folder:
    path: str
    may_include: List[str]
    note: str = ""
    tests_may_include: Optional[List[str]] = None
    parts: List[Part] = field(default_factory=list)


@dataclass
class Rules:
    folders: Dict[str, Folder]
    test_files: List[str]
    tests_may_include: List[str]
    env_reads: List[Tuple[str, str]]  # (path or folder prefix ending in "/", why)


def load_rules(path: Path) -> Rules:
    data = tomllib.loads(path.read_text())
    folders: Dict[str, Folder] = {}
    for f in data.get("folder", []):
        parts = [Part(list(p["files"]), list(p.get("may_include", [])), p.get("note", ""))
                 for p in f.get("part", [])]
        folders[f["path"]] = Folder(f["path"], list(f.get("may_include", [])), f.get("note", ""),
                                    f.get("tests_may_include"), parts)
    env = [(e["path"], e.get("why", "")) for e in data.get("env_read", [])]
    return Rules(folders, list(data.get("test_files", [])),
                 list(data.get("tests_may_include", [])), env)


# ---------------------------------------------------------------- the tree


def source_files(root: Path, suffixes: Sequence[str]) -> List[str]:
    out = []
    for d, dirs, files in os.walk(root):
        rel_dir = Path(d).relative_to(root)
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS
                         and not (rel_dir == Path(".") and x.startswith("build")))
        out += [str((rel_dir / f).as_posix()).removeprefix("./")
                for f in sorted(files) if f.endswith(tuple(suffixes))]
    return out


def folder_of(path: str, rules: Rules) -> Optional[str]:
    """The longest rule folder that contains `path`, None when none does."""
    best = None
    for name in rules.folders:
        if path.startswith(name + "/") and (best is None or len(name) > len(best)):
            best = name
    return best


def is_test_file(path: str, rules: Rules) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in rules.test_files)


def resolve_include(inc: str, includer: str, root: Path, rules: Rules) -> Optional[str]:
    """The repo path `inc` names, None for a header not of ours."""
    if (root / inc).is_file():
        return inc
    beside = (Path(includer).parent / inc).as_posix()
    if (root / beside).is_file():
        return os.path.normpath(beside)
    if folder_of(inc, rules) is not None:  # generated (e.g. *.pb.h) or missing
        return inc
    return None


def strip_cpp_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


# ---------------------------------------------------------------- the checks


def allowed_targets(path: str, folder: Folder, rules: Rules) -> Set[str]:
    name = path.rsplit("/", 1)[-1]
    allowed = set(folder.may_include)
    for part in folder.parts:
        if any(fnmatch.fnmatch(name, g) for g in part.files):
            allowed |= set(part.may_include)
    if is_test_file(path, rules):
        extra = folder.tests_may_include
        allowed |= set(rules.tests_may_include if extra is None else extra)
    return allowed


def include_allowed(target: str, target_folder: str, allowed: Set[str]) -> bool:
    return target_folder in allowed or target in allowed


def strongly_connected(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's SCCs with more than one node (or a self loop), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]
    nodes = set(graph) | {t for ts in graph.values() for t in ts}

    def visit(v: str) -> None:
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in graph.get(node, ()):
                    out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(out)


def guard_for(path: str) -> str:
    stem = path[: -len(".h")] if path.endswith(".h") else path
    return "TPU_DIST_" + re.sub(r"[^A-Z0-9]", "_", stem.upper()) + "_H_"


def guard_problem(path: str, text: str) -> Optional[str]:
    want = guard_for(path)
    directives = [l.strip() for l in text.splitlines() if l.lstrip().startswith("#")]
    if len(directives) < 3:
        return f"{path}: header guard: expected {want}"
    ok = (re.fullmatch(r"#\s*ifndef\s+" + want, directives[0])
          and re.fullmatch(r"#\s*define\s+" + want, directives[1])
          and re.fullmatch(r"#\s*endif\s+//\s*" + want, directives[-1]))
    if ok:
        return None
    return (f"{path}: header guard: expected #ifndef/#define {want} first and "
            f"'#endif  // {want}' last (found '{directives[0]}')")


def env_read_allowed(path: str, rules: Rules) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p, _ in rules.env_reads)


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


@dataclass
class Report:
    problems: List[str]
    node_graph: Dict[str, Set[str]]  # folder-level, test nodes "<folder> (tests)"


def check(root: Path, rules: Rules) -> Report:
    problems: List[str] = []
    file_graph: Dict[str, Set[str]] = {}
    node_graph: Dict[str, Set[str]] = {}
    for path in source_files(root, CPP_SUFFIXES):
        text = (root / path).read_text(errors="replace")
        code = strip_cpp_comments(text)
        fname = folder_of(path, rules)
        if fname is None:
            problems.append(f"{path}: no rule for its folder in {RULES} (add one)")
            continue
        folder = rules.folders[fname]
        test = is_test_file(path, rules)
        node = fname + (" (tests)" if test else "")
        node_graph.setdefault(node, set())
        allowed = allowed_targets(path, folder, rules)
        for m in INCLUDE.finditer(code):
            target = resolve_include(m.group(1), path, root, rules)
            if target is None:
                continue
            unit, target_unit = os.path.splitext(path)[0], os.path.splitext(target)[0]
            if unit != target_unit:
                file_graph.setdefault(unit, set()).add(target_unit)
            tfolder = folder_of(target, rules)
            if tfolder is None:
                problems.append(f"{path}:{line_of(code, m.start())}: includes {target}, "
                                f"whose folder has no rule")
                continue
            target_test = is_test_file(target, rules)
            tnode = tfolder + (" (tests)" if target_test else "")
            if tnode != node:
                node_graph[node].add(tnode)
            if tfolder == fname:
                if target_test and not test:
                    problems.append(f"{path}:{line_of(code, m.start())}: includes the test "
                                    f"file {target} from library code")
                continue
            if target_test and not test and fname not in ("testing",):
                problems.append(f"{path}:{line_of(code, m.start())}: includes the test file "
                                f"{target} from library code")
            if not include_allowed(target, tfolder, allowed):
                problems.append(
                    f"{path}:{line_of(code, m.start())}: includes {target}: {fname}/"
                    f"{' (a test)' if test else ''} may include only "
                    f"{', '.join(sorted(allowed)) or 'nothing of ours'} ({RULES})")
        if not env_read_allowed(path, rules):
            for m in CPP_ENV_READ.finditer(code):
                var = m.group(1) or m.group(2)
                problems.append(f"{path}:{line_of(code, m.start())}: reads {var}: hardware "
                                f"variables are read by discovery only (tpu_runtime/, "
                                f"RankInfo); TPU_DIST_* are allowed")
        if path.endswith(".h"):
            p = guard_problem(path, text)
            if p:
                problems.append(p)
        for m in NAMESPACE_TESTING.finditer(code):
            problems.append(f"{path}:{line_of(code, m.start())}: namespace {m.group(1)}: a "
                            f"namespace named testing shadows GoogleTest's (use test_support)")
    for path in source_files(root, (".py",)):
        if env_read_allowed(path, rules):
            continue
        text = (root / path).read_text(errors="replace")
        for m in PY_ENV_READ.finditer(text):
            var = next(g for g in m.groups() if g)
            problems.append(f"{path}:{line_of(text, m.start())}: reads {var}: hardware variables "
                            f"are read by discovery only (tpu_dist.rank_info(), "
                            f"python/tpu_dist/env.py)")
    for comp in strongly_connected(node_graph):
        problems.append("include cycle between folders: " + " -> ".join(comp + comp[:1]))
    for comp in strongly_connected(file_graph):
        problems.append("include cycle between files (a .h/.cc pair is one unit): "
                        + " -> ".join(comp + comp[:1]))
    problems += rule_problems(rules)
    return Report(problems, node_graph)


def rule_problems(rules: Rules) -> List[str]:
    graph: Dict[str, Set[str]] = {}
    problems = []
    for f in rules.folders.values():
        targets = set(f.may_include) | {t for p in f.parts for t in p.may_include}
        for t in sorted(targets):
            tf = t if t in rules.folders else folder_of(t, rules)
            if tf is None:
                problems.append(f"{RULES}: {f.path} may include {t}, which has no rule")
                continue
            graph.setdefault(f.path, set()).add(tf)
    for comp in strongly_connected(graph):
        problems.append(f"{RULES}: the rules form a cycle: " + " -> ".join(comp + comp[:1]))
    return problems


# ---------------------------------------------------------------- the doc


def _names(items: Iterable[str]) -> str:
    return ", ".join(f"`{i}/`" if "." not in i.rsplit("/", 1)[-1] else f"`{i}`"
                     for i in items) or "nothing of ours"


def render(rules: Rules) -> str:
    lines = ["| folder | files | may include (ours) | notes |", "|---|---|---|---|"]
    for f in rules.folders.values():
        lines.append(f"| `{f.path}/` | all | {_names(f.may_include)} | {f.note} |")
        for p in f.parts:
            files = ", ".join(f"`{g}`" for g in p.files)
            lines.append(f"| | {files} | also {_names(p.may_include)} | {p.note} |")
    tests = _names(rules.tests_may_include)
    patterns = ", ".join(f"`{p}`" for p in rules.test_files)
    lines += ["", f"Test files ({patterns}) may also include {tests} (unless their folder's row "
              "says otherwise) and the test files of the folders they may include.", "",
              "Reads of TPU_* / MEGASCALE_* hardware variables (TPU_DIST_* are the project's own "
              "configuration, allowed anywhere) only in:", ""]
    lines += [f"- `{p}`: {why}" for p, why in rules.env_reads]
    return "\n".join(lines)


def doc_block(doc: str) -> Optional[str]:
    if BEGIN not in doc or END not in doc:
        return None
    return doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def with_block(doc: str, block: str) -> str:
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def doc_problems(rules: Rules, doc_path: Path) -> List[str]:
    if not doc_path.is_file():
        return [f"{doc_path}: missing"]
    block = doc_block(doc_path.read_text())
    if block is None:
        return [f"{doc_path}: no table markers ({BEGIN!r} ... {END!r})"]
    if block != render(rules):
        return [f"{doc_path}: the table differs from {RULES}: run tools/check_layers.py --write"]
    return []


def layered(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Nodes by layer: layer 0 includes nothing, layer k only lower ones."""
    level: Dict[str, int] = {}
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})

    def depth(v: str, seen: Tuple[str, ...] = ()) -> int:
        if v in level:
            return level[v]
        if v in seen:
            return 0  # a cycle: reported elsewhere
        level[v] = 1 + max((depth(t, seen + (v,)) for t in graph.get(v, ())), default=-1)
        return level[v]

    for v in nodes:
        depth(v)
    return [sorted(v for v in nodes if level[v] == k) for k in range(max(level.values(), default=-1) + 1)]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--write", action="store_true", help="re-render the doc's tables")
    ap.add_argument("--graph", action="store_true", help="print the folder graph by layer")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    rules = load_rules(root / RULES)
    if args.write:
        doc = (root / DOC).read_text()
        if doc_block(doc) is None:
            print(f"{DOC}: no table markers", file=sys.stderr)
            return 1
        (root / DOC).write_text(with_block(doc, render(rules)))
    report = check(root, rules)
    if args.graph:
        for k, layer in enumerate(layered(report.node_graph)):
            for node in layer:
                print(f"{k:2d} {node} -> {', '.join(sorted(report.node_graph.get(node, ())))}")
    problems = report.problems + doc_problems(rules, root / DOC)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check_layers: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
