"""The benchmark scripts refuse bad arguments with a one-line reason, never
a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STEP_COST = Path(__file__).resolve().parent.parent / "bench" / "step_cost.py"


def step_cost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STEP_COST), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--bench", "x", "--reps", "0"], "--reps and --runs must be at least 1"),
        (["--bench", "x", "--runs", "-5"], "--reps and --runs must be at least 1"),
        (["--bench", "x", "--stores", "cosmos"], "unknown store 'cosmos'"),
        (["--bench", "/nonexistent/steadfast-bench", "--reps", "1", "--runs", "1"], "cannot run it"),
        (["--bench", "/bin/false", "--reps", "1", "--runs", "1"], "exited with 1"),
    ],
)
def test_step_cost_refuses_bad_arguments(args, says):
    out = step_cost(*args)
    assert out.returncode != 0
    assert says in out.stderr
    assert "Traceback" not in out.stderr


def test_step_cost_refuses_a_dir_that_is_a_file(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    out = step_cost("--bench", "/bin/false", "--dir", str(plain), "--reps", "1", "--runs", "1")
    assert out.returncode == 2
    assert f"--dir {plain}" in out.stderr
    assert "Traceback" not in out.stderr
