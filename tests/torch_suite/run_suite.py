#!/usr/bin/env python3
"""Runs a selection of PyTorch's distributed test suite for one backend.

The suite is `torch.testing._internal.distributed.distributed_test`
(`DistributedTest._DistTestBase` + `TestDistBackend`), run the way
`test/distributed/test_distributed_spawn.py` runs it for Gloo: one test at a
time, each in WORLD_SIZE fresh rank processes that init_process_group over a
FileStore, with BACKEND / WORLD_SIZE / INIT_METHOD / TEMP_DIR in the
environment (suite_cases.py holds the test class and says how a third-party
backend is admitted).

    run_suite.py --backend gloo --world 2 --json out/gloo_w2.json
    run_suite.py --backend tpu_dist --world 3 --select long
    run_suite.py --backend gloo --world 2 --tests 'test_all_reduce_sum*'

Writes a JSON report: per test outcome (passed / failed / skipped / error),
message, duration, how it was gated, and counts. Exit status: 0 when no
selected test failed or errored, 1 otherwise, 2 on a harness problem (unknown
test name, backend that cannot be imported).

The tests run in a child "phase" process (this script with --phase) with the
environment the suite reads at import time; a phase that dies or hangs is
killed with everything it started, the test it was in is reported as an error
and a new phase continues with the rest. For a backend that is not built
into torch, --gates auto (the default) runs the selection with the suite
gating on the backend's own name, then runs again, gated as for Gloo, the
tests the suite skipped only because the name is not "gloo"
(suite_cases.py, TPU_DIST_SUITE_GATES).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

HERE = Path(__file__).resolve().parent
OUTCOMES = ("passed", "failed", "skipped", "error")
BUILTIN_BACKENDS = frozenset({"gloo", "nccl", "mpi", "ucc", "xccl"})

# ---------------------------------------------------------------------------
# Selection. Names are fnmatch patterns over the suite's test names; a pattern
# without wildcards must name an existing test (catches renames on a torch
# upgrade). "ci" is every test that passes on Gloo on a CPU-only machine at
# world 2 and 3 (torch 2.15: 91), by family; it must fit CI: gloo + tpu_dist
# at world 2 and 3 in ~10 min on 2 cores. "long" adds everything else that
# could run on CPU (at world 2/3 most of it skips: group tests want world >= 8,
# most DDP tests 2+ accelerators; run it at --world 4 and 8 too); "all" is
# the whole class.
# ---------------------------------------------------------------------------
CI_FAMILIES: dict[str, list[str]] = {
    "collectives": [
        "test_broadcast",
        "test_broadcast_full_group",
        "test_reduce_sum",
        "test_reduce_max",
        "test_reduce_min",
        "test_reduce_product",
        "test_reduce_sum_twice",
        "test_reduce_full_group_sum",
        "test_reduce_full_group_max",
        "test_reduce_full_group_min",
        "test_reduce_full_group_product",
        "test_all_reduce_sum",
        "test_all_reduce_min",
        "test_all_reduce_max",
        "test_all_reduce_product",
        "test_all_reduce_sum_async",
        "test_all_reduce_sum_complex",
        "test_all_reduce_complex_unsupported_ops",
        "test_all_reduce_full_group_sum",
        "test_all_reduce_full_group_max",
        "test_all_reduce_full_group_min",
        "test_all_reduce_full_group_product",
        "test_all_gather",
        "test_all_gather_complex",
        "test_all_gather_full_group",
        "test_gather",
        "test_gather_checks",
        "test_gather_full_group",
        "test_scatter",
        "test_scatter_checks",
        "test_scatter_complex",
        "test_scatter_full_group",
        "test_sparse_all_reduce_sum",
    ],
    "coalesced": [
        "test_all_reduce_coalesced_sum",
        "test_all_reduce_coalesced_min",
        "test_all_reduce_coalesced_max",
        "test_all_reduce_coalesced_product",
        "test_all_reduce_coalesced_full_group_sum",
        "test_all_reduce_coalesced_full_group_min",
        "test_all_reduce_coalesced_full_group_max",
        "test_all_reduce_coalesced_full_group_product",
        "test_all_reduce_coalesced_max_complex_unsupported",
        "test_all_gather_coalesced_simple",
        "test_all_gather_coalesced_complex",
        "test_all_gather_coalesced_with_empty",
        "test_all_gather_coalesced_full_group",
    ],
    "p2p": [
        "test_send_recv",
        "test_send_recv_with_tag",
        "test_send_recv_any_source",
        "test_isend",
        "test_irecv",
        "test_batch_isend_irecv_gloo",
        "test_batch_isend_irecv_gloo_tags",
        "test_send_recv_autograd_profiler",
        "test_send_recv_torch_profiler",
        "test_send_recv_with_tag_autograd_profiler",
        "test_send_recv_with_tag_torch_profiler",
        "test_send_recv_any_source_autograd_profiler",
        "test_send_recv_any_source_torch_profiler",
        "test_isend_autograd_profiler",
        "test_isend_torch_profiler",
    ],
    "groups": [
        "test_get_backend",
        "test_Backend_enum_class",
        "test_get_rank",
        "test_get_rank_size_group",
        "test_get_rank_size_full_group",
        "test_destroy_group",
        "test_destroy_full_group",
        "test_dump_DDP_relevant_env_vars",
    ],
    "ddp": [
        "test_DistributedDataParallelCPU",
        "test_DistributedDataParallelCPU_grad_is_view",
        "test_DistributedDataParallel_requires_grad",
        "test_static_graph_api_cpu",
        "test_ddp_logging_data_cpu",
        "test_ddp_create_graph",
        "test_accumulate_gradients_no_sync",
        "test_accumulate_gradients_no_sync_allreduce_hook",
        "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
        "test_accumulate_gradients_no_sync_grad_is_view",
        "test_grads_same_across_ranks_with_no_sync",
        "test_get_future",
    ],
    "objects": [
        "test_all_gather_object_default_pg",
        "test_all_gather_object_subgroup",
        "test_scatter_object_list",
    ],
    "barrier": [
        "test_barrier",
        "test_barrier_full_group",
        "test_monitored_barrier_gloo",
        "test_monitored_barrier_gloo_subgroup",
        "test_monitored_barrier_gloo_rank_0_timeout",
    ],
    "timeouts": [
        "test_barrier_timeout_full_group",
        "test_barrier_timeout_global",
    ],
}
LONG_EXTRA: list[str] = [
    "test_broadcast*",
    "test_reduce_*",
    "test_all_reduce_*",
    "test_all_gather*",
    "test_gather*",
    "test_scatter*",
    "test_send_recv*",
    "test_isend*",
    "test_irecv*",
    "test_batch_isend_irecv*",
    "test_barrier*",
    "test_monitored_barrier*",
    "test_new_subgroups*",
    "test_*object*",
    "test_get_*",
    "test_destroy_*",
    "test_dump_DDP_relevant_env_vars",
    "test_DistributedDataParallel*",
    "test_ddp_*",
    "test_accumulate_gradients_no_sync*",
    "test_*static_graph*",
    "test_post_localSGD*",
    "test_*model_averager*",
    "test_average_parameters",
    "test_verify_model_across_rank*",
    "test_output_unused_in_loss*",
    "test_grads_same_across_ranks_with_no_sync",
    "test_undefined_grad_parity_unused_parameters",
    "test_different_graph_across_ranks",
    "test_skip_all_reduce_unused_parameters",
    "test_compute_bucket_assignment_by_size_sparse_error_without_logger",
    "test_stateless_api_with_ddp",
    "test_sync_bn_logged",
]
# Excluded from "long": they need accelerators (and skip only after starting
# the ranks, which costs seconds each on 2 cores).
LONG_EXCLUDE: list[str] = ["*_cuda", "*_cuda_*", "*nccl*", "*_gpu"]


def selection_patterns(select: str) -> tuple[list[str], list[str]]:
    """(patterns, excludes) of a named selection."""
    ci = [p for family in CI_FAMILIES.values() for p in family]
    if select == "ci":
        return ci, []
    if select == "long":
        return ci + LONG_EXTRA, list(LONG_EXCLUDE)
    if select == "all":
        return ["test_*"], []
    if select in CI_FAMILIES:
        return list(CI_FAMILIES[select]), []
    raise ValueError(f"unknown selection {select!r}")


def expand(patterns: list[str], excludes: list[str],
           names: list[str]) -> tuple[list[str], list[str]]:
    """Test names matching the patterns (in pattern order), and unmatched
    exact names."""
    selected: list[str] = []
    unmatched: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits and not any(c in pattern for c in "*?["):
            unmatched.append(pattern)
        for n in hits:
            if n not in seen and not any(fnmatch.fnmatchcase(n, x) for x in excludes):
                seen.add(n)
                selected.append(n)
    return selected, unmatched


# ---------------------------------------------------------------------------
# Phase process: imports the suite for one backend/gates and runs tests,
# appending one JSON line per event to an events file.
# ---------------------------------------------------------------------------
# The header line of a Python exception in a traceback ("ValueError: ...").
_EXC_HEADER = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b")
# Suite timeouts above the default (torch's TIMEOUT_OVERRIDE); the hang watchdog
# waits for them.
SUITE_TIMEOUT_OVERRIDE = {"test_ddp_uneven_inputs": 400, "test_DistributedDataParallel": 500}


def _exception_summary(tb_text: str) -> str:
    """The last exception header of a traceback and the line after it."""
    lines = tb_text.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if _EXC_HEADER.match(lines[i]):
            tail = [ln.strip() for ln in lines[i + 1:i + 3] if ln.strip()]
            text = " ".join([lines[i].strip(), *tail])
            # c10::Error: keep "Exception raised from <fn> at <file:line>", not the
            # C++ stack after it.
            return text.split(" (most recent call first)")[0][:600]
    return tb_text.strip()[-300:]


def _classify(err: tuple[Any, Any, Any], is_failure: bool) -> tuple[str, str, str]:
    """(outcome, message, details) of a unittest failure or error.

    A rank's exception reaches the parent as RuntimeError("Process i exited
    with error code 10 and exception: <traceback>"). An AssertionError in a
    rank (or in the parent, other than the exit-code check) makes the test
    "failed"; any other exception, a timeout, a crash or an unexpected exit
    code "error".
    """
    exc_type, exc, tb = err
    details = "".join(traceback.format_exception(exc_type, exc, tb))
    text = str(exc)
    parts = re.split(r"^Process (\d+) exited with error code \d+ and exception:\n",
                     text, flags=re.M)
    if len(parts) > 1:  # ["", rank, traceback, rank, traceback, ...]
        summaries = [(rank, _exception_summary(rank_tb))
                     for rank, rank_tb in zip(parts[1::2], parts[2::2], strict=False)]
        failed = any(s.startswith("AssertionError") for _, s in summaries)
        message = "; ".join(f"rank {rank}: {s}" for rank, s in summaries)
    else:
        exit_code_check = "Expected exit code" in text
        failed = (is_failure or issubclass(exc_type, AssertionError)) and not exit_code_check
        if exit_code_check:
            m = re.search(r"Expected exit code .*", text)
            message = f"rank 0 exited abnormally: {m.group(0) if m else text}"
        else:
            message = f"{exc_type.__name__}: {text}".strip()
    return ("failed" if failed else "error"), message[:2000], details[-12000:]


class _EventResult(unittest.TestResult):
    """Writes start/end events of every test to a JSON-lines file."""

    def __init__(self, events: TextIO, static: dict[str, str | None], gates: str) -> None:
        super().__init__()
        self._events = events
        self._static = static
        self._gates = gates
        self._t0 = 0.0
        self._done: dict[str, Any] = {}

    def _emit(self, record: dict[str, Any]) -> None:
        self._events.write(json.dumps(record) + "\n")
        self._events.flush()

    @staticmethod
    def _name(test: unittest.TestCase) -> str:
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().startTest(test)
        self._t0 = time.monotonic()
        self._done = {"outcome": "passed", "message": ""}
        self._emit({"event": "start", "test": self._name(test), "time": time.time()})

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._done = {"outcome": "skipped", "message": reason}

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        outcome, message, details = _classify(err, is_failure=True)
        self._done = {"outcome": outcome, "message": message, "details": details}

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        outcome, message, details = _classify(err, is_failure=False)
        self._done = {"outcome": outcome, "message": message, "details": details}

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self._done = {"outcome": "skipped", "message": "expected failure (suite)"}

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._done = {"outcome": "failed", "message": "unexpected success (suite)"}

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().stopTest(test)
        name = self._name(test)
        record = {"event": "end", "test": name, "gates": self._gates,
                  "duration_s": round(time.monotonic() - self._t0, 2), **self._done}
        if record["outcome"] == "skipped":
            record["static_skip"] = self._static.get(name) is not None
        self._emit(record)


def phase_main(args: argparse.Namespace) -> int:
    """Runs inside the phase process (environment prepared by the parent)."""
    events = open(args.events, "a", encoding="utf-8")  # noqa: SIM115
    try:
        import suite_cases
    except Exception as e:  # noqa: BLE001 - reported to the parent
        events.write(json.dumps({"event": "fatal", "message": f"{type(e).__name__}: {e}",
                                 "details": traceback.format_exc()}) + "\n")
        events.close()
        return 3
    names = suite_cases.test_names()
    selected, unmatched = expand(args.patterns, args.exclude or [], names)
    static = {n: suite_cases.static_skip_reason(n) for n in selected}
    events.write(json.dumps({"event": "selected", "tests": selected, "unmatched": unmatched,
                             "versions": suite_cases.versions()}) + "\n")
    events.flush()
    if args.list:
        for n in selected:
            print(n if static[n] is None else f"{n}  [static skip: {static[n]}]")
        return 0
    suite_cases.start_forkserver()
    cls = suite_cases.TestDistBackendWithSpawn
    suite = unittest.TestSuite([cls(n) for n in selected])
    result = _EventResult(events, static, suite_cases.GATE_MODE)
    suite.run(result)
    events.close()
    return 0


# ---------------------------------------------------------------------------
# Parent: runs phases, survives crashes and hangs, merges the results.
# ---------------------------------------------------------------------------
@dataclass
class PhaseResult:
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    selected: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    fatal: str | None = None


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by a kill
    return out


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _phase_env(backend: str, gates: str, world: int, start: str, test_timeout: int,
               tmp: Path, backend_module: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT",
                "TORCH_DISTRIBUTED_DEBUG", "TORCHELASTIC_RUN_ID", "BACKEND"):
        env.pop(key, None)
    (tmp / "barrier").mkdir(parents=True, exist_ok=True)
    (tmp / "test_dir").mkdir(parents=True, exist_ok=True)
    env.update({
        "TPU_DIST_SUITE_BACKEND": backend,
        "TPU_DIST_SUITE_GATES": gates,
        "TPU_DIST_SUITE_START": start,
        "WORLD_SIZE": str(world),
        # Read by the suite at import; setUp then points both at a fresh
        # directory per test. A file:// INIT_METHOD enables
        # test_barrier_timeout_global (as run_test.py's init_file mode).
        "TEMP_DIR": str(tmp),
        "INIT_METHOD": f"file://{tmp}/global_init_file",
        "TMPDIR": str(tmp),
        "MASTER_ADDR": "127.0.0.1",
        "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(test_timeout),
        "OMP_NUM_THREADS": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    if backend_module:
        env["TPU_DIST_SUITE_BACKEND_MODULE"] = backend_module
    return env


def run_phase(*, backend: str, gates: str, world: int, start: str, patterns: list[str],
              excludes: list[str], test_timeout: int, work: Path, log: TextIO,
              backend_module: str | None, verbose: bool) -> PhaseResult:
    """Runs the tests matching patterns in phase processes until all ran."""
    out = PhaseResult()
    pending: list[str] | None = None  # None: not expanded yet
    attempt = 0
    while pending is None or pending:
        attempt += 1
        events_path = work / f"events_{gates}_{attempt}.jsonl"
        tmp = Path(tempfile.mkdtemp(prefix=f"phase_{gates}_{attempt}_", dir=work))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--phase",
               "--events", str(events_path), "--tests",
               *(patterns if pending is None else pending)]
        if pending is None and excludes:
            cmd += ["--exclude", *excludes]
        log.write(f"\n===== phase {gates} #{attempt}: {backend} world {world} ({start})\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=HERE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=_phase_env(backend, gates, world, start, test_timeout, tmp, backend_module))
        killed_for: str | None = None
        seen_lines = 0
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                events = _read_events(events_path)
                for ev in events[seen_lines:]:
                    if verbose and ev.get("event") == "end":
                        print(f"  {ev['outcome']:8s} {ev['duration_s']:6.1f}s  {ev['test']}"
                              + (f"  ({ev['message'][:100]})" if ev["message"] else ""),
                              flush=True)
                seen_lines = len(events)
                running = [e for e in events if e.get("event") in ("start", "end")]
                if running and running[-1]["event"] == "start":
                    age = time.time() - running[-1]["time"]
                    limit = max(test_timeout,
                                SUITE_TIMEOUT_OVERRIDE.get(running[-1]["test"], 0)) + 90
                    if age > limit:
                        killed_for = running[-1]["test"]
                        _kill_group(proc.pid)
                        proc.wait()
        except KeyboardInterrupt:
            _kill_group(proc.pid)
            proc.wait()
            raise
        finally:
            # The phase's ranks, forkserver and anything they started.
            _kill_group(proc.pid)
            shutil.rmtree(tmp, ignore_errors=True)
        events = _read_events(events_path)
        current: str | None = None
        for ev in events:
            kind = ev.get("event")
            if kind == "fatal":
                out.fatal = ev["message"]
                log.write(ev.get("details", "") + "\n")
                return out
            if kind == "selected" and pending is None:
                out.selected = list(ev["tests"])
                out.unmatched = list(ev["unmatched"])
                out.versions = dict(ev.get("versions", {}))
            elif kind == "start":
                current = ev["test"]
            elif kind == "end":
                out.results[ev["test"]] = {k: v for k, v in ev.items()
                                           if k not in ("event", "test")}
                current = None
        if pending is None and not out.selected and not any(
                e.get("event") == "selected" for e in events):
            out.fatal = f"phase process exited with status {proc.returncode} before selecting tests"
            return out
        if current is not None:
            why = ("hung: the phase was killed by the runner's watchdog" if killed_for
                   else f"phase process died (exit status {proc.returncode})")
            out.results[current] = {"outcome": "error", "gates": gates, "duration_s": None,
                                    "message": f"{why}; see the log"}
            if verbose:
                print(f"  error    {current}: {why}", flush=True)
        pending = [n for n in out.selected if n not in out.results]
        if pending and current is None:
            # Exited without starting the next test: do not loop forever.
            for n in pending:
                out.results[n] = {"outcome": "error", "gates": gates, "duration_s": None,
                                  "message": f"not run: phase exited with {proc.returncode}"}
            pending = []
    return out


def _shm_entries() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("torch_", "tpud_"))}
    except OSError:
        return set()


def run_suite(*, backend: str, world: int, patterns: list[str], excludes: list[str],
              gates: str = "auto", start: str = "forkserver", test_timeout: int = 90,
              log_path: Path | None = None, backend_module: str | None = None,
              selection_name: str = "custom", verbose: bool = False) -> dict[str, Any]:
    """Runs the selection; returns the report (see the module docstring)."""
    if gates == "auto":
        phases = ["native"] if backend in BUILTIN_BACKENDS else ["native", "gloo"]
    else:
        phases = [gates]
    shm_before = _shm_entries()
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"torch_suite_{backend}_w{world}_"))
    log_file = log_path or (work / "suite.log")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "backend": backend, "world_size": world, "selection": selection_name,
        "patterns": patterns, "exclude": excludes, "gates": gates, "start_method": start,
        "python": sys.executable, "host": platform.node(), "cpus": os.cpu_count(),
        "log": str(log_file),
    }
    try:
        with open(log_file, "w", encoding="utf-8") as log:
            first = run_phase(backend=backend, gates=phases[0], world=world, start=start,
                              patterns=patterns, excludes=excludes,
                              test_timeout=test_timeout, work=work, log=log,
                              backend_module=backend_module, verbose=verbose)
            report["fatal"] = first.fatal
            report["unmatched"] = first.unmatched
            report["versions"] = first.versions
            results = dict(first.results)
            if first.fatal is None and len(phases) > 1:
                # Tests the suite skipped at import for this backend's name.
                again = [n for n in first.selected
                         if results.get(n, {}).get("static_skip")]
                if again:
                    second = run_phase(backend=backend, gates=phases[1], world=world,
                                       start=start, patterns=again, excludes=[],
                                       test_timeout=test_timeout, work=work, log=log,
                                       backend_module=backend_module, verbose=verbose)
                    if second.fatal:
                        report["fatal"] = second.fatal
                    for n, r in second.results.items():
                        r["native_skip"] = results[n].get("message", "")
                        results[n] = r
            order = first.selected or list(results)
            report["tests"] = {n: results[n] for n in order if n in results}
    finally:
        counts = dict.fromkeys(OUTCOMES, 0)
        for r in report.get("tests", {}).values():
            counts[r["outcome"]] += 1
        report["counts"] = counts
        if log_path is None:
            # Keep the ranks' output only when a test went wrong (a fatal
            # error's message says it all).
            if counts["failed"] or counts["error"]:
                kept = Path(tempfile.gettempdir()) / f"torch_suite_{backend}_w{world}.log"
                shutil.move(str(log_file), kept)
                report["log"] = str(kept)
            else:
                report["log"] = None
        shutil.rmtree(work, ignore_errors=True)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    report["gated_as_gloo"] = sorted(n for n, r in report.get("tests", {}).items()
                                     if r.get("gates") == "gloo" and backend != "gloo")
    leftovers = sorted(_shm_entries() - shm_before)
    report["shm_leftovers"] = leftovers
    return report


def summary_line(report: dict[str, Any]) -> str:
    c = report.get("counts", {})
    return (f"{report['backend']} world {report['world_size']}: "
            f"{c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
            f"{c.get('skipped', 0)} skipped, {c.get('error', 0)} error "
            f"in {report.get('wall_s', 0):.0f} s")


def exit_status(report: dict[str, Any]) -> int:
    if report.get("fatal") or report.get("unmatched"):
        return 2
    c = report["counts"]
    return 1 if c["failed"] or c["error"] else 0


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--select", default="ci",
                   help="ci (default), long, all, or one CI family: "
                        + ", ".join(CI_FAMILIES))
    p.add_argument("--tests", nargs="+", metavar="PATTERN",
                   help="fnmatch patterns of test names (instead of --select)")
    p.add_argument("--exclude", nargs="+", metavar="PATTERN", default=[],
                   help="fnmatch patterns of test names to leave out")
    p.add_argument("--start", choices=("forkserver", "spawn"), default="forkserver",
                   help="how ranks are started: forkserver (default; preloaded, fast) or "
                        "spawn (the suite's own, every rank imports torch)")
    p.add_argument("--test-timeout", type=int, default=90,
                   help="seconds per test before its ranks are killed (default 90; "
                        "the suite's process groups time out after 60)")
    p.add_argument("--backend-module", default=None,
                   help="module whose import registers the backend (default: its name)")
    p.add_argument("--verbose", "-v", action="store_true", help="print each test's outcome")


def resolve_selection(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    if args.tests:
        return list(args.tests), list(args.exclude), "custom"
    patterns, excludes = selection_patterns(args.select)
    return patterns, excludes + list(args.exclude), args.select


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="gloo")
    p.add_argument("--world", type=int, default=2, help="world size (ranks per test)")
    p.add_argument("--gates", choices=("auto", "native", "gloo"), default="auto",
                   help="how the suite gates tests for a non-built-in backend "
                        "(see suite_cases.py); auto = native, then gloo for what "
                        "native skipped at import")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--log", type=Path,
                   help="write the ranks' output here (default: next to --json; without "
                        "either, kept in the temp dir only when something failed)")
    p.add_argument("--list", action="store_true",
                   help="list the selected tests (static skips marked) and exit")
    add_common_args(p)
    # Internal: the phase process.
    p.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.phase:
        args.patterns = args.tests
        return phase_main(args)
    patterns, excludes, name = resolve_selection(args)
    if args.list:
        with tempfile.TemporaryDirectory(prefix="torch_suite_list_") as tmp:
            gates = "native" if args.gates == "auto" else args.gates
            env = _phase_env(args.backend, gates, args.world, args.start,
                             args.test_timeout, Path(tmp), args.backend_module)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", "--list",
                   "--events", str(Path(tmp) / "events.jsonl"), "--tests", *patterns]
            if excludes:
                cmd += ["--exclude", *excludes]
            rc = subprocess.call(cmd, cwd=HERE, env=env)
            for ev in _read_events(Path(tmp) / "events.jsonl"):
                if ev.get("event") == "fatal":
                    print(f"error: {ev['message']}", file=sys.stderr)
                    return 2
            return rc
    log = args.log or (args.json.with_suffix(".log") if args.json else None)
    report = run_suite(backend=args.backend, world=args.world, patterns=patterns,
                       excludes=excludes, gates=args.gates, start=args.start,
                       test_timeout=args.test_timeout, log_path=log,
                       backend_module=args.backend_module, selection_name=name,
                       verbose=args.verbose)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if report.get("fatal"):
        print(f"error: {report['fatal']}", file=sys.stderr)
        return 2
    if report.get("unmatched"):
        print(f"error: no such tests in this torch: {report['unmatched']}", file=sys.stderr)
    for n, r in report["tests"].items():
        if r["outcome"] in ("failed", "error"):
            print(f"{r['outcome'].upper()}: {n}: {r['message'][:300]}")
    if report["shm_leftovers"]:
        print(f"warning: left in /dev/shm: {report['shm_leftovers']}", file=sys.stderr)
    print(summary_line(report))
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(main())
