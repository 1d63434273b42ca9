"""Child runs from Python: ``ctx.child`` and ``ctx.children`` in durable
functions and ``Workflow.child`` in listed ones, on every store. A parent
waits without a process; each child runs once; its result is recorded as
the parent's step; a failed child fails the parent's step after the retries
asked for; bad children are refused before anything is written."""

from __future__ import annotations

import math

import pytest

import steadfast


def make_child(counts):
    @steadfast.durable("shout")
    async def shout(ctx, word):
        def work():
            counts[word] = counts.get(word, 0) + 1
            if word.startswith("bad") and counts[word] <= 1:
                raise RuntimeError(f"{word} failed on try {counts[word]}")
            return word.upper()

        return await ctx.step("work", work, retries=0)

    return shout


def test_a_parent_waits_for_its_children_and_gets_their_results(store):
    counts = {}
    shout = make_child(counts)

    @steadfast.durable("parent")
    async def parent(ctx):
        one = await ctx.child("first", "shout", "a")
        rest = await ctx.children([("b", "shout", "b"), ("c", "shout", "c")], at_once=1)
        return [one] + rest

    out = parent.run("p", store)
    assert out.waiting and out.gate == "first"
    assert steadfast.show(store, "p").get("lease") is None
    assert shout.run(steadfast.child_id("p", "first"), store).value == "A"
    out = parent.run("p", store)
    # At most one at a time: "c" is not started until "b" ends.
    assert out.waiting and out.gate == "b"
    assert steadfast.show(store, steadfast.child_id("p", "b"))["status"] == "pending"
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(store, steadfast.child_id("p", "c"))
    shout.run(steadfast.child_id("p", "b"), store)
    assert parent.run("p", store).waiting
    shout.run(steadfast.child_id("p", "c"), store)
    out = parent.run("p", store)
    assert out.completed and out.value == ["A", "B", "C"]
    assert parent.run("p", store).value == ["A", "B", "C"]
    assert counts == {"a": 1, "b": 1, "c": 1}
    history = steadfast.history(store, "p")
    assert {h["name"]: h["update"]["__child"] for h in history if "__child" in h["update"]} == {
        w: steadfast.child_id("p", w) for w in ["first", "b", "c"]
    }
    child = steadfast.show(store, steadfast.child_id("p", "b"))
    assert (child["state"]["__parent"]["run"], child["state"]["__parent"]["step"]) == ("p", "b")


def test_a_listed_child_step_and_a_failed_child(store):
    inner = steadfast.Workflow("inner")

    @inner.step("read")
    def read(ctx, state):
        # Its state with a change: the engine's keys in it (`__parent`) are
        # dropped, not refused.
        assert state["__parent"]["run"] == "o"
        return {**state, "notes": "about " + state["topic"]}

    outer = steadfast.Workflow("outer")

    @outer.step("plan")
    def plan(ctx, state):
        return {"topic": "tides"}

    outer.child("research", "inner")

    assert steadfast.run("o", outer, store).waiting
    assert steadfast.run(steadfast.child_id("o", "research"), inner, store).completed
    out = steadfast.run("o", outer, store)
    assert out.completed
    assert out.value["research"] == {"topic": "tides", "notes": "about tides"}

    counts = {}
    shout = make_child(counts)

    @steadfast.durable("fragile")
    async def fragile(ctx, retries):
        return await ctx.child("x", "shout", "bad-x", retries=retries)

    # Without retries the child's failure fails the step, naming the child.
    assert fragile.run("f0", store, input=0).waiting
    with pytest.raises(steadfast.StepFailed):
        shout.run(steadfast.child_id("f0", "x"), store)
    with pytest.raises(steadfast.StepFailed, match="bad-x failed on try 1"):
        fragile.run("f0", store)
    # With one retry the child is resumed and tried again.
    counts.clear()
    assert fragile.run("f1", store, input=1).waiting
    with pytest.raises(steadfast.StepFailed):
        shout.run(steadfast.child_id("f1", "x"), store)
    assert fragile.run("f1", store).waiting
    assert shout.run(steadfast.child_id("f1", "x"), store).value == "BAD-X"
    assert fragile.run("f1", store).value == "BAD-X"


@pytest.mark.parametrize(
    "children, options, error, says",
    [
        ([("__x", "w", 1)], {}, steadfast.InvalidWorkflow, "reserved"),
        ([("x", "", 1)], {}, steadfast.InvalidWorkflow, "empty"),
        ([("x", "w", 1)], {"at_once": 0}, steadfast.InvalidInput, "at_once"),
        ([("x", "w", 1)], {"at_once": -1}, steadfast.InvalidInput, "at_once"),
        ([("x", "w", 1)], {"retries": 40}, steadfast.InvalidWorkflow, "at most 32"),
        ([("x", "w", math.nan)], {}, steadfast.InvalidInput, "input of child"),
        ([("x", "w", {"k": math.inf})], {}, steadfast.InvalidInput, "input of child"),
        ([("x", "w", 1)], {"retries": -1}, steadfast.InvalidInput, "retries"),
        ([("x", "w", 1), ("x", "w", 2)], {}, steadfast.InvalidWorkflow, "used twice"),
    ],
)
def test_bad_children_are_refused_before_anything_is_written(store, children, options, error, says):
    @steadfast.durable("bad")
    async def bad(ctx):
        return await ctx.children(children, **options)

    with pytest.raises(error, match=says):
        bad.run("b", store)
    assert all(r["run_id"] != steadfast.child_id("b", "x") for r in steadfast.runs(store))
