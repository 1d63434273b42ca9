"""Durable functions: ordinary async code whose steps are recorded by name and
replayed on the next call of the same run.

Each test counts the calls of its step functions in a list: a step that is
replayed from the record must not be called again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import re
import threading
import time

import pytest

import steadfast

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def counted(calls, name, value):
    """A step function that records its call and returns ``value``."""

    def fn():
        calls.append(name)
        return value

    return fn


# --------------------------------------------------------------------------
# Input, replay, resume
# --------------------------------------------------------------------------


def test_input_is_recorded_and_replayed(store):
    seen = []
    bodies = []

    @steadfast.durable("greet")
    async def greet(ctx, who):
        bodies.append(1)
        seen.append((who, await ctx.input()))
        await ctx.gate("ok")
        return {"hello": who["name"]}

    assert greet.run("r1", store, {"name": "ada"}).waiting
    steadfast.approve(store, "r1", "ok")
    out = greet.run("r1", store)  # no input: the recorded one is passed
    assert out.completed
    assert out.value == {"hello": "ada"}
    assert seen == [({"name": "ada"}, {"name": "ada"})] * 2
    # A completed run returns its saved value without calling the function,
    # whatever input this call brings.
    again = greet.run("r1", store, {"name": "bob"})
    assert again.value == {"hello": "ada"}
    assert len(bodies) == 2


@pytest.mark.parametrize("value", [None, 5, "text", [1, 2], {"k": [1.5]}], ids=["none", "int", "str", "list", "dict"])
def test_any_json_input(store, value):
    @steadfast.durable("echo")
    async def echo(ctx, inp):
        return {"inp": inp, "again": await ctx.input()}

    assert echo.run("r1", store, value).value == {"inp": value, "again": value}


def test_function_without_input_parameter(store):
    @steadfast.durable("plain")
    async def plain(ctx):
        return await ctx.step("one", lambda: 1)

    assert plain.run("r1", store).value == 1
    assert repr(plain) == "<durable function 'plain'>"
    assert plain.__name__ == "plain"


def test_steps_are_skipped_on_resume(store):
    calls = []

    @steadfast.durable("pipeline")
    async def pipeline(ctx, n):
        a = await ctx.step("double", counted(calls, "double", n * 2))

        async def add_one():
            calls.append("add")
            await asyncio.sleep(0)
            return a + 1

        b = await ctx.step("add", add_one)
        approval = await ctx.gate("review")
        c = await ctx.step("finish", counted(calls, "finish", {"b": b, "approval": approval}))
        return c

    out = pipeline.run("r1", store, 10)
    assert out.waiting and out.gate == "review"
    assert calls == ["double", "add"]
    rec = steadfast.show(store, "r1")
    assert rec["completed"] == ["double", "add"]
    assert rec["state"]["double"] == 20 and rec["state"]["add"] == 21

    steadfast.approve(store, "r1", "review", {"by": "me"})
    out = pipeline.run("r1", store)
    assert out.value == {"b": 21, "approval": {"by": "me"}}
    assert calls == ["double", "add", "finish"]
    assert [h["name"] for h in steadfast.history(store, "r1")] == ["double", "add", "review", "finish"]


def test_a_completed_run_does_not_call_the_function_again(store):
    bodies = []

    @steadfast.durable("once")
    async def once(ctx):
        bodies.append(1)
        return [await ctx.step("s", lambda: "v")]

    assert once.run("r1", store).value == ["v"]
    assert once.run("r1", store).value == ["v"]
    assert bodies == [1]
    assert steadfast.show(store, "r1")["status"] == "completed"


# --------------------------------------------------------------------------
# parallel
# --------------------------------------------------------------------------


def test_parallel_failing_branch_keeps_the_others(store):
    calls = []
    broken = {"p2": True}

    def branch(name):
        def fn():
            calls.append(name)
            if broken.get(name):
                raise RuntimeError(f"branch {name} broke")
            return name.upper()

        return fn

    @steadfast.durable("fan")
    async def fan(ctx):
        before = await ctx.step("before", counted(calls, "before", 0))
        outs = await ctx.parallel([(n, branch(n)) for n in ("p1", "p2", "p3")])
        return {"before": before, "outs": outs}

    with pytest.raises(steadfast.StepFailed, match="branch p2 broke") as e:
        fan.run("r1", store)
    assert "p2" in str(e.value)
    assert sorted(calls) == ["before", "p1", "p2", "p3"]
    rec = steadfast.show(store, "r1")
    assert rec["completed"][0] == "before"
    assert sorted(rec["completed"][1:]) == ["p1", "p3"]
    assert rec["state"]["p1"] == "P1" and rec["state"]["p3"] == "P3"
    assert "p2" not in rec["state"]

    broken["p2"] = False
    calls.clear()
    out = fan.run("r1", store)
    assert out.value == {"before": 0, "outs": ["P1", "P2", "P3"]}
    assert calls == ["p2"]


def test_parallel_branches_run_at_once(store):
    started = []

    def branch(i):
        async def fn():
            started.append(i)
            # Each branch waits until all three have started: only a
            # concurrent run gets past this.
            for _ in range(500):
                if len(started) == 3:
                    return i * 10
                await asyncio.sleep(0.01)
            raise TimeoutError("the branches did not run at once")

        return fn

    @steadfast.durable("concurrent")
    async def concurrent(ctx):
        return await ctx.parallel({f"b{i}": branch(i) for i in range(3)})

    assert concurrent.run("r1", store).value == [0, 10, 20]
    assert sorted(started) == [0, 1, 2]


def test_parallel_empty_and_duplicate(store):
    @steadfast.durable("empty")
    async def empty(ctx):
        return await ctx.parallel([])

    assert empty.run("r1", store).value == []

    @steadfast.durable("dup")
    async def dup(ctx):
        return await ctx.parallel([("p", lambda: 1), ("p", lambda: 2)])

    with pytest.raises(steadfast.InvalidWorkflow, match='"p"'):
        dup.run("r2", store)


# --------------------------------------------------------------------------
# Recorded time and randomness
# --------------------------------------------------------------------------


def test_now_random_uuid_are_stable_across_replay(store):
    seen = []

    @steadfast.durable("det")
    async def det(ctx):
        t = await ctx.now()
        r = await ctx.random()
        u = await ctx.uuid()
        t2 = await ctx.now()
        seen.append((t, r, u, t2))
        await ctx.gate("g")
        return {"t": t.isoformat(), "r": r, "u": u}

    wall = dt.datetime.now(dt.timezone.utc)
    assert det.run("r1", store).waiting
    time.sleep(0.05)
    steadfast.approve(store, "r1", "g")
    out = det.run("r1", store)
    assert out.completed
    assert len(seen) == 2
    assert seen[0] == seen[1]
    t, r, u, t2 = seen[0]
    assert t.tzinfo is not None and t.utcoffset() == dt.timedelta(0)
    assert abs((t - wall).total_seconds()) < 5
    assert t <= t2
    assert isinstance(r, int) and 0 <= r < 2**64
    assert UUID4.match(u), u
    assert out.value == {"t": t.isoformat(), "r": r, "u": u}
    assert steadfast.show(store, "r1")["completed"][:4] == ["__now", "__random", "__uuid", "__now#2"]


def test_random_and_uuid_differ_between_runs(store):
    @steadfast.durable("rnd")
    async def rnd(ctx):
        return [await ctx.random(), await ctx.uuid(), await ctx.uuid()]

    a = rnd.run("r1", store).value
    b = rnd.run("r2", store).value
    assert a != b
    assert a[1] != a[2]


# --------------------------------------------------------------------------
# numbered
# --------------------------------------------------------------------------


def test_numbered_steps_in_a_loop(store):
    calls = []

    @steadfast.durable("loop")
    async def loop(ctx, items):
        out = []
        for i, item in enumerate(items):
            out.append(await ctx.step(ctx.numbered("item"), counted(calls, item, item * 2)))
            if i == 1:
                await ctx.gate("halfway")
        return out

    assert loop.run("r1", store, [1, 2, 3]).waiting
    assert calls == [1, 2]
    steadfast.approve(store, "r1", "halfway")
    out = loop.run("r1", store)
    assert out.value == [2, 4, 6]
    assert calls == [1, 2, 3]
    assert steadfast.show(store, "r1")["completed"] == ["item", "item#2", "halfway", "item#3"]


def test_numbered_counts_per_base(memory_store):
    names = []

    @steadfast.durable("names")
    async def names_fn(ctx):
        names.extend([ctx.numbered("a"), ctx.numbered("b"), ctx.numbered("a"), ctx.numbered("a")])
        return None

    names_fn.run("r1", memory_store)
    assert names == ["a", "b", "a#2", "a#3"]


def test_a_name_used_twice_is_refused(store):
    @steadfast.durable("twice")
    async def twice(ctx):
        await ctx.step("same", lambda: 1)
        return await ctx.step("same", lambda: 2)

    with pytest.raises(steadfast.InvalidWorkflow, match="numbered"):
        twice.run("r1", store)


# --------------------------------------------------------------------------
# Changed code
# --------------------------------------------------------------------------


def test_divergence_raises_workflow_changed_and_accept_changed_goes_on(store):
    calls = []

    @steadfast.durable("agent")
    async def v1(ctx):
        await ctx.step("plan", counted(calls, "plan", "p"))
        await ctx.gate("review")
        return await ctx.step("act", counted(calls, "act", "done"))

    assert v1.run("r1", store).waiting
    before = steadfast.show(store, "r1")

    @steadfast.durable("agent")
    async def v2(ctx):
        await ctx.step("think", counted(calls, "think", "t"))
        await ctx.gate("review")
        return await ctx.step("act", counted(calls, "act", "done"))

    with pytest.raises(steadfast.WorkflowChanged) as e:
        v2.run("r1", store)
    assert "plan" in str(e.value) and "think" in str(e.value)
    assert calls == ["plan"]  # nothing new ran
    assert steadfast.show(store, "r1") == before

    out = v2.run("r1", store, accept_changed=True)
    assert calls == ["plan", "think"]
    assert out.waiting and out.gate == "review"
    assert steadfast.show(store, "r1")["completed"] == ["think"]
    steadfast.approve(store, "r1", "review")
    assert v2.run("r1", store).value == "done"
    assert calls == ["plan", "think", "act"]


def test_a_removed_step_is_a_change_too(store):
    @steadfast.durable("agent")
    async def v1(ctx):
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 2)
        return await ctx.gate("g")

    assert v1.run("r1", store).waiting

    @steadfast.durable("agent")
    async def v2(ctx):
        await ctx.step("a", lambda: 1)
        return await ctx.gate("g")

    with pytest.raises(steadfast.WorkflowChanged):
        v2.run("r1", store)


def test_another_function_name_is_a_change(store):
    @steadfast.durable("first")
    async def first(ctx):
        return await ctx.gate("g")

    @steadfast.durable("second")
    async def second(ctx):
        return await ctx.gate("g")

    assert first.run("r1", store).waiting
    with pytest.raises(steadfast.WorkflowChanged, match="second"):
        second.run("r1", store)
    assert steadfast.show(store, "r1")["workflow"] == "first"


# --------------------------------------------------------------------------
# Exceptions in and out of the function
# --------------------------------------------------------------------------


class Boom(KeyError):
    pass


def test_the_functions_own_exception_propagates_unchanged_and_the_run_resumes(store):
    calls = []
    failing = {"on": True}
    boom = Boom("missing", 42)

    @steadfast.durable("own")
    async def own(ctx):
        a = await ctx.step("a", counted(calls, "a", 1))
        if failing["on"]:
            raise boom
        return a + await ctx.step("b", counted(calls, "b", 2))

    with pytest.raises(KeyError) as e:
        own.run("r1", store)
    assert type(e.value) is Boom
    assert e.value is boom
    assert e.value.args == ("missing", 42)
    assert not isinstance(e.value, steadfast.SteadfastError)
    assert steadfast.show(store, "r1")["completed"] == ["a"]

    failing["on"] = False
    assert own.run("r1", store).value == 3
    assert calls == ["a", "b"]


@pytest.mark.parametrize("exc", [ValueError("v"), ZeroDivisionError("z"), steadfast.InvalidInput("mine")],
                         ids=["ValueError", "ZeroDivisionError", "a-SteadfastError-of-its-own"])
def test_own_exception_types_are_kept(store, exc):
    @steadfast.durable("raiser")
    async def raiser(ctx):
        await ctx.step("a", lambda: 1)
        raise exc

    with pytest.raises(type(exc)) as e:
        raiser.run("r1", store)
    assert e.value is exc


def test_a_failed_step_caught_by_the_function_lets_it_go_on(store):
    calls = []

    def broken():
        calls.append("broken")
        raise ValueError("the API said no")

    @steadfast.durable("catcher")
    async def catcher(ctx):
        try:
            await ctx.step("risky", broken, retries=0)
        except steadfast.StepFailed as e:
            fallback = await ctx.step("fallback", counted(calls, "fallback", str(e)))
            return {"fallback": fallback}
        return {"fallback": None}

    out = catcher.run("r1", store)
    assert out.completed
    assert "ValueError: the API said no" in out.value["fallback"]
    assert calls == ["broken", "fallback"]
    assert steadfast.show(store, "r1")["status"] == "completed"


def test_an_async_step_whose_call_fails_at_once_is_recorded_and_retried(store):
    """A coroutine function called wrongly raises before any coroutine
    exists: the failure is recorded (off the loop) and retried, like any
    step's."""

    async def needs_an_argument(x):
        return x

    @steadfast.durable("fails-at-once")
    async def fails(ctx):
        return await ctx.step("s", needs_an_argument, retries=1, backoff=0)

    with pytest.raises(steadfast.StepFailed, match="TypeError"):
        fails.run("r1", store)
    record = steadfast.show(store, "r1")
    assert record["status"] == "failed"
    assert record["attempts"] == 2, record


