"""Spend and budgets from Python, on every store: ``ctx.spend`` in sync and
async step functions of listed workflows and durable functions, charged once
per completed step; a run past its budget stops at its ``budget`` gate."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import subprocess
import sys
import textwrap
import time

import pytest

import steadfast


def test_listed_and_durable_steps_report_spend_once(store):
    wf = steadfast.Workflow("agent")
    calls = []

    @wf.step("ask")
    def ask(ctx, state):
        calls.append("ask")
        ctx.spend("tokens", 1200)
        ctx.spend("usd", 0.02)
        return {"answer": 42}

    @wf.step("tool")
    async def tool(ctx, state):
        calls.append("tool")
        await asyncio.sleep(0)
        ctx.spend("tokens", 300)
        return {"tool": True}

    out = steadfast.run("r", wf, store)
    assert out.completed, out
    spend = steadfast.show(store, "r")["spend"]
    assert spend["spent"] == {"tokens": 1500.0, "usd": 0.02}
    # Replayed: nothing runs, nothing is charged again.
    assert steadfast.run("r", wf, store).completed
    assert calls == ["ask", "tool"]
    assert steadfast.show(store, "r")["spend"] == spend
    history = steadfast.history(store, "r")
    assert history[0]["update"]["__spend"]["spent"] == {"tokens": 1200.0, "usd": 0.02}
    summary = [r for r in steadfast.runs(store) if r["run_id"] == "r"][0]
    assert summary["spend"]["spent"]["tokens"] == 1500.0

    @steadfast.durable("loop")
    async def loop(ctx):
        total = 0
        for i in range(3):

            def call(i=i):
                ctx.spend("tokens", 100 * (i + 1))
                return i

            total += await ctx.step(ctx.numbered("call"), call)
        return total

    assert loop.run("d", store).value == 3
    assert steadfast.show(store, "d")["spend"]["spent"] == {"tokens": 600.0}


def test_a_budget_stops_the_run_until_approved_or_rejected(store):
    wf = steadfast.Workflow("spender")
    ran = []
    for name in ["a", "b", "c"]:

        @wf.step(name)
        def step(ctx, state, name=name):
            ran.append(name)
            ctx.spend("usd", 1)
            return {name: True}

    out = steadfast.run("r", wf, store, budget={"usd": 1.5})
    assert out.waiting and out.gate == "budget", out
    assert ran == ["a", "b"]
    with pytest.raises(steadfast.InvalidInput):
        steadfast.approve(store, "r", "budget", {"usd": "more"})
    steadfast.approve(store, "r", "budget", {"usd": 5}, by="ada")
    assert steadfast.run("r", wf, store).completed
    assert ran == ["a", "b", "c"]
    spend = steadfast.show(store, "r")["spend"]
    assert spend == {"spent": {"usd": 3.0}, "budget": {"usd": 6.5}}

    out = steadfast.run("x", wf, store, budget={"usd": 0.5})
    assert out.waiting and out.gate == "budget"
    steadfast.reject(store, "x", "budget", "too dear")
    assert steadfast.run("x", wf, store).rejected


def test_bad_spend_and_budgets_are_refused(memory_store):
    wf = steadfast.Workflow("bad")
    seen = []

    @wf.step("s")
    def s(ctx, state):
        for what, amount in [("usd", -1), ("usd", float("nan")), ("", 1), ("a b", 1), ("usd", True)]:
            with pytest.raises(steadfast.InvalidInput):
                ctx.spend(what, amount)
            seen.append(what)
        return {}

    assert steadfast.run("r", wf, memory_store).completed
    assert len(seen) == 5
    assert steadfast.show(memory_store, "r").get("spend") is None
    for budget in [{"usd": -1}, {"usd": "1"}, {"": 1}, ["usd"], {"usd": float("inf")}]:
        with pytest.raises(steadfast.InvalidInput):
            steadfast.run("b", wf, memory_store, budget=budget)


def test_a_shared_limit_holds_steps_of_listed_and_durable_runs(store):
    import threading
    import time

    lock = threading.Lock()
    now = [0]
    most = [0]

    def work(ctx, state):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return {"done": True}

    wf = steadfast.Workflow("limited")
    wf.step("work", work, limit="tool:1")

    async def both():
        return await asyncio.gather(
            *[steadfast.run_async(f"r{i}", wf, store, wait_for_timers=True) for i in range(4)]
        )

    outs = asyncio.run(both())
    assert all(o.completed for o in outs), outs
    assert most[0] == 1

    @steadfast.durable("limited-d")
    async def limited(ctx):
        return await ctx.step("call", lambda: 7, limit="tool")

    # No size anywhere: a clear error. With one set on the store, it runs.
    with pytest.raises(steadfast.InvalidWorkflow, match="no size"):
        limited.run("d", store)
    with pytest.raises(steadfast.InvalidInput):
        wf2 = steadfast.Workflow("bad")
        wf2.step("s", work, limit="a b:1")
        steadfast.run("x", wf2, store)


class RateLimited(Exception):
    """What a provider's client raises on HTTP 429: the seconds to wait."""

    def __init__(self, retry_after):
        super().__init__("rate limited")
        self.retry_after = retry_after


