#!/usr/bin/env python3
"""Benchmark Agent Framework checkpoint storages on a real (model-free) workflow.

The workflow is ten executors in a line; each appends a ~100-byte item to a
list it passes on, so a run checkpoints after every superstep. Every run is
a new workflow run. Storages (``--only``, comma separated, default all):

  memory              agent_framework.InMemoryCheckpointStorage: the floor
  file                agent_framework.FileCheckpointStorage: one JSON file per
                      checkpoint, written to a temporary file and renamed into
                      place, never synced (a power cut can lose or empty it)
  steadfast-sqlite    SteadfastCheckpointStorage("sqlite:PATH"): synced
                      (synchronous=FULL) before save returns
  steadfast-postgres  SteadfastCheckpointStorage("postgres://...?schema=NAME"):
                      synchronous_commit=on
  steadfast-file      SteadfastCheckpointStorage("file:PATH"): the file store,
                      which rewrites its one file (fsynced, renamed, directory
                      fsynced) on every write, so its cost grows with the
                      file: give it fewer --runs

Measured per storage: wall time of the runs, checkpoints stored (counted
afterwards), ms per checkpoint, the median run, and the storage's size after
the runs (file: the directory's files; SQLite: main file + -wal; PostgreSQL:
pg_total_relation_size of the schema's tables).

  python bench/maf_bench.py --runs 200 --pg postgres://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_framework import (
    Executor,
    FileCheckpointStorage,
    InMemoryCheckpointStorage,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)

from steadfast.agent_framework import SteadfastCheckpointStorage

STORAGES = ["memory", "file", "steadfast-sqlite", "steadfast-postgres", "steadfast-file"]
NAME = "maf-bench"


class Step(Executor):
    def __init__(self, id: str, last: bool) -> None:
        super().__init__(id=id)
        self.last = last

    @handler
    async def step(self, items: list, ctx: WorkflowContext[list, list]) -> None:
        items = [*items, {"node": self.id, "text": f"{self.id}: " + "x" * 80}]
        if self.last:
            await ctx.yield_output(items)
        else:
            await ctx.send_message(items)


def build(storage: Any) -> Any:
    steps = [Step(f"node_{i}", i == 9) for i in range(10)]
    b = WorkflowBuilder(name=NAME, start_executor=steps[0], checkpoint_storage=storage)
    for a, c in zip(steps, steps[1:]):
        b = b.add_edge(a, c)
    return b.build()


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def pg_size(base: str, schema: str) -> int:
    import psycopg

    with psycopg.connect(base.split("?")[0], autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'm')",
            (schema,),
        ).fetchone()
        return int(row[0])


def drop(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base.split("?")[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def measure(name: str, runs: int, tmp: Path, pg: str | None) -> dict:
    schema = None
    if name == "memory":
        storage: Any = InMemoryCheckpointStorage()
        size = lambda: None  # noqa: E731
    elif name == "file":
        d = tmp / "file"
        storage = FileCheckpointStorage(d)
        size = lambda: size_of(d)  # noqa: E731
    elif name == "steadfast-sqlite":
        f = tmp / "steadfast.db"
        storage = SteadfastCheckpointStorage(f"sqlite:{f}")
        size = lambda: size_of(f)  # noqa: E731
    elif name == "steadfast-file":
        f = tmp / "steadfast.json"
        storage = SteadfastCheckpointStorage(f"file:{f}")
        size = lambda: size_of(f)  # noqa: E731
    else:
        assert pg is not None
        schema = f"mafbench_{secrets.token_hex(4)}"
        storage = SteadfastCheckpointStorage(f"{pg}{'&' if '?' in pg else '?'}schema={schema}")
        size = lambda: pg_size(pg, schema)  # noqa: E731
    times = []
    began = time.perf_counter()
    for _ in range(runs):
        # A new workflow per run: each run is a workflow run of its own.
        wf = build(storage)
        t0 = time.perf_counter()
        result = await wf.run([])
        times.append(time.perf_counter() - t0)
        out = result.get_outputs()
        if len(out) != 1 or len(out[0]) != 10:
            raise SystemExit(f"{name}: a run gave {out!r}")
    wall = time.perf_counter() - began
    checkpoints = len(await storage.list_checkpoint_ids(workflow_name=NAME))
    row = {
        "storage": name,
        "runs": runs,
        "checkpoints": checkpoints,
        "ms_per_checkpoint": round(wall * 1000 / checkpoints, 3),
        "median_run_ms": round(statistics.median(times) * 1000, 3),
        "bytes": size(),
    }
    if isinstance(storage, SteadfastCheckpointStorage):
        storage.close()
    if schema is not None:
        drop(pg, schema)
    return row


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--pg", help="PostgreSQL URL for steadfast-postgres")
    p.add_argument("--only", help=f"comma-separated, some of {', '.join(STORAGES)}")
    a = p.parse_args()
    if not 1 <= a.runs <= 100_000:
        p.error("--runs: expected 1 to 100000")
    only = a.only.split(",") if a.only else STORAGES
    for s in only:
        if s not in STORAGES:
            p.error(f"--only {s}: expected some of {', '.join(STORAGES)}")
    # Warm up on memory, on no storage's time.
    warm = build(InMemoryCheckpointStorage())
    for _ in range(10):
        await build(InMemoryCheckpointStorage()).run([])
    del warm
    rows = []
    with tempfile.TemporaryDirectory() as t:
        for name in only:
            if name == "steadfast-postgres" and not a.pg:
                print(f"{name}: skipped, no --pg URL", file=sys.stderr)
                continue
            row = await measure(name, a.runs, Path(t), a.pg)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| storage | ms per checkpoint | median run (ms) | checkpoints | stored |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        stored = "" if r["bytes"] is None else f"{r['bytes'] / (1 << 20):.1f} MiB"
        print(f"| {r['storage']} | {r['ms_per_checkpoint']} | {r['median_run_ms']} | {r['checkpoints']} | {stored} |")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
