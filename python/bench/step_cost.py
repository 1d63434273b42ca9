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
is at most 20 us above Rust).

Stores: ``memory`` (the engine and the bindings alone) and ``sqlite`` (a fresh
database under ``--dir``, WAL with synchronous=FULL, a sync per checkpoint).

Example (from the repository's root, with the package installed)::

    cargo build --release -p steadfast-bench
    python python/bench/step_cost.py --bench target/release/steadfast-bench
"""

from __future__ import annotations

import argparse
import asyncio
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


async def python_us_per_step(url: str, runs: int) -> float:
    store = steadfast.open_store(url)
    start = time.perf_counter()
    for r in range(runs):
        outcome = await ten.run_async(f"run-{r}", store)
        if outcome.completed is None:
            raise SystemExit(f"run-{r} did not complete: {outcome}")
    return (time.perf_counter() - start) * 1e6 / (runs * STEPS)


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
            rust, python = [], []
            for rep in range(args.reps):
                rust.append(rust_us_per_step(args.bench, store, base))
                url = "memory:"
                if store == "sqlite":
                    path = os.path.join(base, f"step-cost-{rep}.db")
                    for suffix in ("", "-wal", "-shm", "-writer"):
                        if os.path.exists(path + suffix):
                            os.remove(path + suffix)
                    url = f"sqlite:{path}"
                python.append(asyncio.run(python_us_per_step(url, args.runs)))
            r, p = statistics.median(rust), statistics.median(python)
            row = {
                "store": store,
                "durability": "in memory" if store == "memory" else "synchronous=FULL, a sync per checkpoint",
                "reps": args.reps,
                "runs": args.runs,
                "rust_us_per_step": round(r, 1),
                "python_us_per_step": round(p, 1),
                "python_minus_rust_us": round(p - r, 1),
                "within_20us": p - r <= 20.0,
                "python": sys.version.split()[0],
            }
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{store:7} rust {r:7.1f} us/step  python {p:7.1f} us/step  "
                    f"python - rust {p - r:6.1f} us  (medians of {args.reps})",
                    flush=True,
                )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
