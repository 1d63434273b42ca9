"""A Python agent process SIGKILLed mid-run resumes with no step skipped and
none repeated but the ones in flight when it died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import steadfast

AGENT = Path(__file__).resolve().parents[1] / "examples" / "agent.py"


def events(log: Path):
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def agent(store_url: str, log: Path, delay: float, lease: float = 30.0) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable, str(AGENT), "--store", store_url, "--run-id", "killed", "--delay", str(delay),
            "--log", str(log), "--lease", str(lease),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def reference(tmp_path: Path):
    """The answer and the steps of a run that nobody kills."""
    log = tmp_path / "reference.log"
    p = agent(f"sqlite:{tmp_path}/reference.db", log, 0.0)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    steps = [e["step"] for e in events(log) if e["event"] == "start"]
    assert len(steps) == len(set(steps)), "an uninterrupted run runs each step once"
    return json.loads(out), set(steps)


@pytest.mark.parametrize("kill_after", [1, 4, 7, 9])
def test_sigkill_mid_run_resumes_without_skipping_or_repeating(tmp_path: Path, kill_after: int) -> None:
    answer, all_steps = reference(tmp_path)
    assert len(all_steps) == 9  # 4 model calls, 5 tool calls
    url = f"sqlite:{tmp_path}/runs.db"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"

    p = agent(url, first_log, 0.15)
    deadline = time.monotonic() + 30
    while sum(e["event"] == "start" for e in events(first_log)) < kill_after:
        assert p.poll() is None, f"the agent ended before it was killed: {p.communicate()}"
        assert time.monotonic() < deadline, "the agent did not get going"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    assert p.returncode == -signal.SIGKILL

    store = steadfast.open_store(url)
    record = steadfast.show(store, "killed")
    assert record["status"] != "completed"
    done_before = set(record["completed"])
    started_before = {e["step"] for e in events(first_log) if e["event"] == "start"}
    in_flight = started_before - done_before
    assert done_before <= started_before
    assert in_flight, "the kill landed while a step was running"
    del store

    p = agent(url, second_log, 0.0)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out) == answer

    rerun = [e["step"] for e in events(second_log) if e["event"] == "start"]
    assert len(rerun) == len(set(rerun)), f"a step ran twice after the resume: {rerun}"
    assert not (set(rerun) & done_before), "a step that had finished before the kill ran again"
    assert in_flight <= set(rerun), "a step cut off by the kill was skipped"
    assert done_before | set(rerun) == all_steps, "a step was skipped"

    store = steadfast.open_store(url)
    history = [h["name"] for h in steadfast.history(store, "killed")]
    assert sorted(n for n in history if not n.startswith("__")) == sorted(all_steps)


def test_a_second_process_on_the_same_run_is_held_and_the_first_finishes(tmp_path: Path) -> None:
    answer, all_steps = reference(tmp_path)
    url = f"sqlite:{tmp_path}/runs.db"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    # Each step of the first takes 1 s: the second process has seconds to
    # start, even on a loaded machine, before the first could be done.
    first = agent(url, first_log, 1.0)
    deadline = time.monotonic() + 30
    while not any(e["event"] == "start" for e in events(first_log)):
        assert first.poll() is None, f"the agent ended early: {first.communicate()}"
        assert time.monotonic() < deadline, "the agent did not get going"
        time.sleep(0.01)

    second = agent(url, second_log, 0.0)
    out, err = second.communicate(timeout=60)
    assert second.returncode != 0, f"a second runner of a held run went on: {out}"
    assert "steadfast.Held" in err and "killed" in err, err
    assert not events(second_log), "the refused process ran a step"

    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert json.loads(out) == answer
    started = [e["step"] for e in events(first_log) if e["event"] == "start"]
    assert sorted(started) == sorted(all_steps), "each step ran once, in the first process"


def test_without_a_lease_a_second_process_runs_too_and_the_slower_one_gets_conflict(tmp_path: Path) -> None:
    answer, all_steps = reference(tmp_path)
    url = f"sqlite:{tmp_path}/runs.db"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    # The first stays 5 s in its first step: the second runs the whole run
    # meanwhile, and the first's save at the end of that step then conflicts.
    first = agent(url, first_log, 5.0, lease=0)
    deadline = time.monotonic() + 30
    while not any(e["event"] == "start" for e in events(first_log)):
        assert first.poll() is None, f"the agent ended early: {first.communicate()}"
        assert time.monotonic() < deadline, "the agent did not get going"
        time.sleep(0.01)

    second = agent(url, second_log, 0.0, lease=0)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert json.loads(out) == answer

    out, err = first.communicate(timeout=60)
    assert first.returncode != 0, f"the slower process went on past the other's checkpoints: {out}"
    assert "steadfast.Conflict" in err, err
    store = steadfast.open_store(url)
    record = steadfast.show(store, "killed")
    assert record["status"] == "completed"
    history = [h["name"] for h in steadfast.history(store, "killed")]
    assert sorted(n for n in history if not n.startswith("__")) == sorted(all_steps)
