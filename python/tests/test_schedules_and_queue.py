"""Schedules and start options from Python: schedules added, listed and
removed on every store, bad ones refused with what is wrong, a ``steadfast
worker`` for the flow starting one run per slot of a schedule Python added,
and a start's priority and partition recorded and checked.

The worker is ``$STEADFAST_BIN``, else the workspace's
``target/debug/steadfast``; without it that test is skipped, except under
CI (``$CI`` set), where it fails.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

import steadfast


def test_schedules_are_added_listed_and_removed(store_url):
    store = steadfast.open_store(store_url)
    wf = steadfast.Workflow("report")
    wf.step("one", lambda ctx, state: {"one": 1})
    added = steadfast.add_schedule(store, "nightly", wf, "0 2 * * *", tz="Europe/Berlin", input={"k": 1}, catch_up=3)
    assert added["name"] == "nightly"
    assert added["workflow"] == "report"
    assert added["zone"] == "Europe/Berlin"
    assert added["catch_up"] == 3
    assert added["input"] == {"k": 1}
    assert added["next"].endswith(("T01:00:00.000Z", "T00:00:00.000Z"))
    listed = steadfast.schedules(store)
    assert [s["name"] for s in listed] == ["nightly"]
    with pytest.raises(steadfast.InvalidInput, match="exists; remove it first"):
        steadfast.add_schedule(store, "nightly", "report", "* * * * *")
    assert steadfast.remove_schedule(store, "nightly") is True
    assert steadfast.remove_schedule(store, "nightly") is False
    assert steadfast.schedules(store) == []


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"name": "a b"}, "use letters"),
        ({"cron": "61 * * * *"}, "does not parse"),
        ({"cron": "0 0 30 2 *"}, "never matches"),
        ({"tz": "Local/Nowhere"}, "IANA"),
        ({"catch_up": 1001}, "at most 1000"),
        ({"input": [1, 2]}, "JSON object"),
        ({"input": float("nan")}, "input"),
    ],
)
def test_bad_schedules_are_refused_and_nothing_is_written(kwargs, says):
    store = steadfast.open_store("memory:")
    args = {"name": "s", "workflow": "wf", "cron": "* * * * *"}
    args.update(kwargs)
    with pytest.raises(steadfast.InvalidInput, match=says):
        steadfast.add_schedule(store, **args)
    assert steadfast.schedules(store) == []


def test_a_worker_starts_one_run_per_slot_of_a_schedule_python_added(tmp_path, steadfast_cli):
    cli = steadfast_cli
    url = f"sqlite:{tmp_path}/runs.db"
    flow = tmp_path / "tick.toml"
    flow.write_text('name = "tick"\n[[step]]\nname = "log"\nrun = "echo $STEADFAST_RUN_ID >> log"\n')
    store = steadfast.open_store(url)
    steadfast.add_schedule(store, "every", "tick", "* * * * * *", catch_up=0)
    worker = subprocess.Popen(
        [cli, "--store", url, "worker", str(flow), "--poll", "100ms"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while len(steadfast.runs(store, status="completed")) < 2:
            assert time.monotonic() < deadline, steadfast.runs(store)
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=60)
    done = [r["run_id"] for r in steadfast.runs(store, status="completed")]
    assert all(r.startswith("every@") and r.endswith("Z") for r in done), done
    logged = (tmp_path / "log").read_text().split()
    assert sorted(set(logged)) == sorted(logged), "a slot ran twice"
    assert set(done) <= set(logged)


def test_a_start_records_its_priority_and_partition(store_url):
    store = steadfast.open_store(store_url)
    wf = steadfast.Workflow("queued")
    wf.step("one", lambda ctx, state: {"one": 1})
    assert steadfast.start(store, wf, "r1", priority=7, partition="acme") is True
    assert steadfast.start(store, wf, "r1", priority=7, partition="acme") is False
    with pytest.raises(steadfast.InvalidInput, match="priority 7"):
        steadfast.start(store, wf, "r1", priority=1)
    [run] = steadfast.runs(store)
    assert run["queue"] == {"priority": 7, "partition": "acme"}
    for kwargs, says in [({"priority": 1001}, "-1000 to 1000"), ({"partition": "a b"}, "use letters")]:
        with pytest.raises(steadfast.InvalidInput, match=says):
            steadfast.start(store, wf, "r2", **kwargs)
    assert [r["run_id"] for r in steadfast.runs(store)] == ["r1"]
    assert steadfast.run("r1", wf, store).completed