def test_step_failures_propagate_as_step_failed(store):
    @steadfast.durable("fails")
    async def fails(ctx):
        return await ctx.step("s", lambda: 1 / 0, retries=0)

    with pytest.raises(steadfast.StepFailed, match="ZeroDivisionError"):
        fails.run("r1", store)
    assert steadfast.show(store, "r1")["status"] == "failed"


def test_step_retries_and_terminal_error(store):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("flake")
        return len(attempts)

    terminal_calls = []

    def fatal():
        terminal_calls.append(1)
        raise steadfast.TerminalError("no way")

    @steadfast.durable("retry")
    async def retry(ctx):
        n = await ctx.step("flaky", flaky, retries=2, backoff=0.01)
        try:
            await ctx.step("fatal", fatal, retries=5, backoff=0.01)
        except steadfast.StepFailed as e:
            return {"n": n, "err": str(e)}

    out = retry.run("r1", store)
    assert out.value["n"] == 3
    assert "no way" in out.value["err"]
    assert attempts == [1, 1, 1]
    assert terminal_calls == [1]


@pytest.mark.asyncio
async def test_step_timeout_cancels_the_coroutine(store):
    flags = {}

    async def slow():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            flags["cancelled"] = True
            raise

    @steadfast.durable("slow")
    async def slow_fn(ctx):
        try:
            await ctx.step("slow", slow, timeout=0.2, retries=0)
        except steadfast.StepFailed as e:
            return str(e)

    started = time.monotonic()
    out = await slow_fn.run_async("r1", store)
    assert time.monotonic() - started < 5
    assert "timed out" in out.value
    for _ in range(100):
        if flags:
            break
        await asyncio.sleep(0.02)
    assert flags == {"cancelled": True}


