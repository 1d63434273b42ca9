"""The benchmark scripts refuse bad arguments with a one-line reason, never
a traceback; the step-cost benchmark runs every case to its end; the LangGraph benchmark's large workload runs end to end on
small documents and reports what it stored against the unique bytes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
STEP_COST = BENCH / "test_step_cost.py"
LANGGRAPH_BENCH = BENCH / "langgraph_bench.py"


def step_cost(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # From a directory of its own: `python -m pytest` puts the working
    # directory on sys.path, and python/ would import the source tree.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(STEP_COST), *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )


def langgraph_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LANGGRAPH_BENCH), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--step-runs", "0"], "--step-runs 0: it must lie in 1..=100000"),
        (["--step-rounds", "many"], "--step-rounds 'many': not a whole number"),
        (["--step-dir", "/nonexistent/steadfast-bench"], "--step-dir '/nonexistent/steadfast-bench': no such directory"),
        (["--step-dir", "/dev/null"], "--step-dir '/dev/null': no such directory"),
        (["--step-runs", "-3"], "--step-runs -3: it must lie in 1..=100000"),
        (["--step-rounds", "1e9"], "--step-rounds '1e9': not a whole number"),
    ],
)
def test_step_cost_refuses_bad_options(tmp_path, args, says):
    out = step_cost(tmp_path, "--benchmark-disable", *args)
    assert out.returncode == 4, out.stdout + out.stderr
    assert says in out.stderr
    assert "Traceback" not in out.stderr


def test_step_cost_runs_every_case_to_completion(tmp_path):
    # Each case once, untimed: the Rust yardstick and the three Python ways
    # on memory and SQLite, and the hand-off to a thread.
    out = step_cost(tmp_path, "--benchmark-disable", "--step-runs", "2", "--step-dir", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"\b9 passed\b", out.stdout), out.stdout
    assert list(tmp_path.glob("step-cost-*.db")), "no SQLite store was written under --step-dir"


def test_the_rust_yardstick_completes_its_runs_and_bounds_their_number():
    import steadfast
    from steadfast import _native

    store = steadfast.open_store("memory:")
    assert _native._ten_steps_in_rust(store, "y", 3) > 0
    for r in range(3):
        shown = steadfast.show(store, f"y-{r}")
        assert shown["status"] == "completed"
        assert shown["completed"] == [f"s{i}" for i in range(10)]
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(store, "y-3")
    for runs in (0, 1_000_001):
        with pytest.raises(ValueError, match=f"runs is {runs}; it must lie in 1..=1000000"):
            _native._ten_steps_in_rust(store, "y", runs)
    with pytest.raises(OverflowError):
        _native._ten_steps_in_rust(store, "y", -1)
    # Run ids the library refuses: a clear error naming the run, no panic.
    for prefix in ("bad\nid", "x" * 5000):
        with pytest.raises(steadfast.InvalidRunId, match="invalid run id"):
            _native._ten_steps_in_rust(store, prefix, 1)


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
