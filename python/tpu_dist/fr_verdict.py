"""torch's flight-recorder verdict for a launcher (tpu_dist-ray-run).

The Python twin of tpu_runtime/launcher/flight_recorder_verdict.{h,cc}
(tpurun's): where the ranks' dumps go, and the verdict of torch's analyzer
(`python -m torch.distributed.flight_recorder.fr_trace`) on them, cut to the
lines that matter with a one-line headline ("sequence id 3,
tpu_dist:all_reduce: rank 1 never joined it ..."). The analyzer runs as a
subprocess with a timeout: this module never imports torch, and a missing
Python or torch is one line of text, never an exception.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
import time
from typing import List, Mapping, Optional, Sequence

DIR_ENV = "TPU_DIST_FLIGHT_RECORDER_DIR"
SIZE_ENV = "TPU_DIST_FLIGHT_RECORDER_SIZE"
TORCH_PREFIX_ENV = "TORCH_FR_DUMP_TEMP_FILE"
ANALYZER_ENV = "TPU_DIST_FR_ANALYZER"
DEFAULT_FILE_PREFIX = "tpu_dist_fr_rank_"

_MISSING = "Not all ranks joining collective, sequence number: "
_ERRORS = "Collective sequence number: "


@dataclasses.dataclass
class DumpLocation:
    """Rank r's dump is <dir>/<file_prefix><r>."""
    dir: str
    file_prefix: str = DEFAULT_FILE_PREFIX
    set_by_launcher: bool = False  # the launcher sets DIR_ENV for its ranks

    def path(self, rank: int) -> str:
        return os.path.join(self.dir, f"{self.file_prefix}{rank}")


def dump_location(env: Mapping[str, str], job_id: str, attempt: int) -> Optional[DumpLocation]:
    """Where attempt `attempt`'s dumps go, given the ranks' extra variables
    `env`: None when recording is off (TPU_DIST_FLIGHT_RECORDER_SIZE=0); the
    user's TPU_DIST_FLIGHT_RECORDER_DIR or TORCH_FR_DUMP_TEMP_FILE as given;
    else <tmp>/tpu_dist_fr/<job_id>/attempt_<attempt> (set by the launcher)."""
    if env.get(SIZE_ENV) == "0":
        return None
    if env.get(DIR_ENV):
        return DumpLocation(env[DIR_ENV])
    if env.get(TORCH_PREFIX_ENV):
        head, tail = os.path.split(env[TORCH_PREFIX_ENV])
        return DumpLocation(head or ".", tail)
    return DumpLocation(os.path.join(tempfile.gettempdir(), "tpu_dist_fr", job_id,
                                     f"attempt_{attempt}"), set_by_launcher=True)


def analyzer_argv(python: str, where: DumpLocation, incomplete: bool) -> List[str]:
    argv = [python, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", where.file_prefix,
            "--mismatch_cap", "5"]
    if incomplete:
        argv.append("--allow-incomplete-ranks")
    return argv + [where.dir]


def verdict_lines(output: str, max_lines: int) -> List[str]:
    """The analyzer's output without its per-entry warnings and blank lines."""
    kept: List[str] = []
    dropped = 0
    for line in output.splitlines():
        line = line.rstrip()
        if (not line.strip() or line.startswith("unrecognized comm library")
                or line.startswith("tabulate is not installed")
                or line == "collective stack trace:"):
            continue
        if len(kept) < max_lines:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        kept.append(f"... {dropped} more lines")
    return kept


def _rank_set(text: str) -> str:
    inner = text.strip().lstrip("{").rstrip("}")
    return ("ranks " if "," in inner else "rank ") + inner


def verdict_headline(lines: Sequence[str]) -> str:
    """One line for the first problem the analyzer reported ("" if none)."""
    for i, line in enumerate(lines):
        if line.startswith(_MISSING):
            seq, missing = line[len(_MISSING):], True
        elif line.startswith(_ERRORS) and line.endswith(" has errors"):
            seq, missing = line[len(_ERRORS):-len(" has errors")], False
        else:
            continue
        collective = detail = ""
        for field in lines[i + 1:]:
            if field.startswith(_MISSING) or field.startswith(_ERRORS):
                break
            value = field.split(": ", 1)[-1]
            if field.startswith("collective: "):
                collective = value
            elif missing and field.startswith("missing ranks: "):
                detail = (f"{_rank_set(value)} never joined it (behind: stuck before it, "
                          "or in another op)")
            elif not missing and field.startswith("error msg: "):
                detail = value
        return (f"sequence id {seq}{', ' if collective else ''}{collective}: "
                f"{detail or 'see below'}")
    return ""


def flight_recorder_verdict(where: DumpLocation, ranks: Sequence[int], python: str,
                            timeout_s: float) -> List[str]:
    """What the launcher prints (without its prefix); [] when no rank dumped."""
    dumped = [r for r in ranks if os.path.isfile(where.path(r))]
    if not dumped:
        return []
    absent = [r for r in ranks if r not in dumped]
    note = (f"{len(dumped)} of {len(ranks)} ranks dumped to {where.dir}"
            + (f" (none from ranks {', '.join(map(str, absent))})" if absent else ""))
    if not python:
        return [f"{note}; analyzer off (--fr-analyzer none)"]
    argv = analyzer_argv(python, where, bool(absent))
    start = time.monotonic()
    try:
        run = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             errors="replace", timeout=timeout_s, check=False)
    except OSError as e:
        return [f"{note}; no analyzer: cannot run {python} ({e.strerror or e}); give a Python "
                f"with torch in --fr-analyzer or {ANALYZER_ENV}"]
    except subprocess.TimeoutExpired:
        return [f"{note}; the analyzer ({python}) did not finish within {timeout_s:g}s: killed, "
                "no verdict"]
    took = time.monotonic() - start
    if run.returncode != 0:
        if "No module named" in run.stderr:
            return [f"{note}; no analyzer: {python} has no torch.distributed.flight_recorder; "
                    f"give a Python with torch in --fr-analyzer or {ANALYZER_ENV}"]
        tail = verdict_lines(run.stderr, 1000)
        return [f"{note}; the analyzer failed (exit status {run.returncode})"
                + (f": {tail[-1]}" if tail else "")]
    lines = verdict_lines(run.stdout + "\n" + run.stderr, 40)
    headline = verdict_headline(lines) or "the analyzer found no mismatch"
    return ([f"verdict: {headline}"] + [f"  {line}" for line in lines]
            + [f"{note}; torch's analyzer took {took:.1f}s: {' '.join(argv)}"])