def test_suspended_is_a_base_exception_and_passes_except_exception(store):
    assert issubclass(steadfast.Suspended, BaseException)
    assert not issubclass(steadfast.Suspended, Exception)
    caught = []

    @steadfast.durable("careless")
    async def careless(ctx):
        try:
            await ctx.gate("g")
        except Exception as e:  # what careless code does; must not swallow the stop
            caught.append(e)
            return "swallowed"
        return "after"

    out = careless.run("r1", store)
    assert out.waiting and out.gate == "g"
    assert caught == []
    steadfast.approve(store, "r1", "g")
    assert careless.run("r1", store).value == "after"


def test_suspended_is_raised_inside_the_function(store):
    raised = []

    @steadfast.durable("observer")
    async def observer(ctx):
        try:
            await ctx.sleep("nap", 60)
        except BaseException as e:
            raised.append(type(e))
            raise
        return "woke"

    out = observer.run("r1", store)
    assert out.sleeping
    assert raised == [steadfast.Suspended]


def test_durable_takes_a_function_but_no_generator():
    def plain(ctx):
        return 1

    assert steadfast.durable("plain")(plain).is_sync
    assert steadfast.durable("lam")(lambda ctx: 1).is_sync

    async def coro(ctx):
        return 1

    assert not steadfast.durable("coro")(coro).is_sync

    async def agen(ctx):
        yield 1

    def gen(ctx):
        yield 1

    for f in (agen, gen):
        with pytest.raises(TypeError, match="generator function"):
            steadfast.durable("gen")(f)
    with pytest.raises(TypeError, match="not a function"):
        steadfast.durable("nothing")(42)


