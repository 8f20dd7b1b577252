#!/usr/bin/env python3
"""Compiler-checked locking: clang's -Wthread-safety over the library.

Runs `clang++-14 -fsyntax-only -Wthread-safety -Werror=thread-safety` on every
library translation unit (an object of a tpu_dist_* library target in
compile_commands.json) that uses absl::Mutex or the ABSL_* lock annotations,
itself or in a header of its own folder that it includes, with that unit's -D/-I/
-isystem/-std flags (the gcc build's other flags are dropped). Syntax only: no
code is generated, so the whole check takes seconds, not a second build.

  tools/thread_safety_check.py [--build-dir build] [--jobs N] [--list]
  tools/thread_safety_check.py --expect-error FILE.cc --cases 1,2,3
      the check's own test: with the flags of a checked unit, FILE.cc must
      compile cleanly as it is and be rejected with a -Wthread-safety error
      with each -DTPU_DIST_WRONG_ACCESS=<case> (tests/thread_safety/
      wrong_access.cc: a guarded member read without its lock, a helper that
      requires the lock called without it, a write after an early unlock).

Exit status: 0 clean, 1 a thread-safety (or other compile) error, 2 setup
problem (no compile_commands.json, no clang). ctest: thread_safety_check and
thread_safety_check_rejects_unlocked_access (label static_check).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What marks a file as annotated (or using a lock the analysis understands).
ANNOTATED = re.compile(r"absl::(Mutex|MutexLock|ReaderMutexLock|WriterMutexLock)\b|ABSL_(GUARDED_BY|PT_GUARDED_BY|EXCLUSIVE_LOCKS_REQUIRED|"
                       r"SHARED_LOCKS_REQUIRED|LOCKS_EXCLUDED|ACQUIRED_AFTER|ACQUIRED_BEFORE)\b")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LIBRARY_OBJECT = re.compile(r"CMakeFiles/tpu_dist_[A-Za-z0-9_]+\.dir/")
CHECK_FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def annotated(source):
    """Whether `source` locks, or may touch what an annotated class of its
    own folder guards: it uses absl::Mutex / MutexLock / the annotations, or
    includes a project header of its own folder that does (a class split
    over several .cc files). Users elsewhere only call such a class's public
    functions, which cannot hold its private mutexes: their units, often the
    costliest (torch, pybind11), are left out."""
    text = read(source)
    if ANNOTATED.search(text):
        return True
    folder = os.path.dirname(source)
    for inc in INCLUDE.findall(text):
        header = os.path.join(ROOT, inc)
        if (os.path.dirname(header) == folder and os.path.isfile(header)
                and ANNOTATED.search(read(header))):
            return True
    return False


def clang_flags(entry):
    """The -D/-I/-isystem/-std/-include flags of one compile command."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    out, i = [], 1
    while i < len(args):
        a = args[i]
        if a in ("-D", "-I", "-isystem", "-include", "-iquote"):
            out += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith(("-D", "-I", "-std=", "-isystem", "-iquote", "-include")) or a == "-pthread":
            out.append(a)
        i += 1
    return out


def find_clang(name):
    clang = shutil.which(name)
    if clang is None:
        sys.exit(f"thread_safety_check: {name} not found (tools/install_deps.sh installs clang-14)")
    return clang


def load_units(build_dir):
    path = os.path.join(build_dir, "compile_commands.json")
    if not os.path.isfile(path):
        print(f"thread_safety_check: no {path} (configure the build first: tools/build.sh)",
              file=sys.stderr)
        sys.exit(2)
    with open(path) as f:
        entries = json.load(f)
    units = {}
    for e in entries:
        src = os.path.normpath(os.path.join(e["directory"], e["file"]))
        obj = e.get("output") or " ".join(e.get("arguments") or [e.get("command", "")])
        if not src.startswith(ROOT + os.sep) or not LIBRARY_OBJECT.search(obj):
            continue
        units[src] = e
    return units


def compile_one(clang, src, flags):
    t0 = time.monotonic()
    p = subprocess.run([clang, *CHECK_FLAGS, *flags, src], cwd=ROOT, capture_output=True, text=True)
    return src, p.returncode, p.stderr, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--clang", default=os.environ.get("TPU_DIST_CLANGXX", "clang++-14"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--list", action="store_true", help="print the checked units and exit")
    ap.add_argument("--expect-error", metavar="FILE.cc")
    ap.add_argument("--cases", default="1", help="with --expect-error: TPU_DIST_WRONG_ACCESS values")
    ap.add_argument("-D", dest="defines", action="append", default=[])
    args = ap.parse_args()

    units = load_units(os.path.abspath(args.build_dir))
    checked = sorted(s for s in units if annotated(s))
    if not checked:
        print("thread_safety_check: no annotated library unit found", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(os.path.relpath(s, ROOT) for s in checked))
        return 0
    clang = find_clang(args.clang)
    extra = [f"-D{d}" for d in args.defines]

    if args.expect_error:
        # The flags of a real checked unit (torch, absl and project include paths).
        flags = clang_flags(units[checked[0]]) + extra
        src = os.path.abspath(args.expect_error)
        rel = os.path.relpath(src, ROOT)
        _, rc, err, _ = compile_one(clang, src, flags)
        if rc != 0 or "warning:" in err:
            sys.stderr.write(err)
            print(f"thread_safety_check: {rel} does not compile cleanly without a wrong access",
                  file=sys.stderr)
            return 1
        for case in [c for c in args.cases.split(",") if c]:
            _, rc, err, _ = compile_one(clang, src, flags + [f"-DTPU_DIST_WRONG_ACCESS={case}"])
            errors = [l for l in err.splitlines() if re.search(r"error: .*\[-Werror,-Wthread-safety", l)]
            if rc == 0 or not errors:
                sys.stderr.write(err)
                print(f"thread_safety_check: {rel} case {case} was NOT rejected with a thread-safety "
                      f"error (exit {rc}): the check would miss this wrong access", file=sys.stderr)
                return 1
            print(f"thread_safety_check: {rel} case {case} rejected as expected: "
                  f"{errors[0].split('error: ', 1)[1]}")
        return 0

    t0 = time.monotonic()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(compile_one, clang, s, clang_flags(units[s]) + extra) for s in checked]
        for f in concurrent.futures.as_completed(futures):
            src, rc, err, secs = f.result()
            rel = os.path.relpath(src, ROOT)
            if rc != 0 or "warning:" in err:
                sys.stderr.write(err)
            if rc != 0:
                failed.append(rel)
            print(f"  {'FAIL' if rc else 'ok  '} {rel} ({secs:.1f} s)")
    print(f"thread_safety_check: {len(checked)} units, {len(failed)} failed, "
          f"{time.monotonic() - t0:.1f} s wall with {args.jobs} jobs")
    if failed:
        print("thread_safety_check: FAILED: " + " ".join(sorted(failed)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
