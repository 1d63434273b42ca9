"""The benchmark scripts refuse bad arguments with a one-line reason, never
a traceback; the LangGraph benchmark's large workload runs end to end on
small documents and reports what it stored against the unique bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
STEP_COST = BENCH / "step_cost.py"
LANGGRAPH_BENCH = BENCH / "langgraph_bench.py"


def step_cost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STEP_COST), *args], capture_output=True, text=True, timeout=60)


def langgraph_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LANGGRAPH_BENCH), *args], capture_output=True, text=True, timeout=120)


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


@pytest.mark.parametrize(
    "args, says",
    [
        (["--workload", "large", "--doc-bytes", "65536"], "--doc-bytes must be more than 65536"),
        (["--doc-bytes", "100000"], "--doc-bytes is for --workload large"),
        (["--workload", "huge"], "invalid choice: 'huge'"),
        (["--workload", "large", "--invocations", "0"], "--invocations must be at least 1"),
    ],
)
def test_langgraph_bench_refuses_bad_arguments(args, says):
    out = langgraph_bench(*args)
    assert out.returncode == 2
    assert says in out.stderr
    assert "Traceback" not in out.stderr


def test_langgraph_bench_large_workload_reports_stored_per_unique(tmp_path):
    doc_bytes = 100 * 1024  # over the 64 KiB blob threshold, small enough to be quick
    results = tmp_path / "results.json"
    out = langgraph_bench(
        "--workload", "large", "--invocations", "2", "--doc-bytes", str(doc_bytes),
        "--only", "stock-memory,stock-sqlite,steadfast-sqlite", "--durability", "fsync",
        "--tmpdir", str(tmp_path), "--json", str(results),
    )
    assert out.returncode == 0, out.stderr
    assert "| unique_bytes | stored_per_unique |" in out.stdout
    report = json.loads(results.read_text())
    assert report["workload"] == "large"
    assert report["doc_bytes"] == doc_bytes
    rows = {r["saver"]: r for r in report["results"]}
    assert set(rows) == {"stock-memory", "stock-sqlite", "steadfast-sqlite"}
    for name, r in rows.items():
        assert r["skipped"] is None
        # Two invocations of 12 checkpoints: the input's, the one before the first node, one per node.
        assert r["checkpoints"] == 2 * 12, name
        assert r["unique_bytes"] == 2 * 5 * doc_bytes, name
        # The final state holds the last document.
        assert r["state_bytes"] > doc_bytes, name
    assert rows["stock-memory"]["db_bytes"] == 0
    assert rows["stock-memory"]["stored_per_unique"] is None
    assert "| n/a |" in next(line for line in out.stdout.splitlines() if line.startswith("| stock-memory"))
    for name in ("stock-sqlite", "steadfast-sqlite"):
        # Every document is stored at least once: nothing on disk compresses it away.
        assert rows[name]["stored_per_unique"] >= 1, name
        assert rows[name]["stored_per_unique"] == pytest.approx(
            rows[name]["db_bytes"] / rows[name]["unique_bytes"]
        )
    # The stock saver stores each document with every checkpoint that
    # carries it; Steadfast's keeps it once per thread (the rest of its
    # bytes are the WAL and the small rows).
    assert rows["steadfast-sqlite"]["db_bytes"] < rows["stock-sqlite"]["db_bytes"] / 2
