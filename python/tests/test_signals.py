"""Signals: ``steadfast.signal`` and waits for them (``ctx.wait_for`` in
durable functions, ``Workflow.wait`` in listed ones), on every store: each
wait takes one signal, once, whether it was sent before, during or after it."""

from __future__ import annotations

import pytest

import steadfast


def test_each_wait_takes_one_signal_sent_before_during_or_after_it(store):
    @steadfast.durable("asker")
    async def asker(ctx):
        def work():
            # During the run, before the first wait.
            steadfast.signal(store, "r", "go", {"n": 1}, by="during")
            return 0

        await ctx.step("work", work)
        got = []
        for _ in range(3):
            d = await ctx.wait_for("go")
            got.append([d["data"], d["by"], d["signal"]])
        return got

    out = asker.run("r", store)
    assert out.waiting and out.gate == "go#2"
    # Twice while it waits.
    a = steadfast.signal(store, "r", "go", {"n": 2}, by="ada")
    b = steadfast.signal(store, "r", "go", {"n": 3}, by="bob")
    assert b > a
    # A run with nothing new stops at the same wait; the rest are taken once.
    out = asker.run("r", store)
    assert out.completed, out
    assert out.value == [[{"n": 1}, "during", "go"], [{"n": 2}, "ada", "go"], [{"n": 3}, "bob", "go"]]
    assert out.value == asker.run("r", store).value
    history = steadfast.history(store, "r")
    senders = [h["update"][h["name"]]["by"] for h in history if h["name"].startswith("go")]
    assert senders == ["during", "ada", "bob"]
    with pytest.raises(steadfast.InvalidInput, match="has ended"):
        steadfast.signal(store, "r", "go")


def test_a_listed_wait_and_a_timeout(store):
    wf = steadfast.Workflow("listed").wait("answer", "reply")

    @wf.step("after")
    def after(ctx, state):
        return {"got": state["answer"]["data"]}

    assert steadfast.run("l", wf, store).waiting
    steadfast.signal(store, "l", "reply", [1, 2], by="ada")
    assert steadfast.run("l", wf, store).value["got"] == [1, 2]

    @steadfast.durable("patient")
    async def patient(ctx):
        return await ctx.wait_for("never", timeout=0.2)

    assert patient.run("t", store).waiting
    import time

    time.sleep(0.3)
    out = patient.run("t", store)
    assert out.completed and out.value is None


def test_bad_signals_are_refused_before_anything_is_sent(store):
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.signal(store, "nope", "go")
    wf = steadfast.Workflow("w").wait("answer", "reply")
    assert steadfast.run("b", wf, store).waiting
    for name, data in [("", None), ("go", float("nan")), ("go", {"x": object()})]:
        with pytest.raises((steadfast.InvalidInput, TypeError)):
            steadfast.signal(store, "b", name, data)
    with pytest.raises(TypeError):
        steadfast.Workflow("w").wait("answer", 3)
    # Nothing was kept: the wait still finds none.
    assert steadfast.run("b", wf, store).waiting


def test_hostile_waits_and_signals_are_refused(store):
    wf = steadfast.Workflow("w").wait("answer", "reply")
    assert steadfast.run("h", wf, store).waiting
    for name in ["x" * 201, "a\x07b"]:
        with pytest.raises(steadfast.InvalidInput):
            steadfast.signal(store, "h", name)
    with pytest.raises(TypeError):
        steadfast.signal(store, "h", 5)
    with pytest.raises(steadfast.InvalidInput):
        steadfast.signal(store, "h", "reply", "x" * 70_000)
    deep = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises((steadfast.InvalidInput, ValueError)):
        steadfast.signal(store, "h", "reply", deep)
    for timeout in [-1.0, float("nan"), float("inf"), 10.0**12]:
        with pytest.raises(steadfast.InvalidInput):
            steadfast.run("b", steadfast.Workflow("bad").wait("answer", "reply", timeout=timeout), store)

        def make(t):
            @steadfast.durable("patient")
            async def patient(ctx):
                return await ctx.wait_for("reply", timeout=t)

            return patient

        with pytest.raises(steadfast.InvalidInput):
            make(timeout).run(f"d{timeout}", store)
    # Nothing refused was kept: the wait still finds none.
    assert steadfast.run("h", wf, store).waiting
