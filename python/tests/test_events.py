"""Events: ``ctx.emit`` from durable functions' steps (sync and async) and
from listed steps, and ``steadfast.watch`` over them, on every store."""

from __future__ import annotations

import asyncio

import pytest

import steadfast


def watch_all(store, run_id, **kw):
    async def collect():
        return [item async for item in steadfast.watch(store, run_id, **kw)]

    return asyncio.run(collect())


def test_durable_steps_emit_and_a_watch_sees_them(store):
    @steadfast.durable("talker")
    async def talker(ctx):
        def think():
            for t in ["Hel", "lo"]:
                ctx.emit({"token": t})
            return "Hello"

        async def act():
            await asyncio.sleep(0)
            ctx.emit("acting")
            return 1

        said = await ctx.step("think", think)
        await ctx.step("act", act)
        return said

    assert talker.run("r", store).value == "Hello"
    items = watch_all(store, "r")
    events = [(i["seq"], i["step"], i["attempt"], i["value"]) for i in items if i["kind"] == "event"]
    assert events == [
        (1, "think", 1, {"token": "Hel"}),
        (2, "think", 1, {"token": "lo"}),
        (3, "act", 1, "acting"),
    ]
    assert [i["kind"] for i in items] == [
        "started", "event", "event", "done", "started", "event", "done", "completed",
    ]
    # From a number on.
    assert [i["seq"] for i in watch_all(store, "r", after=2) if i["kind"] == "event"] == [3]


def test_a_listed_step_emits_through_its_context(store):
    wf = steadfast.Workflow("listed")

    @wf.step("work")
    def work(ctx, state):
        ctx.emit({"progress": 0.5})
        return {"done": True}

    assert steadfast.run("r", wf, store).completed
    items = watch_all(store, "r")
    assert [i["value"] for i in items if i["kind"] == "event"] == [{"progress": 0.5}]


def test_emit_outside_a_step_and_bad_values_are_refused(store):
    seen = {}

    @steadfast.durable("bad")
    async def bad(ctx):
        with pytest.raises(steadfast.InvalidInput, match="outside a step"):
            ctx.emit(1)

        def step():
            for name, value in [("nan", float("nan")), ("set", {1, 2}), ("big", "x" * 70_000)]:
                try:
                    ctx.emit(value)
                except steadfast.InvalidInput as e:
                    seen[name] = str(e)
            return 0

        return await ctx.step("s", step)

    assert bad.run("r", store).completed
    assert set(seen) == {"nan", "set", "big"}, seen
    assert "65536" in seen["big"]
    assert [i for i in watch_all(store, "r") if i["kind"] == "event"] == []


def test_a_watch_attached_before_the_run_follows_it(store):

    @steadfast.durable("slow")
    async def slow(ctx):
        async def tick():
            for i in range(5):
                ctx.emit(i)
                await asyncio.sleep(0.03)
            return 5

        return await ctx.step("tick", tick)

    async def both():
        watcher = asyncio.ensure_future(
            _collect(steadfast.watch(store, "r", poll=0.005))
        )
        await asyncio.sleep(0.05)
        out = await slow.run_async("r", store)
        return out, await asyncio.wait_for(watcher, 30)

    out, items = asyncio.run(both())
    assert out.completed
    assert [i["value"] for i in items if i["kind"] == "event"] == [0, 1, 2, 3, 4]
    assert items[-1]["kind"] == "completed"


async def _collect(watch):
    return [item async for item in watch]


def test_watch_arguments_are_checked(store):
    with pytest.raises(steadfast.InvalidRunId):
        steadfast.watch(store, "")
    with pytest.raises(steadfast.InvalidInput):
        steadfast.watch(store, "r", poll=0)
