"""tpu_dist-ray-run's command line and reporting (no Ray cluster: the cluster
runs are tests/ray/test_ray_programs.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tpu_dist import ray_launcher
from tpu_dist.ray_launcher import _describe, _parse, rank_label

ROOT = Path(__file__).resolve().parents[2]
TRUE = shutil.which("true")


def test_rank_labels_have_equal_widths_as_tpurun() -> None:
    assert rank_label(3, 16) == "[rank  3] "
    assert rank_label(15, 16) == "[rank 15] "
    assert rank_label(0, 1) == "[rank 0] "
    assert rank_label(7, 8) == "[rank 7] "


def test_exit_statuses_are_described_with_the_shell_code() -> None:
    killed = _describe(-signal.SIGKILL)
    assert (killed.what, killed.code) == ("killed by SIGKILL", 137)
    failed = _describe(3)
    assert (failed.what, failed.code) == ("exited with status 3", 3)


def test_parse_takes_the_command_after_the_separator() -> None:
    args = _parse(["--topology", "2x2x2", "--accelerator-type", "TPU-V4", "--max-failures", "2",
                   "--env", "A=1", "--env", "B=x=y", "--", "true", "--flag", "--", "x"])
    assert (args.topology, args.accelerator_type, args.max_failures) == ("2x2x2", "TPU-V4", 2)
    assert args.command == [TRUE, "--flag", "--", "x"]  # resolved on PATH, the rest untouched
    assert args.env == {"A": "1", "B": "x=y"}


@pytest.mark.parametrize("argv, message", [
    ([], "no command"),
    (["--"], "no command"),
    (["--", "/nonexistent/binary"], "/nonexistent/binary: not an executable file"),
    (["--", str(ROOT / "README.md")], "README.md: not an executable file"),
    (["--max-failures", "-1", "--", "true"], "--max-failures must be >= 0"),
    (["--env", "NOVALUE", "--", "true"], "--env 'NOVALUE': expected NAME=VALUE"),
])
def test_parse_rejects_bad_command_lines(argv: list, message: str,
                                         capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_console_script_is_installed_and_fails_fast_without_a_command() -> None:
    script = ROOT / ".venv" / "bin" / "tpu_dist-ray-run"
    assert script.exists(), "pip install -e python/ installs the tpu_dist-ray-run console script"
    res = subprocess.run([str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "no command" in res.stderr


def test_module_docstring_names_every_variable_it_sets() -> None:
    doc = ray_launcher.__doc__ or ""
    for name in ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TPU_DIST_JOB_ID",
                 "TPU_DIST_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"):
        assert name in doc
