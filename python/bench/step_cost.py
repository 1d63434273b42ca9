#!/usr/bin/env python3
"""What a step costs in Python against the same step in Rust.

The workload is W1 as a durable function: runs of ten trivial steps (step
``s<i>`` returns ``i``) and a result save, one run after another. The Python
function is::

    @steadfast.durable("w")
    async def ten(ctx):
        for i in range(10):
            await ctx.step(f"s{i}", lambda: i)

and the Rust one is the ``W1/durable`` workload of the benchmark harness
(``steadfast-bench --workloads W1``), run as a child process between the
Python measurements, so that both see the same machine in the same minutes.
Each repetition measures Rust then Python on a fresh store; the medians are
reported, per store, with the difference in microseconds per step (the target
is at most 20 us above Rust). The same function with ``async def`` steps is
measured beside it, and so is ``asyncio.to_thread`` of a trivial function: a
sync step runs off the event loop, so one such hand-off and back is the least
it can cost above Rust.

Stores: ``memory`` (the engine and the bindings alone) and ``sqlite`` (a fresh
database under ``--dir``, WAL with synchronous=FULL, a sync per checkpoint).

Example (from the repository's root, with the package installed)::

    cargo build --release -p steadfast-bench
    python python/bench/step_cost.py --bench target/release/steadfast-bench
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import steadfast

STEPS = 10


@steadfast.durable("w")
async def ten(ctx):
    for i in range(STEPS):
        await ctx.step(f"s{i}", lambda i=i: i)


@steadfast.durable("w")
async def ten_async(ctx):
    for i in range(STEPS):

        async def value(i=i):
            return i

        await ctx.step(f"s{i}", value)


@steadfast.durable("w")
def ten_sync(ctx):
    for i in range(STEPS):
        ctx.step(f"s{i}", lambda i=i: i)


def context_switches() -> int:
    """The context switches of every thread of this process so far (Linux;
    0 elsewhere): each hand-off of a step between threads costs about two,
    however fast or slow the machine is that day."""
    n = 0
    for status in glob.glob("/proc/self/task/*/status"):
        try:
            with open(status) as f:
                n += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return n


async def python_us_per_step(url: str, runs: int, fn=ten) -> tuple:
    """Microseconds and context switches per step."""
    store = steadfast.open_store(url)
    switches = context_switches()
    start = time.perf_counter()
    for r in range(runs):
        outcome = await fn.run_async(f"run-{r}", store)
        if outcome.completed is None:
            raise SystemExit(f"run-{r} did not complete: {outcome}")
    us = (time.perf_counter() - start) * 1e6 / (runs * STEPS)
    return us, (context_switches() - switches) / (runs * STEPS)


def python_sync_us_per_step(url: str, runs: int) -> tuple:
    """Microseconds and context switches per step of the sync durable
    function (a plain ``def``, run on this thread with its steps)."""
    store = steadfast.open_store(url)
    switches = context_switches()
    start = time.perf_counter()
    for r in range(runs):
        outcome = ten_sync.run(f"run-{r}", store)
        if outcome.status != "completed":
            raise SystemExit(f"run-{r} did not complete: {outcome}")
    us = (time.perf_counter() - start) * 1e6 / (runs * STEPS)
    return us, (context_switches() - switches) / (runs * STEPS)


async def to_thread_us(n: int) -> float:
    """One hand-off of a trivial function to a thread and back
    (``asyncio.to_thread``): what any sync step run off the loop pays."""
    start = time.perf_counter()
    for i in range(n):
        await asyncio.to_thread(int, i)
    return (time.perf_counter() - start) * 1e6 / n


def rust_us_per_step(bench: str, store: str, directory: str) -> float:
    try:
        out = subprocess.run(
            [bench, "--stores", store, "--workloads", "W1", "--reps", "1", "--dir", directory],
            capture_output=True,
            text=True,
        )
    except OSError as e:
        raise SystemExit(f"--bench {bench}: cannot run it: {e}")
    if out.returncode != 0:
        raise SystemExit(f"--bench {bench} exited with {out.returncode}:\n{out.stderr.strip()}")
    for line in out.stdout.splitlines():
        row = json.loads(line)
        if row.get("workload") == "W1/durable" and row.get("store") == store:
            return float(row["us_per_step"])
    raise SystemExit(f"the harness printed no W1/durable row for {store}:\n{out.stdout}{out.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="the steadfast-bench binary (a release build)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (the median is reported)")
    parser.add_argument("--runs", type=int, default=1000, help="runs of ten steps per Python measurement")
    parser.add_argument("--stores", default="memory,sqlite", help="memory, sqlite or both")
    parser.add_argument("--dir", default=None, help="where SQLite stores are written (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per store")
    args = parser.parse_args()
    if args.reps < 1 or args.runs < 1:
        parser.error("--reps and --runs must be at least 1")
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    for s in stores:
        if s not in ("memory", "sqlite"):
            parser.error(f"--stores: unknown store {s!r} (memory, sqlite)")
    base = args.dir or tempfile.mkdtemp(prefix="steadfast-step-cost-")
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as e:
        parser.error(f"--dir {base}: {e.strerror}")
    try:
        for store in stores:
            rust, python, python_async, thread, switches, switches_async = [], [], [], [], [], []
            python_def, switches_def = [], []
            for rep in range(args.reps):
                rust.append(rust_us_per_step(args.bench, store, base))
                for kind, fn, out, sw in (
                    ("def", ten_sync, python_def, switches_def),
                    ("sync", ten, python, switches),
                    ("async", ten_async, python_async, switches_async),
                ):
                    url = "memory:"
                    if store == "sqlite":
                        path = os.path.join(base, f"step-cost-{rep}-{kind}.db")
                        for suffix in ("", "-wal", "-shm", "-writer"):
                            if os.path.exists(path + suffix):
                                os.remove(path + suffix)
                        url = f"sqlite:{path}"
                    if fn is ten_sync:
                        us, n = python_sync_us_per_step(url, args.runs)
                    else:
                        us, n = asyncio.run(python_us_per_step(url, args.runs, fn))
                    out.append(us)
                    sw.append(n)
                thread.append(asyncio.run(to_thread_us(args.runs)))
            r, p = statistics.median(rust), statistics.median(python)
            pd = statistics.median(python_def)
            pa, th = statistics.median(python_async), statistics.median(thread)
            row = {
                "store": store,
                "durability": "in memory" if store == "memory" else "synchronous=FULL, a sync per checkpoint",
                "reps": args.reps,
                "runs": args.runs,
                "rust_us_per_step": round(r, 1),
                "python_def_us_per_step": round(pd, 1),
                "python_def_minus_rust_us": round(pd - r, 1),
                "python_def_within_20us": pd - r <= 20.0,
                "python_def_switches_per_step": round(statistics.median(switches_def), 2),
                "python_us_per_step": round(p, 1),
                "python_minus_rust_us": round(p - r, 1),
                "within_20us": p - r <= 20.0,
                "python_async_us_per_step": round(pa, 1),
                "python_async_minus_rust_us": round(pa - r, 1),
                "to_thread_us": round(th, 1),
                "python_switches_per_step": round(statistics.median(switches), 2),
                "python_async_switches_per_step": round(statistics.median(switches_async), 2),
                "python": sys.version.split()[0],
            }
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{store:7} rust {r:7.1f} us/step  python def {pd:7.1f} us/step "
                    f"({pd - r:+.1f} us, {statistics.median(switches_def):.2f} switches); "
                    f"async def, sync steps {p:7.1f} us/step "
                    f"({p - r:+.1f} us); async steps {pa:7.1f} us/step "
                    f"({pa - r:+.1f} us); asyncio.to_thread {th:.1f} us; context switches per step "
                    f"{statistics.median(switches):.2f} sync, {statistics.median(switches_async):.2f} async  "
                    f"(medians of {args.reps})",
                    flush=True,
                )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
