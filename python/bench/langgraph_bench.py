#!/usr/bin/env python3
"""Benchmark LangGraph checkpointers on a real (model-free) StateGraph.

Workloads (``--workload``, default small).  Both graphs are ten nodes in a
line, and every invocation runs on its own thread id.

  small  Each node appends a ~100-byte item to a list channel and bumps two
         counters, so a finished run's state is about 1 KB.  1000
         invocations unless ``--invocations`` says otherwise.
  large  The large values of W7 in WORKLOAD.md (an agent rereading a
         document).  Each node overwrites a ``doc: str`` channel with a
         1 MiB document (``--doc-bytes``) and bumps a counter.  Node i for
         even i returns a new document; node i+1 returns that same document
         again, so half the values repeat one an earlier node of the same
         invocation returned, and an invocation makes five distinct
         documents.  A document is random text drawn from 64 characters,
         which does not compress (so PostgreSQL's TOAST is measured on what
         it keeps), seeded by the invocation's number and the document's, so
         every saver gets the same documents.  An invocation's documents are
         made before it starts and that time is left out, as W7 does.  W7's
         steps each add a key of their own and reread five steps later;
         here there is one channel, as a LangGraph agent keeps its current
         document.  20 invocations unless ``--invocations`` says otherwise.

Savers (``--only``, comma separated, default all):

  stock-memory        langgraph.checkpoint.memory.InMemorySaver: no disk and no
                      serialization to a database, the framework's own floor
  stock-sqlite        langgraph.checkpoint.sqlite.SqliteSaver on sqlite3
  stock-postgres      langgraph.checkpoint.postgres.PostgresSaver on psycopg
  steadfast-sqlite    steadfast.langgraph.SteadfastSaver("sqlite:PATH")
  steadfast-postgres  steadfast.langgraph.SteadfastSaver("postgres://...?schema=NAME")

Durability settings (``--durability``, default both):

  default  as each saver configures itself.
           - SqliteSaver.setup() runs ``PRAGMA journal_mode=WAL`` and sets
             nothing else, so ``synchronous`` is the SQLite library's compiled
             default (SQLITE_DEFAULT_WAL_SYNCHRONOUS).  The row's "settings"
             column shows the value read back from the connection.
           - PostgresSaver sets nothing; the server's defaults apply
             (synchronous_commit=on and fsync=on unless the server says
             otherwise: then every commit waits for its WAL flush).
           - SteadfastSaver always fsyncs (synchronous=FULL on SQLite,
             commits with synchronous_commit=on on PostgreSQL).
  fsync    every checkpoint commit reaches the disk before put returns.
           - stock SQLite: ``PRAGMA journal_mode=WAL`` and
             ``PRAGMA synchronous=FULL`` on the saver's connection.
           - stock PostgreSQL: ``SET synchronous_commit = on`` on the session
             (the same as the default when the server default is on).
           - SteadfastSaver: nothing to change (the same as default).

Measured per (saver, durability): wall time of the N invocations (graph
compile, schema set-up and the counting afterwards excluded), checkpoints
stored (counted afterwards with ``saver.list`` per thread), the median time
of one invocation, total time / checkpoints, and the database size after the
run (SQLite: main file + ``-wal`` file; PostgreSQL: ``pg_total_relation_size``
summed over the tables of the saver's schema, indexes and TOAST included).
The large workload adds two columns: unique_bytes, the bytes of the distinct
documents the run made (invocations * 5 * document size), and
stored_per_unique, the database size over unique_bytes (n/a where nothing is
stored on disk, as with stock-memory).

Each SQLite run gets a fresh file in a temporary directory.  Each PostgreSQL
run gets its own schema, dropped first (and dropped again afterwards unless
``--keep``).

Example:

  python bench/langgraph_bench.py --invocations 1000 \\
      --pg postgres://postgres@127.0.0.1:5432/test --json results.json
  python bench/langgraph_bench.py --workload large \\
      --only stock-sqlite,steadfast-sqlite --durability fsync
"""

from __future__ import annotations

import argparse
import base64
import json
import operator
import platform
import random
import shlex
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Callable, TypedDict

