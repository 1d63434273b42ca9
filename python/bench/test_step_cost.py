"""What a step costs in Python against the same step in Rust (pytest-benchmark).

The workload is W1 as a durable function: runs of ten trivial steps (step
``s<i>`` returns ``i``) and the result's save, one run after another, on a
fresh store for each round. Four ways of writing it are measured, each in the
same pytest session, on the same store kinds:

- ``rust``: the durable function written in Rust, run by the package's own
  runtime (``_native._ten_steps_in_rust``), as the harness's ``W1/durable``;
- ``def``: a sync durable function (a plain ``def``), its steps plain
  functions;
- ``async-def``: an ``async def`` durable function whose steps are plain
  functions (each runs off the event loop);
- ``async-steps``: an ``async def`` durable function whose steps are
  coroutine functions.

Stores: ``memory`` (the engine and the bindings alone) and ``sqlite`` (a new
database file for each round, WAL with ``synchronous=FULL``, a sync per
checkpoint). At the end the session prints, per store, the median
microseconds per step of each way, its difference from Rust's (the target is
at most 20 µs above Rust) and the context switches per step of the process's
threads; ``--benchmark-json`` keeps them too, in each benchmark's
``extra_info``. Beside them, ``asyncio.to_thread`` of a trivial function: the
least a step run off the event loop pays.

Run from the repository's root, with the package installed (the README's
Python section) and pytest-benchmark::

    pytest python/bench/test_step_cost.py --benchmark-columns=median,iqr,rounds

``--step-runs N`` sets the runs per round (default 300), ``--step-rounds N``
the rounds (default 5), ``--step-dir DIR`` where SQLite's files go (default:
pytest's temporary directory). With ``--benchmark-disable`` each case runs
once, as a test that every run completes (CI does this with few runs).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import resource
import statistics

import pytest

import steadfast
from steadfast import _native

STEPS = 10



@steadfast.durable("w")
def ten_def(ctx):
    for i in range(STEPS):
        ctx.step(f"s{i}", lambda i=i: i)


@steadfast.durable("w")
async def ten_async_def(ctx):
    for i in range(STEPS):
        await ctx.step(f"s{i}", lambda i=i: i)


@steadfast.durable("w")
async def ten_async_steps(ctx):
    for i in range(STEPS):

        async def value(i=i):
            return i

        await ctx.step(f"s{i}", value)


def run_rust(store, prefix: str, runs: int) -> None:
    _native._ten_steps_in_rust(store, prefix, runs)


def run_def(store, prefix: str, runs: int) -> None:
    for r in range(runs):
        outcome = ten_def.run(f"{prefix}-{r}", store)
        assert outcome.status == "completed", outcome


async def _run_async(fn, store, prefix: str, runs: int) -> None:
    for r in range(runs):
        outcome = await fn.run_async(f"{prefix}-{r}", store)
        assert outcome.status == "completed", outcome


def run_async_def(store, prefix: str, runs: int) -> None:
    asyncio.run(_run_async(ten_async_def, store, prefix, runs))


def run_async_steps(store, prefix: str, runs: int) -> None:
    asyncio.run(_run_async(ten_async_steps, store, prefix, runs))


WAYS = {
    "rust": run_rust,
    "def": run_def,
    "async-def": run_async_def,
    "async-steps": run_async_steps,
}


def context_switches() -> int:
    """The context switches of this process's threads so far, those that
    ended included (``getrusage``: voluntary and involuntary). Each hand-off
    of a step between threads costs about two, however fast or slow the
    machine is that day, so the count moves less than the times do (the
    involuntary ones, a few, move with the machine's load)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def counted(way, switches: list):
    """`way`, with the context switches of each call appended to `switches`."""

    def run(store, prefix: str, runs: int) -> None:
        before = context_switches()
        way(store, prefix, runs)
        switches.append(context_switches() - before)

    return run

_rounds = itertools.count()


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_step_cost(benchmark, request, tmp_path, step_results, kind, way):
    runs = request.config.getoption("--step-runs")
    rounds = request.config.getoption("--step-rounds")
    base = request.config.getoption("--step-dir") or str(tmp_path)
    benchmark.group = f"ten-step durable function, {kind} store"

    def fresh():
        n = next(_rounds)
        if kind == "memory":
            url = "memory:"
        else:
            url = f"sqlite:{os.path.join(base, f'step-cost-{os.getpid()}-{n}.db')}"
        return (steadfast.open_store(url), f"{way}-{n}", runs), {}

    switches: list = []
    benchmark.pedantic(counted(WAYS[way], switches), setup=fresh, rounds=rounds, iterations=1)
    stats = getattr(benchmark, "stats", None)
    # Timed, each round ran once; with --benchmark-disable, the case once.
    assert len(switches) == (rounds if stats is not None else 1), switches
    if stats is None:
        return
    us = stats.stats.median * 1e6 / (runs * STEPS)
    per_step = statistics.median(switches) / (runs * STEPS)
    benchmark.extra_info.update(
        {"runs": runs, "steps": STEPS, "us_per_step": round(us, 1),
         "context_switches_per_step": round(per_step, 2),
         "durability": "in memory" if kind == "memory" else "WAL, synchronous=FULL"}
    )
    step_results[(kind, way)] = (us, per_step)


def test_to_thread_hand_off(benchmark, request, step_results):
    """One hand-off of a trivial function to a thread and back
    (``asyncio.to_thread``), per call: what any sync step run off the event
    loop pays at least, for comparison."""
    runs = request.config.getoption("--step-runs") * STEPS
    benchmark.group = "asyncio.to_thread of a trivial function"

    async def calls():
        for i in range(runs):
            await asyncio.to_thread(int, i)

    benchmark.pedantic(lambda: asyncio.run(calls()), rounds=request.config.getoption("--step-rounds"), iterations=1)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        step_results[("to_thread", "call")] = (stats.stats.median * 1e6 / runs, None)
