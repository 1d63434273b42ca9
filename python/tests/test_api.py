"""The package's API with listed workflows: steps, state, retries, timeouts,
gates, timers, the run-reading commands, values refused on the way in, bad
arguments, the exception classes and stores that are not stores.

Most tests run on every store kind (see ``conftest.py``); the ones about
arguments that are refused before anything is stored use a memory store.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time

import pytest

import steadfast
from steadfast import _errors


def one_step(name: str, fn, **options) -> steadfast.Workflow:
    wf = steadfast.Workflow("w")
    wf.step(name, fn, **options)
    return wf


# --------------------------------------------------------------------------
# Steps and state
# --------------------------------------------------------------------------


def test_sync_and_async_steps_merge_updates_key_by_key(store):
    wf = steadfast.Workflow("merge")
    seen = []

    @wf.step("first")
    def first(ctx, state):
        seen.append(dict(state))
        return {"x": 1, "keep": "first", "nested": {"p": 1}}

    @wf.step("second")
    async def second(ctx, state):
        await asyncio.sleep(0)
        seen.append(dict(state))
        return {"y": state["x"] + 1, "keep": "second", "nested": {"q": 2}}

    out = steadfast.run("r1", wf, store)
    assert out.completed and out.status == "completed"
    assert not (out.waiting or out.sleeping or out.rejected)
    # Top-level keys merge; a key's value is replaced whole (no deep merge).
    assert out.state == {"x": 1, "y": 2, "keep": "second", "nested": {"q": 2}}
    assert out.value == out.state
    assert seen == [{}, {"x": 1, "keep": "first", "nested": {"p": 1}}]
    assert steadfast.show(store, "r1")["state"] == out.state


def test_none_update_changes_nothing(store):
    wf = steadfast.Workflow("none")
    wf.step("set", lambda ctx, state: {"a": 1})
    wf.step("nothing", lambda ctx, state: None)
    wf.step("empty", lambda ctx, state: {})
    out = steadfast.run("r1", wf, store)
    assert out.state == {"a": 1}
    hist = steadfast.history(store, "r1")
    assert [h["name"] for h in hist] == ["set", "nothing", "empty"]
    assert [h["update"] for h in hist] == [{"a": 1}, {}, {}]


def test_input_dict_seeds_the_state_and_is_recorded(store):
    wf = steadfast.Workflow("seeded")
    got = []

    @wf.step("read")
    def read(ctx, state):
        got.append(state["question"])
        return {"answer": state["question"].upper(), "n": state["n"] * 2}

    out = steadfast.run("r1", wf, store, {"question": "why", "n": 21})
    assert out.completed
    assert got == ["why"]
    assert out.state["question"] == "why"
    assert out.state["answer"] == "WHY"
    assert out.state["n"] == 42  # the step's update wins over the input's value
    # A later call with another input does not replace the recorded one.
    again = steadfast.run("r1", wf, store, {"question": "other", "n": 1})
    assert again.state == out.state
    assert got == ["why"]


def test_input_must_be_a_dict_without_engine_keys(store):
    wf = one_step("s", lambda ctx, state: None)
    with pytest.raises(steadfast.InvalidInput, match="JSON object"):
        steadfast.run("r1", wf, store, [1, 2])
    with pytest.raises(steadfast.InvalidInput, match="__start"):
        steadfast.run("r2", wf, store, {"__start": 1})
    for run_id in ("r1", "r2"):
        with pytest.raises(steadfast.NoSuchRun):
            steadfast.show(store, run_id)


def _three_steps(calls, two):
    wf = steadfast.Workflow("resume")

    def one(ctx, state):
        calls.append("one")
        return {"one": 1}

    def three(ctx, state):
        calls.append("three")
        return {"three": state["two"] + 1}

    wf.step("one", one)
    wf.step("two", two, retries=0)
    wf.step("three", three)
    return wf


def test_resume_after_a_failed_step_skips_the_done_ones(store):
    calls = []

    def broken(ctx, state):
        calls.append("two-broken")
        raise ConnectionError("the tool is down")

    with pytest.raises(steadfast.StepFailed) as e:
        steadfast.run("r1", _three_steps(calls, broken), store)
    assert "the tool is down" in str(e.value)
    assert "two" in str(e.value)
    assert calls == ["one", "two-broken"]
    rec = steadfast.show(store, "r1")
    assert rec["status"] == "failed"
    assert rec["completed"] == ["one"]
    assert rec["error"]["step"] == "two"
    assert "ConnectionError: the tool is down" in rec["error"]["message"]
    assert steadfast.runs(store, status="failed")[0]["run_id"] == "r1"

    def fixed(ctx, state):
        calls.append("two-fixed")
        return {"two": state["one"] + 1}

    out = steadfast.run("r1", _three_steps(calls, fixed), store)
    assert out.completed
    assert out.state == {"one": 1, "two": 2, "three": 3}
    assert calls == ["one", "two-broken", "two-fixed", "three"]
    assert steadfast.show(store, "r1").get("error") is None


def test_retries_with_backoff_then_success(store):
    attempts = []

    def flaky(ctx, state):
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise TimeoutError(f"flake {len(attempts)}")
        return {"ok": ctx.attempt}

    started = time.monotonic()
    out = steadfast.run("r1", one_step("flaky", flaky, retries=2, backoff=0.01), store)
    assert time.monotonic() - started < 5
    assert out.state == {"ok": 3}
    assert attempts == [1, 2, 3]
    (record,) = steadfast.history(store, "r1")
    assert record["attempt"] == 3
    assert record["name"] == "flaky"


def test_retries_run_out(store):
    attempts = []

    def always(ctx, state):
        attempts.append(ctx.attempt)
        raise ValueError("still broken")

    with pytest.raises(steadfast.StepFailed, match="still broken") as e:
        steadfast.run("r1", one_step("s", always, retries=1, backoff=0.01), store)
    assert attempts == [1, 2]
    assert "2 attempt" in str(e.value)
    assert steadfast.show(store, "r1")["error"]["attempt"] == 2


def test_terminal_error_stops_at_once(store):
    attempts = []

    def fatal(ctx, state):
        attempts.append(ctx.attempt)
        raise steadfast.TerminalError("the account is closed")

    with pytest.raises(steadfast.StepFailed) as e:
        steadfast.run("r1", one_step("pay", fatal, retries=5, backoff=0.01), store)
    assert attempts == [1]
    assert "the account is closed" in str(e.value)
    err = steadfast.show(store, "r1")["error"]
    assert err["terminal"] is True
    assert err["attempt"] == 1
    assert "the account is closed" in err["message"]


def test_timeout_on_a_sync_run_of_an_async_step(store):
    async def slow(ctx, state):
        await asyncio.sleep(10)
        return {"never": True}

    started = time.monotonic()
    with pytest.raises(steadfast.StepFailed, match="timed out") as e:
        steadfast.run("r1", one_step("slow", slow, timeout=0.2, retries=0), store)
    assert time.monotonic() - started < 5
    assert "slow" in str(e.value)
    assert "never" not in steadfast.show(store, "r1")["state"]


@pytest.mark.asyncio
async def test_timeout_cancels_the_step_coroutine(store):
    flags = {}

    async def slow(ctx, state):
        flags["started"] = True
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            flags["cancelled"] = True
            raise
        return {"never": True}

    started = time.monotonic()
    with pytest.raises(steadfast.StepFailed, match="timed out"):
        await steadfast.run_async("r1", one_step("slow", slow, timeout=0.2, retries=0), store)
    assert time.monotonic() - started < 5
    # The loop is still running: only the engine can have cancelled it.
    for _ in range(100):
        if flags.get("cancelled"):
            break
        await asyncio.sleep(0.02)
    assert flags == {"started": True, "cancelled": True}


def test_sync_step_over_its_timeout_fails_and_its_late_result_is_dropped(store):
    def slow(ctx, state):
        time.sleep(0.5)
        return {"late": True}

    with pytest.raises(steadfast.StepFailed, match="timed out"):
        steadfast.run("r1", one_step("slow", slow, timeout=0.1, retries=0), store)
    time.sleep(0.6)
    rec = steadfast.show(store, "r1")
    assert rec["status"] == "failed"
    assert "late" not in rec["state"]
    assert rec["completed"] == []


def test_step_context_attributes(store):
    wf = steadfast.Workflow("ctx")
    seen = []

    def record(ctx, state):
        seen.append((ctx.run_id, ctx.step, ctx.index, ctx.attempt, ctx.idempotency_key))
        assert isinstance(ctx, steadfast.StepContext)
        assert repr(ctx).startswith("StepContext(")

    wf.step("first", record)
    wf.gate("review")
    wf.step("second", record)
    assert steadfast.run("job-7", wf, store).waiting
    steadfast.approve(store, "job-7", "review")
    assert steadfast.run("job-7", wf, store).completed
    assert seen == [
        ("job-7", "first", 0, 1, "job-7/first"),
        ("job-7", "second", 2, 1, "job-7/second"),
    ]


def test_idempotency_key_is_stable_across_attempts(store):
    keys = []

    def flaky(ctx, state):
        keys.append(ctx.idempotency_key)
        if len(keys) < 2:
            raise RuntimeError("again")

    steadfast.run("order-1", one_step("charge", flaky, retries=1, backoff=0.01), store)
    assert keys == ["order-1/charge", "order-1/charge"]


# --------------------------------------------------------------------------
# Gates
# --------------------------------------------------------------------------


def _gated(calls):
    wf = steadfast.Workflow("gated")

    @wf.step("draft")
    def draft(ctx, state):
        calls.append("draft")
        return {"draft": "v1"}

    wf.gate("review")

    @wf.step("publish")
    def publish(ctx, state):
        calls.append("publish")
        return {"published": state["draft"], "approval": state["review"]}

    return wf


def test_gate_waits_then_approval_data_is_merged_under_its_name(store):
    calls = []
    wf = _gated(calls)
    out = steadfast.run("r1", wf, store)
    assert out.waiting and out.status == "waiting"
    assert out.gate == "review"
    assert out.value is None
    assert steadfast.show(store, "r1")["status"] == "waiting"
    # Running again before a decision changes nothing.
    assert steadfast.run("r1", wf, store).gate == "review"
    assert calls == ["draft"]

    saved = steadfast.approve(store, "r1", "review", {"ok": True, "note": "fine"}, by="ada")
    decision = saved["decisions"][-1]
    assert decision["gate"] == "review"
    assert decision["approved"] is True
    assert decision["by"] == "ada"
    assert decision["data"] == {"ok": True, "note": "fine"}

    out = steadfast.run("r1", wf, store)
    assert out.completed
    assert out.state["review"] == {"ok": True, "note": "fine"}
    assert out.state["approval"] == {"ok": True, "note": "fine"}
    assert out.state["published"] == "v1"
    assert calls == ["draft", "publish"]
    rec = steadfast.show(store, "r1")
    assert rec["completed"] == ["draft", "review", "publish"]
    assert [d["by"] for d in rec["decisions"]] == ["ada"]


def test_approval_without_data(store):
    wf = _gated([])
    steadfast.run("r1", wf, store)
    steadfast.approve(store, "r1", "review", by="bo")
    out = steadfast.run("r1", wf, store)
    assert out.completed
    assert out.state["review"] is None
    assert steadfast.show(store, "r1")["decisions"][0]["by"] == "bo"


def test_reject_ends_the_run(store):
    calls = []
    wf = _gated(calls)
    steadfast.run("r1", wf, store)
    saved = steadfast.reject(store, "r1", "review", "too risky", by="bob")
    decision = saved["decisions"][-1]
    assert (decision["approved"], decision["by"], decision["reason"]) == (False, "bob", "too risky")
    out = steadfast.run("r1", wf, store)
    assert out.rejected and out.status == "rejected"
    assert out.gate == "review"
    assert out.reason == "too risky"
    assert steadfast.run("r1", wf, store).rejected
    assert calls == ["draft"]
    assert steadfast.show(store, "r1")["status"] == "rejected"
    with pytest.raises(steadfast.NotWaiting):
        steadfast.approve(store, "r1", "review")


def test_not_waiting_and_no_such_run(store):
    wf = _gated([])
    steadfast.run("r1", wf, store)
    before = steadfast.show(store, "r1")
    with pytest.raises(steadfast.NotWaiting, match="other"):
        steadfast.approve(store, "r1", "other", {"x": 1})
    with pytest.raises(steadfast.NotWaiting):
        steadfast.reject(store, "r1", "other")
    assert steadfast.show(store, "r1") == before

    done = one_step("s", lambda ctx, state: None)
    steadfast.run("r2", done, store)
    with pytest.raises(steadfast.NotWaiting):
        steadfast.approve(store, "r2", "s")

    for call in (
        lambda: steadfast.approve(store, "ghost", "review"),
        lambda: steadfast.reject(store, "ghost", "review"),
        lambda: steadfast.show(store, "ghost"),
        lambda: steadfast.history(store, "ghost"),
    ):
        with pytest.raises(steadfast.NoSuchRun, match="ghost"):
            call()


def test_gate_timeout_approves_by_itself(store):
    wf = steadfast.Workflow("auto")
    wf.gate("review", timeout=0.3, on_timeout="approve")
    wf.step("after", lambda ctx, state: {"after": True, "saw": state["review"]})
    assert steadfast.run("r1", wf, store).waiting
    assert steadfast.run("r1", wf, store).waiting  # not yet
    time.sleep(0.45)
    out = steadfast.run("r1", wf, store)
    assert out.completed
    assert out.state["after"] is True
    assert out.state["saw"] is None
    decision = steadfast.show(store, "r1")["decisions"][-1]
    assert decision["gate"] == "review"
    assert decision["approved"] is True


def test_gate_timeout_rejects_by_default(store):
    wf = steadfast.Workflow("auto")
    wf.gate("review", timeout=0.3)
    wf.step("after", lambda ctx, state: {"after": True})
    assert steadfast.run("r1", wf, store).waiting
    time.sleep(0.45)
    out = steadfast.run("r1", wf, store)
    assert out.rejected
    assert out.gate == "review"
    assert "timed out" in out.reason
    assert "after" not in steadfast.show(store, "r1")["state"]


# --------------------------------------------------------------------------
# Durable timers
# --------------------------------------------------------------------------


def test_sleep_step_returns_sleeping_until_it_fires(store):
    wf = steadfast.Workflow("nap")
    wf.sleep("nap", 0.3)
    wf.step("after", lambda ctx, state: {"after": True})
    before = dt.datetime.now(dt.timezone.utc)
    out = steadfast.run("r1", wf, store)
    assert out.sleeping and out.status == "sleeping"
    assert isinstance(out.until, dt.datetime)
    assert out.until.tzinfo is not None
    assert out.until.utcoffset() == dt.timedelta(0)
    assert before < out.until <= before + dt.timedelta(seconds=5)
    again = steadfast.run("r1", wf, store)
    assert again.sleeping and again.until == out.until  # the timer is not restarted
    assert steadfast.show(store, "r1")["status"] == "sleeping"
    time.sleep(max(0.0, (out.until - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.1)
    done = steadfast.run("r1", wf, store)
    assert done.completed
    assert done.state == {"after": True}


def test_wait_for_timers_sleeps_through(store):
    wf = steadfast.Workflow("nap")
    wf.sleep("nap", 0.2)
    wf.step("after", lambda ctx, state: {"after": True})
    started = time.monotonic()
    out = steadfast.run("r1", wf, store, wait_for_timers=True)
    assert time.monotonic() - started >= 0.19
    assert out.completed
    assert out.state == {"after": True}


# --------------------------------------------------------------------------
# runs(), show(), history(), start()
# --------------------------------------------------------------------------

RUN_KEYS = {"run_id", "workflow", "status", "next", "version", "created_at", "updated_at"}


def _populate(store):
    alpha = steadfast.Workflow("alpha")
    alpha.step("a", lambda ctx, state: {"a": 1})
    gated = steadfast.Workflow("alpha")
    gated.step("a", lambda ctx, state: {"a": 1})
    gated.gate("g")
    beta = steadfast.Workflow("beta")
    beta.step("b", lambda ctx, state: {"b": 1})

    def fail(ctx, state):
        raise ValueError("no")

    broken = steadfast.Workflow("beta")
    broken.step("b", fail, retries=0)
    steadfast.run("a1", alpha, store)
    steadfast.run("a2", gated, store)
    steadfast.run("b1", beta, store)
    with pytest.raises(steadfast.StepFailed):
        steadfast.run("b2", broken, store)


def test_runs_filters_and_pages(store):
    assert steadfast.runs(store) == []
    _populate(store)
    rows = steadfast.runs(store)
    assert [r["run_id"] for r in rows] == ["a1", "a2", "b1", "b2"]
    assert all(set(r) == RUN_KEYS for r in rows)
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["a1"]["status"] == "completed" and by_id["a1"]["workflow"] == "alpha"
    assert by_id["a2"]["status"] == "waiting"
    assert by_id["b2"]["status"] == "failed"
    assert by_id["a1"]["next"] == 1

    def ids(**kw):
        return [r["run_id"] for r in steadfast.runs(store, **kw)]

    assert ids(status="completed") == ["a1", "b1"]
    assert ids(status="waiting") == ["a2"]
    assert ids(status="sleeping") == []
    assert ids(workflow="beta") == ["b1", "b2"]
    assert ids(workflow="beta", status="failed") == ["b2"]
    assert ids(workflow="nope") == []
    assert ids(limit=2) == ["a1", "a2"]
    assert ids(after="a2") == ["b1", "b2"]
    assert ids(after="a1", limit=2) == ["a2", "b1"]


def test_runs_rejects_a_bad_status(store):
    with pytest.raises(steadfast.InvalidInput, match="bogus"):
        steadfast.runs(store, status="bogus")
    with pytest.raises(steadfast.InvalidInput):
        steadfast.runs(store, status="COMPLETED")


def test_show_and_history_shapes(store):
    _populate(store)
    rec = steadfast.show(store, "a2")
    assert {"run_id", "workflow", "status", "state", "completed", "next", "version",
            "created_at", "updated_at"} <= set(rec)
    assert (rec["run_id"], rec["workflow"], rec["status"]) == ("a2", "alpha", "waiting")
    assert rec["completed"] == ["a"]
    assert rec["next"] == 1
    assert rec["state"] == {"a": 1}
    assert isinstance(rec["version"], int)

    (h,) = steadfast.history(store, "a1")
    assert {"index", "name", "update", "attempt", "started_at", "finished_at"} <= set(h)
    assert (h["index"], h["name"], h["update"], h["attempt"]) == (0, "a", {"a": 1}, 1)
    assert steadfast.history(store, "b2") == []


def test_start_records_a_pending_run(store):
    assert steadfast.start(store, "alpha", "p1", {"k": 1}) is True
    assert steadfast.start(store, "alpha", "p1", {"k": 1}) is False
    # The same id with another input or workflow: refused, left as it is.
    with pytest.raises(steadfast.InvalidInput, match="another input"):
        steadfast.start(store, "alpha", "p1", {"k": 2})
    with pytest.raises(steadfast.InvalidInput, match='workflow "alpha"'):
        steadfast.start(store, "beta", "p1", {"k": 1})
    (row,) = steadfast.runs(store, status="pending")
    assert (row["run_id"], row["workflow"]) == ("p1", "alpha")
    wf = steadfast.Workflow("alpha")
    wf.step("double", lambda ctx, state: {"k2": state["k"] * 2})
    out = steadfast.run("p1", wf, store)
    assert out.state["k2"] == 2


def test_a_started_run_is_bound_to_its_steps(store):
    five = steadfast.Workflow("agent")
    for name in ["a", "b", "c"]:
        five.step(name, lambda ctx, state, name=name: {name: 1})
    other = steadfast.Workflow("agent")
    ran = []
    other.step("drop", lambda ctx, state: ran.append("drop") or {})
    assert steadfast.start(store, five, "dup") is True
    with pytest.raises(steadfast.InvalidInput, match="other steps"):
        steadfast.start(store, other, "dup")
    # Another workflow of the same name with other steps: refused before
    # any step runs, even though no step has completed yet.
    with pytest.raises(steadfast.WorkflowChanged, match="started with"):
        steadfast.run("dup", other, store)
    assert ran == []
    assert steadfast.show(store, "dup")["status"] == "pending"
    assert steadfast.run("dup", five, store).completed


def test_changed_listed_workflow(store):
    v1 = steadfast.Workflow("w")
    v1.step("a", lambda ctx, state: {"a": 1})
    v1.gate("g")
    assert steadfast.run("r1", v1, store).waiting
    v2 = steadfast.Workflow("w")
    v2.step("renamed", lambda ctx, state: {"renamed": 1})
    v2.gate("g")
    with pytest.raises(steadfast.WorkflowChanged):
        steadfast.run("r1", v2, store)
    other = steadfast.Workflow("other")
    other.step("a", lambda ctx, state: None)
    with pytest.raises(steadfast.WorkflowChanged, match="other"):
        steadfast.run("r1", other, store)
    assert steadfast.show(store, "r1")["completed"] == ["a"]


# --------------------------------------------------------------------------
# Values refused on the way in
# --------------------------------------------------------------------------


class Opaque:
    pass


BAD_OUTPUTS = [
    pytest.param({"x": math.nan}, "$.x", "NaN", id="nan"),
    pytest.param({"a": [1, {"b": math.inf}]}, "$.a[1].b", "inf", id="inf-nested"),
    pytest.param({"a": {"k": -math.inf}}, "$.a.k", "inf", id="minus-inf"),
    pytest.param({"a": {1: "one"}}, "$.a", "key", id="int-key"),
    pytest.param({"a": {("t",): 1}}, "$.a", "key", id="tuple-key"),
    pytest.param({"big": 2**64}, "$.big", "64 bits", id="int-over-u64"),
    pytest.param({"small": -(2**63) - 1}, "$.small", "64 bits", id="int-under-i64"),
    pytest.param({"s": {1, 2}}, "$.s", "set", id="set"),
    pytest.param({"o": Opaque()}, "$.o", "Opaque", id="object"),
    pytest.param({"b": bytearray(b"raw")}, "$.b", "bytearray", id="bytearray"),
]


@pytest.mark.parametrize("output, path, what", BAD_OUTPUTS)
def test_unstorable_step_output_is_refused_with_its_path(store, output, path, what):
    calls = []

    def produce(ctx, state):
        calls.append(1)
        return output

    with pytest.raises(steadfast.InvalidValue) as e:
        steadfast.run("r1", one_step("produce", produce, retries=3, backoff=0.01), store)
    msg = str(e.value)
    assert f"at `{path}`:" in msg
    assert what in msg
    assert calls == [1]  # a value that cannot be stored is not retried
    rec = steadfast.show(store, "r1")
    assert rec["status"] == "failed"
    assert rec["state"] == {}
    assert path in rec["error"]["message"]


@pytest.mark.parametrize(
    "output, kind", [([1, 2], "a list"), ("text", "a str"), (3, "a number"), (True, "a bool")],
    ids=["list", "str", "int", "bool"],
)
def test_a_step_must_return_a_dict_or_none(store, output, kind):
    with pytest.raises(steadfast.InvalidValue, match="dict of updates or None") as e:
        steadfast.run("r1", one_step("s", lambda ctx, state: output, retries=0), store)
    assert str(e.value).endswith(f"not {kind}")
    assert steadfast.show(store, "r1")["status"] == "failed"


def test_edge_values_round_trip(store):
    value = {
        "u64max": 2**64 - 1,
        "i64min": -(2**63),
        "tuple": (1, "two", None),
        "float": 1.5,
        "negzero": -0.0,
        "unicode": "snö ☃ \U0001f600",
        "ключ": {"nested": [[], {}, [{"deep": False}]]},
        "": "empty key",
    }
    out = steadfast.run("r1", one_step("s", lambda ctx, state: value), store)
    expected = dict(value, tuple=[1, "two", None])
    assert out.state == expected
    assert steadfast.show(store, "r1")["state"] == expected
    assert isinstance(out.state["u64max"], int) and isinstance(out.state["float"], float)


def test_approve_data_that_cannot_be_stored_writes_nothing(store):
    wf = _gated([])
    steadfast.run("r1", wf, store)
    before = steadfast.show(store, "r1")
    with pytest.raises(steadfast.InvalidInput, match=r"\$\.score") as e:
        steadfast.approve(store, "r1", "review", {"score": math.nan})
    assert "nothing was written" in str(e.value)
    with pytest.raises(steadfast.InvalidInput, match="key"):
        steadfast.approve(store, "r1", "review", {1: "x"})
    assert steadfast.show(store, "r1") == before


def test_input_that_cannot_be_stored_writes_nothing(store):
    wf = one_step("s", lambda ctx, state: None)
    with pytest.raises(steadfast.InvalidInput, match=r"\$\.a\[0\]"):
        steadfast.run("r1", wf, store, {"a": [math.inf]})
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(store, "r1")


# --------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [-1.0, math.nan, math.inf, 0.0, 1e300])
def test_bad_step_timeout_is_refused(memory_store, timeout):
    wf = one_step("s", lambda ctx, state: None, timeout=timeout)
    with pytest.raises(steadfast.SteadfastError, match="timeout"):
        steadfast.run("r1", wf, memory_store)
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(memory_store, "r1")


@pytest.mark.parametrize("lease", [-1.0, math.nan, math.inf, 0.0, 0.01, 2 * 86400.0])
def test_a_lease_out_of_range_is_refused_before_anything_runs(memory_store, lease):
    ran = []
    wf = one_step("s", lambda ctx, state: ran.append(1))
    with pytest.raises(steadfast.InvalidInput, match="lease"):
        steadfast.run("r1", wf, memory_store, {"x": 1}, lease=lease)  # an input is written first
    assert not ran
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(memory_store, "r1")


def test_a_lease_is_taken_while_steps_run_and_released_after(store):
    seen = []

    def look(ctx, state):
        seen.append(steadfast.show(store, "r1").get("lease"))

    steadfast.run("r1", one_step("s", look), store, lease=30)
    assert seen[0] is not None and seen[0]["owner"], "the run is leased while a step runs"
    assert steadfast.show(store, "r1").get("lease") is None, "the lease is released when the call returns"
    steadfast.run("r2", one_step("s", look), store)
    assert seen[1] is None, "without lease= there is none, as in the Rust library"


def test_negative_step_timeout_is_invalid_input(memory_store):
    with pytest.raises(steadfast.InvalidInput, match="timeout"):
        steadfast.run("r1", one_step("s", lambda c, s: None, timeout=-0.5), memory_store)


@pytest.mark.parametrize("option", [dict(backoff=-1), dict(max_backoff=math.nan), dict(backoff=math.inf)])
def test_bad_backoff_is_refused(memory_store, option):
    with pytest.raises(steadfast.InvalidInput, match="backoff"):
        steadfast.run("r1", one_step("s", lambda c, s: None, **option), memory_store)


@pytest.mark.parametrize("retries", [-1, 2**32, 2**70, 10**6])
def test_bad_retries_raise_without_crashing(memory_store, retries):
    calls = []
    wf = one_step("s", lambda c, s: calls.append(1), retries=retries)
    with pytest.raises((steadfast.SteadfastError, OverflowError, TypeError, ValueError)):
        steadfast.run("r1", wf, memory_store)
    assert calls == []
    # The interpreter and the store are fine afterwards.
    assert steadfast.run("r2", one_step("s", lambda c, s: {"ok": 1}), memory_store).state == {"ok": 1}


@pytest.mark.parametrize("run_id", ["", "x" * 10_000, "a\nb", "nul\0"], ids=["empty", "10k", "newline", "nul"])
def test_invalid_run_ids(memory_store, run_id):
    wf = one_step("s", lambda c, s: None)
    calls = [
        lambda: steadfast.run(run_id, wf, memory_store),
        lambda: steadfast.show(memory_store, run_id),
        lambda: steadfast.history(memory_store, run_id),
        lambda: steadfast.approve(memory_store, run_id, "g"),
        lambda: steadfast.start(memory_store, "w", run_id),
    ]
    for call in calls:
        with pytest.raises(steadfast.InvalidRunId):
            call()
    assert steadfast.runs(memory_store) == []


def test_duplicate_step_names(memory_store):
    wf = steadfast.Workflow("dup")
    wf.step("a", lambda c, s: None)
    wf.step("a", lambda c, s: None)
    with pytest.raises(steadfast.InvalidWorkflow, match='"a"'):
        steadfast.run("r1", wf, memory_store)
    wf = steadfast.Workflow("dup")
    wf.step("a", lambda c, s: None)
    wf.gate("a")
    with pytest.raises(steadfast.InvalidWorkflow):
        steadfast.run("r2", wf, memory_store)
    assert steadfast.runs(memory_store) == []


@pytest.mark.parametrize("name", ["", "tab\there"], ids=["empty", "control-char"])
def test_invalid_step_names(memory_store, name):
    with pytest.raises(steadfast.InvalidWorkflow):
        steadfast.run("r1", one_step(name, lambda c, s: None), memory_store)


def test_invalid_workflow_name(memory_store):
    wf = steadfast.Workflow("")
    wf.step("a", lambda c, s: None)
    with pytest.raises(steadfast.InvalidWorkflow):
        steadfast.run("r1", wf, memory_store)


def test_bad_gate_and_sleep_arguments(memory_store):
    wf = steadfast.Workflow("w")
    wf.gate("g", timeout=1, on_timeout="maybe")
    with pytest.raises(steadfast.InvalidInput, match="maybe"):
        steadfast.run("r1", wf, memory_store)
    wf = steadfast.Workflow("w")
    wf.gate("g", timeout=-1)
    with pytest.raises(steadfast.InvalidInput, match="timeout"):
        steadfast.run("r2", wf, memory_store)
    wf = steadfast.Workflow("w")
    wf.sleep("z", math.nan)
    with pytest.raises(steadfast.InvalidInput, match="sleep"):
        steadfast.run("r3", wf, memory_store)
    assert steadfast.runs(memory_store) == []


def test_python_side_type_errors(memory_store):
    wf = steadfast.Workflow("w")
    with pytest.raises(TypeError, match="not callable"):
        wf.step("a", 42)
    with pytest.raises(TypeError, match="Workflow"):
        steadfast.run("r1", "not a workflow", memory_store)
    assert wf.step_names == []


def test_workflow_describes_itself():
    wf = steadfast.Workflow("w")
    wf.step("a", lambda c, s: None)
    assert wf.gate("g") is wf
    assert wf.sleep("z", 1) is wf
    assert wf.step_names == ["a", "g", "z"]
    assert repr(wf) == "Workflow('w', steps=['a', 'g', 'z'])"


# --------------------------------------------------------------------------
# Event loops
# --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_run_inside_a_running_loop_points_to_run_async(store):
    wf = one_step("s", lambda c, s: {"ok": 1})
    with pytest.raises(RuntimeError, match="run_async"):
        steadfast.run("r1", wf, store)
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(store, "r1")
    out = await steadfast.run_async("r1", wf, store)
    assert out.state == {"ok": 1}


@pytest.mark.asyncio
async def test_run_async_with_async_steps_and_a_gate(store):
    wf = steadfast.Workflow("aio")

    @wf.step("fetch")
    async def fetch(ctx, state):
        await asyncio.sleep(0.01)
        return {"docs": ["a", "b"]}

    wf.gate("review")

    @wf.step("write")
    async def write(ctx, state):
        return {"report": f"{len(state['docs'])} docs, {state['review']['ok']}"}

    assert (await steadfast.run_async("r1", wf, store)).waiting
    steadfast.approve(store, "r1", "review", {"ok": "yes"})
    out = await steadfast.run_async("r1", wf, store)
    assert out.state["report"] == "2 docs, yes"


@pytest.mark.asyncio
async def test_many_listed_runs_at_once(memory_store):
    wf = steadfast.Workflow("many")

    @wf.step("s")
    async def s(ctx, state):
        await asyncio.sleep(0.01)
        return {"id": ctx.run_id}

    outs = await asyncio.wait_for(
        asyncio.gather(*(steadfast.run_async(f"r{i:03}", wf, memory_store) for i in range(80))), 30
    )
    assert [o.state["id"] for o in outs] == [f"r{i:03}" for i in range(80)]


# --------------------------------------------------------------------------
# Exception classes, stores that are not stores
# --------------------------------------------------------------------------


def test_exception_hierarchy():
    names = set(_errors.__all__) - {"TerminalError", "Suspended"}
    assert names, "no exception classes exported"
    for name in names:
        cls = getattr(steadfast, name)
        assert issubclass(cls, steadfast.SteadfastError), name
        assert issubclass(cls, Exception), name
    for name in ("Conflict", "Corrupt", "TooLarge", "OutcomeUnknown", "Unavailable", "Unsupported", "NotFound"):
        assert issubclass(getattr(steadfast, name), steadfast.StoreFailure), name
    assert issubclass(steadfast.TerminalError, Exception)
    assert not issubclass(steadfast.TerminalError, steadfast.SteadfastError)
    assert issubclass(steadfast.Suspended, BaseException)
    assert not issubclass(steadfast.Suspended, Exception)
    assert set(_errors.__all__) <= set(steadfast.__all__)


def test_unknown_store_scheme(tmp_path):
    with pytest.raises(steadfast.Unsupported, match="bogus"):
        steadfast.open_store("bogus:x")


def test_sqlite_on_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "runs.db"
    garbage = b"this is not a database\x00\xff" * 200
    path.write_bytes(garbage)
    with pytest.raises(steadfast.Corrupt):
        steadfast.open_store(f"sqlite:{path}")
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b"\xff\xfe garbage"],
                         ids=["broken-json", "empty", "array", "binary"])
def test_file_store_on_a_file_that_is_not_a_store(tmp_path, content):
    path = tmp_path / "runs.json"
    path.write_bytes(content)
    wf = one_step("s", lambda c, s: {"x": 1})
    # Opening may succeed (the file is read when used); the first use must
    # raise Corrupt and leave the file as it was.
    with pytest.raises(steadfast.Corrupt):
        store = steadfast.open_store(f"file:{path}")
        steadfast.runs(store)
    with pytest.raises(steadfast.Corrupt):
        steadfast.run("r1", wf, steadfast.open_store(f"file:{path}"))
    assert path.read_bytes() == content


def test_file_and_sqlite_stores_persist_across_opens(tmp_path):
    for url in (f"file:{tmp_path}/runs.json", f"sqlite:{tmp_path}/runs.db"):
        wf = _gated([])
        steadfast.run("r1", wf, steadfast.open_store(url))
        steadfast.approve(steadfast.open_store(url), "r1", "review", {"ok": 1})
        out = steadfast.run("r1", wf, steadfast.open_store(url))
        assert out.completed, url
        assert out.state["review"] == {"ok": 1}


def test_memory_stores_are_separate():
    a, b = steadfast.open_store("memory:"), steadfast.open_store("memory:")
    assert steadfast.start(a, "w", "r1") is True
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(b, "r1")
    assert a.url == "memory:"


def test_backends_come_from_the_library_list():
    names = [b["name"] for b in steadfast.backends()]
    assert "sqlite" in names and "memory" in names
    for b in steadfast.backends():
        assert b["schemes"] and b["url"] and b["summary"]
    assert steadfast.DEFAULT_STORE_URL.startswith("sqlite:")