# --------------------------------------------------------------------------
# Gates and timers in durable functions
# --------------------------------------------------------------------------


def test_gate_returns_the_approval_data(store):
    @steadfast.durable("gated")
    async def gated(ctx):
        first = await ctx.gate("first")
        second = await ctx.gate("second")
        return {"first": first, "second": second}

    assert gated.run("r1", store).gate == "first"
    steadfast.approve(store, "r1", "first", {"n": [1, 2]}, by="ada")
    assert gated.run("r1", store).gate == "second"
    steadfast.approve(store, "r1", "second")
    out = gated.run("r1", store)
    assert out.value == {"first": {"n": [1, 2]}, "second": None}
    decisions = steadfast.show(store, "r1")["decisions"]
    assert [(d["gate"], d["approved"]) for d in decisions] == [("first", True), ("second", True)]
    assert decisions[0]["by"] == "ada"
    assert decisions[0]["data"] == {"n": [1, 2]}


def test_rejected_gate_ends_the_function(store):
    after = []

    @steadfast.durable("rej")
    async def rej(ctx):
        await ctx.gate("g")
        after.append(1)
        return "never"

    rej.run("r1", store)
    steadfast.reject(store, "r1", "g", "no budget")
    out = rej.run("r1", store)
    assert out.rejected and out.reason == "no budget" and out.gate == "g"
    assert after == []