SAVERS = ["stock-memory", "stock-sqlite", "stock-postgres", "steadfast-sqlite", "steadfast-postgres"]
DURABILITIES = ["default", "fsync"]
WORKLOADS = ["small", "large"]
DEFAULT_INVOCATIONS = {"small": 1000, "large": 20}
NODES = 10
DOCS = NODES // 2  # distinct documents per invocation of the large workload
DOC_BYTES = 1 << 20
# Steadfast keeps a value longer than this apart, as a blob named by its
# hash; a document this size or smaller would measure something else.
BLOB_THRESHOLD = 64 * 1024
SCHEMA_PREFIX = "lgbench_"


# --------------------------------------------------------------------------
# The graph
# --------------------------------------------------------------------------


class State(TypedDict):
    items: Annotated[list[dict], operator.add]
    visits: int
    chars: int


def _node(i: int) -> Callable[[State], dict]:
    note = f"node {i} was here; " * 4  # ~80 characters

    def run(state: State) -> dict:
        item = {"node": i, "seen": len(state["items"]), "note": note}
        return {
            "items": [item],
            "visits": state["visits"] + 1,
            "chars": state["chars"] + len(note),
        }

    run.__name__ = f"n{i}"
    return run


def build_graph():
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(State)
    names = [f"n{i}" for i in range(NODES)]
    for i, name in enumerate(names):
        g.add_node(name, _node(i))
    g.add_edge(START, names[0])
    for a, b in zip(names, names[1:]):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


class LargeState(TypedDict):
    doc: str
    visits: int