def _gap_between_attempts(store, run_id, retry_after):
    """Seconds between a step's first attempt, which raises RateLimited with
    ``retry_after``, and its second, which succeeds."""
    wf = steadfast.Workflow("provider")
    seen = []

    @wf.step("call", retries=1, backoff=0.01, max_backoff=0.01)
    def call(ctx, state):
        seen.append(time.monotonic())
        if len(seen) == 1:
            raise RateLimited(retry_after)
        return {"ok": True}

    assert steadfast.run(run_id, wf, store).completed
    assert len(seen) == 2
    return seen[1] - seen[0]


def test_an_exception_with_retry_after_delays_the_next_attempt(store):
    assert _gap_between_attempts(store, "asked", 0.6) >= 0.55
    # What is not a finite number of seconds from 0 is ignored: the policy's
    # backoff (10 ms) decides.
    for i, hostile in enumerate([math.nan, -1, "soon", True, None, math.inf]):
        assert _gap_between_attempts(store, f"ignored-{i}", hostile) < 0.5, hostile

    # A durable function's step too.
    seen = []

    def call():
        seen.append(time.monotonic())
        if len(seen) == 1:
            raise RateLimited(0.6)
        return 1

    @steadfast.durable("provider-d")
    async def provider(ctx):
        return await ctx.step("call", call, retries=1, backoff=0.01, max_backoff=0.01)

    assert provider.run("d", store).value == 1
    assert seen[1] - seen[0] >= 0.55


def test_a_huge_retry_after_pauses_the_key_for_a_day_at_most(tmp_path, steadfast_cli):
    url = f"sqlite:{tmp_path / 'runs.db'}"
    script = textwrap.dedent(
        f"""
        import steadfast

        class RateLimited(Exception):
            retry_after = 1e300

        wf = steadfast.Workflow("provider")

        @wf.step("call", retries=1, limit="model:1")
        def call(ctx, state):
            raise RateLimited("429")

        steadfast.run("r", wf, steadfast.open_store({url!r}))
        """
    )
    before = time.time()
    # Started outside python/, where `import steadfast` would find the source tree.
    child = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        paused = None
        deadline = time.monotonic() + 60
        while paused is None and time.monotonic() < deadline:
            assert child.poll() is None, "the run ended instead of waiting a day"
            out = subprocess.run(
                [steadfast_cli, "--store", url, "limits", "list", "--json"], capture_output=True, text=True
            )
            if out.returncode == 0:
                limits = {e["key"]: e for e in json.loads(out.stdout)}
                paused = limits.get("model", {}).get("paused_until")
            time.sleep(0.1)
        assert paused is not None, "the key was never paused"
        # A time in RFC 3339 (`2026-12-04T15:40:00.123Z`).
        at = datetime.datetime.fromisoformat(paused.replace("Z", "+00:00")).timestamp()
        day = 86_400
        assert before + day - 5 <= at <= time.time() + day + 5, paused
    finally:
        child.kill()
        child.wait()