def test_gate_timeout_in_a_durable_function(store):
    @steadfast.durable("gt")
    async def gt(ctx):
        return {"data": await ctx.gate("g", timeout=0.3, on_timeout="approve")}

    assert gt.run("r1", store).waiting
    time.sleep(0.45)
    assert gt.run("r1", store).value == {"data": None}


def test_sleep_in_a_durable_function(store):
    calls = []

    @steadfast.durable("sleeper")
    async def sleeper(ctx):
        await ctx.step("before", counted(calls, "before", 1))
        await ctx.sleep("nap", 0.3)
        return await ctx.step("after", counted(calls, "after", 2))

    out = sleeper.run("r1", store)
    assert out.sleeping
    assert out.until.tzinfo is not None
    assert out.until > dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    assert calls == ["before"]
    time.sleep(max(0.0, (out.until - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.1)
    assert sleeper.run("r1", store).value == 2
    assert calls == ["before", "after"]

    started = time.monotonic()
    assert sleeper.run("r2", store, wait_for_timers=True).value == 2
    assert time.monotonic() - started >= 0.29


# --------------------------------------------------------------------------
# Bad names, values and arguments
# --------------------------------------------------------------------------


def test_a_leased_call_that_fails_releases_its_lease(store):
    @steadfast.durable("leased")
    async def v1(ctx):
        await ctx.step("plan", lambda: 1)
        await ctx.gate("review")

    @steadfast.durable("leased")
    async def v2(ctx):
        await ctx.step("other", lambda: 1)

    assert v1.run("r1", store, lease=30).waiting
    with pytest.raises(steadfast.WorkflowChanged):
        v2.run("r1", store, lease=30)
    assert steadfast.show(store, "r1").get("lease") is None, "the lease of a failed call is released"


def test_a_leased_run_is_renewed_while_a_sync_step_runs(store):
    """A step that runs longer than the lease keeps it: the engine renews
    it while the function runs on its own thread."""
    seen = []

    @steadfast.durable("renewed")
    async def f(ctx):
        def slow():
            seen.append(steadfast.show(store, "r1")["lease"]["until"])
            time.sleep(1.0)
            seen.append(steadfast.show(store, "r1")["lease"]["until"])
            return 1

        return await ctx.step("slow", slow)

    assert f.run("r1", store, lease=0.3).value == 1
    assert seen[1] > seen[0], f"the lease was not renewed while the step ran: {seen}"


@pytest.mark.asyncio
async def test_a_cancelled_leased_call_gives_its_lease_up(store):
    @steadfast.durable("cancel-leased")
    async def slow(ctx):
        await ctx.step("a", lambda: 1)
        return await ctx.step("b", lambda: asyncio.sleep(10))

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(slow.run_async("r1", store, lease=30), 0.3)
    for _ in range(200):
        if steadfast.show(store, "r1").get("lease") is None:
            break
        await asyncio.sleep(0.02)
    assert steadfast.show(store, "r1").get("lease") is None, "the lease of a cancelled call is given up"
    assert steadfast.show(store, "r1")["completed"] == ["a"]


@pytest.mark.parametrize("kind", ["step", "gate", "sleep", "parallel"])
def test_reserved_names_are_refused(store, kind):
    @steadfast.durable("reserved")
    async def reserved(ctx):
        if kind == "step":
            return await ctx.step("__mine", lambda: 1)
        if kind == "gate":
            return await ctx.gate("__result")
        if kind == "sleep":
            return await ctx.sleep("__now", 1)
        return await ctx.parallel([("ok", lambda: 1), ("__input", lambda: 2)])

    with pytest.raises(steadfast.InvalidWorkflow, match="reserved"):
        reserved.run("r1", store)
    with pytest.raises(steadfast.NoSuchRun):  # nothing was written
        steadfast.show(store, "r1")


def test_unstorable_step_value_names_its_path(store):
    calls = []

    @steadfast.durable("nan")
    async def nan(ctx):
        return await ctx.step("s", counted(calls, "s", {"x": [1, math.nan]}), retries=3)

    with pytest.raises(steadfast.InvalidValue, match=r"\$\.x\[1\]"):
        nan.run("r1", store)
    assert calls == ["s"]
    assert "s" not in steadfast.show(store, "r1")["state"]


@pytest.mark.parametrize("value, path", [({"x": math.inf}, "$.x"), (object(), "$"), ({1: 2}, "$")],
                         ids=["inf", "object", "int-key"])
def test_unstorable_return_value_is_refused(store, value, path):
    @steadfast.durable("ret")
    async def ret(ctx):
        await ctx.step("s", lambda: 1)
        return value

    with pytest.raises(steadfast.SteadfastError) as e:
        ret.run("r1", store)
    assert f"`{path}`" in str(e.value)
    assert steadfast.show(store, "r1")["status"] != "completed"


def test_bad_step_options(store):
    @steadfast.durable("opts")
    async def opts(ctx, which):
        if which == "timeout":
            return await ctx.step("s", lambda: 1, timeout=-1)
        if which == "nan-timeout":
            return await ctx.step("s", lambda: 1, timeout=math.nan)
        if which == "retries":
            return await ctx.step("s", lambda: 1, retries=-1)
        if which == "sleep":
            return await ctx.sleep("z", -5)
        return await ctx.gate("g", timeout=1, on_timeout="perhaps")

    for i, which in enumerate(["timeout", "nan-timeout", "sleep", "gate"]):
        with pytest.raises(steadfast.InvalidInput):
            opts.run(f"r{i}", store, which)
    with pytest.raises((steadfast.SteadfastError, OverflowError, TypeError, ValueError)):
        opts.run("r-retries", store, "retries")
    assert steadfast.show(store, "r-retries")["completed"] == []


@pytest.mark.parametrize("run_id", ["", "x" * 10_000, "line\nbreak"], ids=["empty", "10k", "newline"])
def test_invalid_run_ids(memory_store, run_id):
    bodies = []

    @steadfast.durable("ids")
    async def ids(ctx):
        bodies.append(1)

    with pytest.raises(steadfast.InvalidRunId):
        ids.run(run_id, memory_store)
    with pytest.raises(steadfast.InvalidRunId):
        ids.run(run_id, memory_store, {"with": "input"})
    assert bodies == []
    assert steadfast.runs(memory_store) == []


# --------------------------------------------------------------------------
# Event loops
# --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_run_inside_a_running_loop_points_to_run_async(store):
    @steadfast.durable("inloop")
    async def inloop(ctx):
        return await ctx.step("s", lambda: 1)

    with pytest.raises(RuntimeError, match="run_async"):
        inloop.run("r1", store)
    with pytest.raises(RuntimeError, match="run_async"):
        steadfast.run("r1", inloop, store)
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(store, "r1")


@pytest.mark.asyncio
async def test_run_async_under_pytest_asyncio(store):
    calls = []

    @steadfast.durable("aio")
    async def aio(ctx, topic):
        async def search():
            calls.append("search")
            await asyncio.sleep(0.01)
            return [f"{topic}-1", f"{topic}-2"]

        docs = await ctx.step("search", search)
        summary = await ctx.step("summarize", counted(calls, "summarize", len(docs)))
        verdict = await ctx.gate("review")
        return {"docs": docs, "summary": summary, "verdict": verdict}

    out = await aio.run_async("r1", store, "rust")
    assert out.waiting
    steadfast.approve(store, "r1", "review", "ship it")
    out = await steadfast.run_async("r1", aio, store)
    assert out.value == {"docs": ["rust-1", "rust-2"], "summary": 2, "verdict": "ship it"}
    assert calls == ["search", "summarize"]


@pytest.mark.asyncio
async def test_cancelling_run_async_leaves_a_resumable_run(store):
    delay = {"s": 10.0}
    flags = {}

    @steadfast.durable("cancel")
    async def cancel(ctx):
        a = await ctx.step("a", lambda: 1)

        async def slow():
            try:
                await asyncio.sleep(delay["s"])
            except asyncio.CancelledError:
                flags["cancelled"] = True
                raise
            return a + 1

        return await ctx.step("b", slow)

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(cancel.run_async("r1", store), 0.3)
    for _ in range(100):
        if flags:
            break
        await asyncio.sleep(0.02)
    assert flags == {"cancelled": True}
    assert steadfast.show(store, "r1")["completed"] == ["a"]
    delay["s"] = 0
    out = await asyncio.wait_for(cancel.run_async("r1", store), 10)
    assert out.value == 2


# A fixed pool of 64 waiter threads once deadlocked at 64 runs: each run
# held a thread for its whole length and each ctx.step needed another.
@pytest.mark.asyncio
@pytest.mark.parametrize("count", [8, 63, 64, 200])
async def test_many_durable_runs_at_once_on_one_loop(memory_store, count):
    @steadfast.durable("many")
    async def many(ctx, n):
        async def work():
            await asyncio.sleep(0.01)
            return n * 2

        return await ctx.step("work", work)

    outs = await asyncio.wait_for(
        asyncio.gather(*(many.run_async(f"r{i:03}", memory_store, i) for i in range(count))), 5
    )
    assert [o.value for o in outs] == [i * 2 for i in range(count)]


def test_runs_on_two_event_loops_at_once_all_settle(memory_store):
    """Each event loop is told of its own finished operations: runs awaited
    on two loops in two threads at once all complete with their own values."""
    import threading

    @steadfast.durable("two-loops")
    async def add(ctx, n):
        total = 0
        for i in range(5):
            total += await ctx.step(f"s{i}", lambda i=i: i)
        return total + n

    results: dict = {}

    def go(tag: str) -> None:
        async def main():
            runs = asyncio.gather(*(add.run_async(f"{tag}-{i}", memory_store, i) for i in range(20)))
            return await asyncio.wait_for(runs, 30)

        results[tag] = asyncio.run(main())

    threads = [threading.Thread(target=go, args=(tag,), daemon=True) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for tag in ("a", "b"):
        assert [o.value for o in results[tag]] == [10 + i for i in range(20)], tag


@pytest.mark.asyncio
async def test_an_operation_finished_before_it_is_awaited_still_settles(memory_store):
    """A native operation whose result is there before the loop watches it
    (the loop was busy) is settled at once, not left waiting."""

    @steadfast.durable("early")
    async def early(ctx):
        pending = ctx._native.random()
        time.sleep(0.2)  # blocks the loop: the engine finishes meanwhile
        first = await steadfast._wait(pending)
        again = await ctx.random()
        return [first, again]

    outcome = await asyncio.wait_for(early.run_async("e1", memory_store), 10)
    assert outcome.completed
    assert all(isinstance(v, int) for v in outcome.value)


@pytest.mark.asyncio
async def test_one_operation_is_awaited_once(memory_store):
    """Awaiting one native operation twice is refused, not left hanging."""

    @steadfast.durable("twice")
    async def twice(ctx):
        pending = ctx._native.random()
        await steadfast._wait(pending)
        with pytest.raises(RuntimeError, match="already awaited"):
            await asyncio.wait_for(steadfast._wait(pending), 5)
        return "ok"

    outcome = await asyncio.wait_for(twice.run_async("t1", memory_store), 10)
    assert outcome.value == "ok"


@pytest.mark.asyncio
async def test_more_runs_at_once_than_the_runtime_has_blocking_threads(memory_store):
    """An async step (and a durable function's body) holds no thread while
    its coroutine runs on the loop: 700 runs at once, more than the engine's
    512 blocking threads, all finish instead of waiting for a thread that
    never comes free."""

    async def slow(i):
        await asyncio.sleep(0.01)
        return i

    @steadfast.durable("crowd")
    async def crowd(ctx, n):
        return await ctx.step("a", lambda: slow(n))

    runs = asyncio.gather(*(crowd.run_async(f"c{i:03}", memory_store, i) for i in range(700)))
    outcomes = await asyncio.wait_for(runs, 60)
    assert [o.value for o in outcomes] == list(range(700))


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["durable", "listed"])
async def test_a_sync_step_runs_off_the_loop_and_beside_other_runs(memory_store, kind):
    """A sync step function runs on a thread of the engine's, never on the
    event loop's: the loop goes on ticking while it blocks, and the sync
    steps of runs started together overlap."""
    spans = []

    def slow(n):
        start = time.monotonic()
        time.sleep(0.2)
        spans.append((start, time.monotonic(), threading.get_ident()))
        return n

    if kind == "durable":

        @steadfast.durable("blocking")
        async def blocking(ctx, n):
            return await ctx.step("slow", lambda: slow(n))

        def start(i):
            return blocking.run_async(f"b{i}", memory_store, i)

    else:
        wf = steadfast.Workflow("blocking")
        wf.step("slow", lambda ctx, state: {"n": slow(1)})

        def start(i):
            return steadfast.run_async(f"b{i}", wf, memory_store)

    ticks = []

    async def ticker():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    loop_thread = threading.get_ident()
    t = asyncio.create_task(ticker())
    try:
        await asyncio.wait_for(asyncio.gather(*(start(i) for i in range(4))), 30)
    finally:
        t.cancel()
    assert len(spans) == 4
    assert all(thread != loop_thread for _, _, thread in spans), "a step ran on the loop's thread"
    first_end = min(end for _, end, _ in spans)
    assert sum(1 for s, _, _ in spans if s < first_end) >= 2, f"the steps ran one after another: {spans}"
    during = [x for x in ticks if spans[0][0] < x < spans[0][1]]
    assert len(during) >= 3, "the loop stood still while a step blocked"


def test_context_calls_made_at_once_are_refused_so_a_resume_can_replay_them(memory_store):
    """Two steps under one asyncio.gather would be recorded in the order they
    end, and every resume would then fail as changed code: the second call is
    refused instead, and steps at once go through ctx.parallel."""

    @steadfast.durable("together")
    async def together(ctx):
        async def slow():
            await asyncio.sleep(0.05)
            return "a"

        return await asyncio.gather(ctx.step("a", slow), ctx.step("b", lambda: "b"))

    with pytest.raises(steadfast.InvalidWorkflow, match="still running"):
        together.run("t1", memory_store)

    @steadfast.durable("in-turn")
    async def in_turn(ctx):
        a = await ctx.step("a", lambda: "a")
        b = await ctx.step("b", lambda: "b")
        both = await ctx.parallel([("c", lambda: "c"), ("d", lambda: "d")])
        await ctx.gate("g")
        return [a, b, *both]

    assert in_turn.run("t2", memory_store).status == "waiting"
    steadfast.approve(memory_store, "t2", "g")
    assert in_turn.run("t2", memory_store).value == ["a", "b", "c", "d"]


def test_a_loop_task_cancels_from_its_loop_from_another_thread_and_not_once_closed():
    """The wrapper of a step's task made on the loop's own thread: the
    engine may drop the step (and cancel the task) from any thread."""
    from steadfast import _LoopTask

    async def forever():
        await asyncio.sleep(3600)

    async def on_the_loop():
        loop = asyncio.get_running_loop()
        here = _LoopTask(loop, loop.create_task(forever()))
        seen = []
        here.add_done_callback(lambda t: seen.append(t.cancelled()))
        here.cancel()  # on the loop's own thread
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert here.task.cancelled() and seen == [True]
        there = _LoopTask(loop, loop.create_task(forever()))
        t = threading.Thread(target=there.cancel)
        t.start()
        t.join()
        assert not there.task.done(), "a cancel from another thread waits for the loop"
        for _ in range(100):
            if there.task.done():
                break
            await asyncio.sleep(0.01)
        assert there.task.cancelled()
        return _LoopTask(loop, loop.create_task(forever()))

    loop = asyncio.new_event_loop()
    left = loop.run_until_complete(on_the_loop())
    loop.close()
    left.cancel()  # a closed loop runs nothing more: no error


def test_async_steps_on_a_loop_with_a_task_factory_of_its_own_go_through_it(memory_store):
    made = []

    def factory(loop, coro, **kwargs):
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    @steadfast.durable("factory")
    async def twice(ctx):
        async def one():
            return 1

        return await ctx.step("a", one) + await ctx.step("b", one)

    async def main():
        asyncio.get_running_loop().set_task_factory(factory)
        return await twice.run_async("r1", memory_store)

    assert asyncio.run(main()).value == 2
    # The durable function's body and each step's coroutine (each in the
    # package's wrapper), besides the loop's own tasks.
    names = [getattr(c, "__qualname__", "") for c in made]
    assert names.count("_invoke.<locals>.wait") == 3, names