def document(invocation: int, k: int, size: int) -> str:
    """Document ``k`` of invocation ``invocation``: ``size`` characters of
    random text drawn from 64 (URL-safe base64), the same for the same
    arguments."""
    rng = random.Random(f"{invocation}/{k}")
    return base64.urlsafe_b64encode(rng.randbytes(size * 3 // 4 + 3))[:size].decode("ascii")


def _large_node(i: int, docs: list[str]) -> Callable[[LargeState], dict]:
    def run(state: LargeState) -> dict:
        # Node i and node i+1 (i even) hand over the same document, as a
        # model's or a tool's answer: it is made before the invocation.
        return {"doc": docs[i // 2], "visits": state["visits"] + 1}

    run.__name__ = f"n{i}"
    return run


def build_large_graph(docs: list[str]):
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(LargeState)
    names = [f"n{i}" for i in range(NODES)]
    for i, name in enumerate(names):
        g.add_node(name, _large_node(i, docs))
    g.add_edge(START, names[0])
    for a, b in zip(names, names[1:]):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


@dataclass
class Workload:
    graph: Any  # an uncompiled StateGraph
    inputs: Callable[[int], dict]  # invocation number -> the graph's input
    check: Callable[[dict], bool]  # is this the state a finished run ends in
    unique_bytes: int  # the bytes of distinct documents the run makes


def small_workload(args) -> Workload:
    return Workload(
        graph=build_graph(),
        inputs=lambda i: {"items": [], "visits": 0, "chars": 0},
        check=lambda last: last["visits"] == NODES,
        unique_bytes=0,
    )


def large_workload(args) -> Workload:
    # The documents of the invocation under way; the nodes read them from
    # here, so that they are not an input the savers store as well.
    docs: list[str] = []

    def inputs(i: int) -> dict:
        docs[:] = [document(i, k, args.doc_bytes) for k in range(DOCS)]
        return {"doc": "", "visits": 0}

    return Workload(
        graph=build_large_graph(docs),
        inputs=inputs,
        check=lambda last: last["visits"] == NODES and last["doc"] == docs[-1],
        unique_bytes=args.invocations * DOCS * args.doc_bytes,
    )


WORKLOAD_BUILDERS = {"small": small_workload, "large": large_workload}


# --------------------------------------------------------------------------
# Savers
# --------------------------------------------------------------------------


@dataclass
class Opened:
    saver: Any
    settings: str  # what durability actually is, as read back
    size: Callable[[], tuple[int, dict]]  # (bytes now, breakdown)
    close: Callable[[], None]


def _file_size(path: Path) -> tuple[int, dict]:
    parts = {}
    for key, p in (("main_bytes", path), ("wal_bytes", Path(f"{path}-wal"))):
        try:
            parts[key] = p.stat().st_size
        except FileNotFoundError:
            parts[key] = 0
    return sum(parts.values()), parts


def _pg_admin(pg: str):
    import psycopg

    return psycopg.connect(pg, autocommit=True)


def _pg_reset_schema(pg: str, schema: str, create: bool) -> None:
    with _pg_admin(pg) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if create:
            conn.execute(f'CREATE SCHEMA "{schema}"')


def _pg_schema_size(pg: str, schema: str) -> tuple[int, dict]:
    with _pg_admin(pg) as conn:
        rows = conn.execute(
            """
            SELECT c.relname, pg_total_relation_size(c.oid)
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'm')
            ORDER BY c.relname
            """,
            (schema,),
        ).fetchall()
    parts = {name: int(size) for name, size in rows}
    return sum(parts.values()), parts


def _pg_show(conn, name: str) -> str:
    row = conn.execute(f"SHOW {name}").fetchone()
    return row[name] if isinstance(row, dict) else row[0]


def _pg_settings(conn) -> str:
    return (
        f"synchronous_commit={_pg_show(conn, 'synchronous_commit')}, "
        f"fsync={_pg_show(conn, 'fsync')}"
    )


def _sqlite_settings(conn: sqlite3.Connection) -> str:
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    jm = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return f"journal_mode={jm}, synchronous={names.get(sync, sync)}"


def open_stock_memory(durability: str, tmp: Path, args) -> Opened:
    from langgraph.checkpoint.memory import InMemorySaver

    saver = InMemorySaver()
    return Opened(saver, "in memory (nothing durable)", lambda: (0, {}), lambda: None)


def open_stock_sqlite(durability: str, tmp: Path, args) -> Opened:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = tmp / f"stock-{durability}.sqlite"
    conn = sqlite3.connect(str(path), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # runs PRAGMA journal_mode=WAL and creates the tables
    if durability == "fsync":
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    return Opened(saver, _sqlite_settings(conn), lambda: _file_size(path), conn.close)


def open_stock_postgres(durability: str, tmp: Path, args) -> Opened:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import Connection
    from psycopg.rows import dict_row

    schema = f"{SCHEMA_PREFIX}stock_{durability}"
    _pg_reset_schema(args.pg, schema, create=True)
    # The connection settings PostgresSaver.from_conn_string uses, plus a
    # search_path so the saver's unqualified tables land in our schema.
    conn = Connection.connect(
        args.pg,
        autocommit=True,
        prepare_threshold=0,
        row_factory=dict_row,
        options=f"-c search_path={schema}",
    )
    if durability == "fsync":
        conn.execute("SET synchronous_commit = on")
    saver = PostgresSaver(conn)
    saver.setup()
    settings = _pg_settings(conn)

    def close() -> None:
        conn.close()
        if not args.keep:
            _pg_reset_schema(args.pg, schema, create=False)

    return Opened(saver, settings, lambda: _pg_schema_size(args.pg, schema), close)


def _steadfast_saver_class():
    from steadfast.langgraph import SteadfastSaver

    return SteadfastSaver


def _steadfast_close(saver) -> Callable[[], None]:
    close = getattr(saver, "close", None)
    return close if callable(close) else (lambda: None)


def open_steadfast_sqlite(durability: str, tmp: Path, args) -> Opened:
    path = tmp / f"steadfast-{durability}.sqlite"
    saver = _steadfast_saver_class()(f"sqlite:{path}")
    if callable(getattr(saver, "setup", None)):
        saver.setup()
    return Opened(
        saver,
        "always synchronous=FULL (WAL)",
        lambda: _file_size(path),
        _steadfast_close(saver),
    )


def open_steadfast_postgres(durability: str, tmp: Path, args) -> Opened:
    schema = f"{SCHEMA_PREFIX}steadfast_{durability}"
    _pg_reset_schema(args.pg, schema, create=False)  # the saver makes its own
    sep = "&" if "?" in args.pg else "?"
    saver = _steadfast_saver_class()(f"{args.pg}{sep}schema={schema}")
    if callable(getattr(saver, "setup", None)):
        saver.setup()
    with _pg_admin(args.pg) as c:
        settings = _pg_settings(c) + " (server)"
    inner_close = _steadfast_close(saver)

    def close() -> None:
        inner_close()
        if not args.keep:
            _pg_reset_schema(args.pg, schema, create=False)

    return Opened(saver, settings, lambda: _pg_schema_size(args.pg, schema), close)


OPENERS = {
    "stock-memory": open_stock_memory,
    "stock-sqlite": open_stock_sqlite,
    "stock-postgres": open_stock_postgres,
    "steadfast-sqlite": open_steadfast_sqlite,
    "steadfast-postgres": open_steadfast_postgres,
}


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------


@dataclass
class Result:
    saver: str
    durability: str
    settings: str
    invocations: int
    checkpoints: int
    total_s: float
    median_invocation_ms: float
    per_checkpoint_ms: float
    db_bytes: int
    state_bytes: int
    skipped: str | None = None
    extra: dict = field(default_factory=dict)
    unique_bytes: int = 0  # large workload only
    stored_per_unique: float | None = None  # None where nothing is on disk


def run_one(name: str, durability: str, tmp: Path, args) -> Result:
    opened = OPENERS[name](durability, tmp, args)
    try:
        work = WORKLOAD_BUILDERS[args.workload](args)
        graph = work.graph.compile(checkpointer=opened.saver)
        prefix = f"{name}-{durability}-"
        invoke_kwargs = {}
        if args.graph_durability != "langgraph-default":
            invoke_kwargs["durability"] = args.graph_durability
        times: list[float] = []
        last = None
        making = 0.0  # making the inputs (the large workload's documents)
        start = time.perf_counter()
        for i in range(args.invocations):
            cfg = {"configurable": {"thread_id": f"{prefix}{i}"}}
            m0 = time.perf_counter()
            inputs = work.inputs(i)
            t0 = time.perf_counter()
            making += t0 - m0
            last = graph.invoke(inputs, cfg, **invoke_kwargs)
            times.append(time.perf_counter() - t0)
        total = time.perf_counter() - start - making
        size, size_parts = opened.size()

        checkpoints = 0
        for i in range(args.invocations):
            cfg = {"configurable": {"thread_id": f"{prefix}{i}"}}
            checkpoints += sum(1 for _ in opened.saver.list(cfg))
        if last is None or not work.check(last):
            shown = {
                k: (f"<{len(v)} characters>" if isinstance(v, str) else v)
                for k, v in (last or {}).items()
            }
            raise RuntimeError(f"{name}: the graph did not run all {NODES} nodes: {shown}")
        state_bytes = len(json.dumps(last).encode())
    finally:
        opened.close()
    return Result(
        saver=name,
        durability=durability,
        settings=opened.settings,
        invocations=args.invocations,
        checkpoints=checkpoints,
        total_s=total,
        median_invocation_ms=statistics.median(times) * 1e3,
        per_checkpoint_ms=(total / checkpoints * 1e3) if checkpoints else float("nan"),
        db_bytes=size,
        state_bytes=state_bytes,
        extra={"size_breakdown": size_parts},
        unique_bytes=work.unique_bytes,
        stored_per_unique=(size / work.unique_bytes) if size and work.unique_bytes else None,
    )


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _size_cell(r: Result) -> str:
    parts = r.extra.get("size_breakdown", {})
    if "wal_bytes" in parts:
        return f"{_human_bytes(r.db_bytes)} (-wal {_human_bytes(parts['wal_bytes'])})"
    return _human_bytes(r.db_bytes)


def markdown(results: list[Result], workload: str = "small") -> str:
    head = (
        "| saver | durability | settings | invocations | checkpoints | total s "
        "| median ms/invocation | ms/checkpoint | DB size |"
    )
    columns = 9
    if workload == "large":
        head += " unique_bytes | stored_per_unique |"
        columns += 2
    lines = [head, "|" + "---|" * columns]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.saver} | {r.durability} | skipped: {r.skipped} |" + " |" * (columns - 3))
            continue
        line = (
            f"| {r.saver} | {r.durability} | {r.settings} | {r.invocations} "
            f"| {r.checkpoints} | {r.total_s:.2f} | {r.median_invocation_ms:.2f} "
            f"| {r.per_checkpoint_ms:.3f} | {_size_cell(r)} |"
        )
        if workload == "large":
            ratio = "n/a" if r.stored_per_unique is None else f"{r.stored_per_unique:.2f}"
            line += f" {_human_bytes(r.unique_bytes)} | {ratio} |"
        lines.append(line)
    return "\n".join(lines)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in (
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres",
        "psycopg",
        "steadfast",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark LangGraph checkpointers on a 10-node StateGraph.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--workload", default="small", choices=WORKLOADS, help="small: ~1 KB of state per run; large: W7's 1 MiB documents (default small)")
    p.add_argument("--invocations", type=int, help="graph runs per saver (default 1000 for small, 20 for large)")
    p.add_argument("--doc-bytes", type=int, default=DOC_BYTES, help=f"size of one document of the large workload, more than {BLOB_THRESHOLD} (default {DOC_BYTES})")
    p.add_argument("--only", default=",".join(SAVERS), help=f"savers to run, comma separated (default all: {','.join(SAVERS)})")
    p.add_argument("--durability", default=",".join(DURABILITIES), help="durability settings, comma separated (default: default,fsync)")
    p.add_argument("--pg", help="PostgreSQL URL for the postgres savers, e.g. postgres://postgres@127.0.0.1:5432/test")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--tmpdir", help="where to make the temporary directory for SQLite files (default: the system's)")
    p.add_argument("--keep", action="store_true", help="keep the PostgreSQL schemas and SQLite files afterwards")
    p.add_argument(
        "--graph-durability",
        default="langgraph-default",
        choices=["langgraph-default", "sync", "async", "exit"],
        help="LangGraph's own durability mode passed to invoke (default: LangGraph's default, 'async')",
    )
    args = p.parse_args(argv)
    args.savers = [s.strip() for s in args.only.split(",") if s.strip()]
    args.durabilities = [d.strip() for d in args.durability.split(",") if d.strip()]
    bad = [s for s in args.savers if s not in SAVERS]
    if bad:
        p.error(f"unknown saver(s) {bad}; choose from {SAVERS}")
    bad = [d for d in args.durabilities if d not in DURABILITIES]
    if bad:
        p.error(f"unknown durability setting(s) {bad}; choose from {DURABILITIES}")
    if args.invocations is None:
        args.invocations = DEFAULT_INVOCATIONS[args.workload]
    if args.invocations < 1:
        p.error("--invocations must be at least 1")
    if args.doc_bytes <= BLOB_THRESHOLD:
        p.error(f"--doc-bytes must be more than {BLOB_THRESHOLD} (64 KiB), the size above which Steadfast keeps a value as a blob")
    if args.doc_bytes != DOC_BYTES and args.workload != "large":
        p.error("--doc-bytes is for --workload large")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join([sys.executable, *(sys.argv if argv is None else [sys.argv[0], *argv])])

    if any(s.startswith("steadfast") for s in args.savers):
        try:
            _steadfast_saver_class()
        except ImportError as e:
            print(
                f"error: steadfast is not importable ({e}); build/install it, or run only "
                "the stock savers with --only stock-sqlite,stock-postgres",
                file=sys.stderr,
            )
            return 2

    print(f"command: `{command}`\n")
    versions = _versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if args.workload == "large":
        print(f"workload: large, {args.doc_bytes}-character documents")
    print(f"LangGraph invoke durability: {args.graph_durability}\n", flush=True)

    results: list[Result] = []
    tmp = Path(tempfile.mkdtemp(prefix="lgbench-", dir=args.tmpdir))
    try:
        for name in args.savers:
            for durability in args.durabilities:
                if name.endswith("postgres") and not args.pg:
                    msg = "no --pg URL given"
                    print(f"skip {name}/{durability}: {msg}", file=sys.stderr)
                    results.append(Result(name, durability, "", 0, 0, 0, 0, 0, 0, 0, skipped=msg))
                    continue
                print(f"running {name}/{durability} ...", file=sys.stderr, flush=True)
                r = run_one(name, durability, tmp, args)
                print(
                    f"  {r.checkpoints} checkpoints in {r.total_s:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
                results.append(r)
    finally:
        if args.keep:
            print(f"SQLite files kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(markdown(results, args.workload))
    done = [r for r in results if not r.skipped]
    if done:
        print(f"\nstate after one run: {done[0].state_bytes} bytes as JSON; "
              f"{NODES} nodes per run")
        if args.workload == "large":
            print(f"documents: {DOCS} distinct per run, {args.doc_bytes} characters each, "
                  f"each returned by two nodes in a row")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": command,
                    "versions": versions,
                    "graph_durability": args.graph_durability,
                    "workload": args.workload,
                    "nodes": NODES,
                    **({"doc_bytes": args.doc_bytes} if args.workload == "large" else {}),
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
