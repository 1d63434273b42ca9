"""Two OS processes write one LangGraph thread at the same time.

Process A starts a run on thread "t1", writes its first checkpoints and then
stops inside a node until the test lets it go.  While A is paused, process B
runs the same thread from start to end.  Then A finishes.

* The stock ``SqliteSaver`` accepts both writers without a word: A's paused
  checkpoint ends up with two children (one written by B, one by A), so the
  thread's history forks and B's work sits on a side branch.
* ``SteadfastSaver`` gives A a lease on the thread at its first write, so B's
  first write fails with ``steadfast.Held`` and the chain stays linear.

This file is also the helper script: the test runs it with ``sys.executable``
in the ``run`` and ``dump`` modes (see ``_main`` at the bottom).
"""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, TypedDict

THREAD = "t1"
HELPER = str(Path(__file__).resolve())
# Limits: every wait in the helper and in the test is bounded, and one whole
# scenario stays well under ten seconds on a loaded machine.
PAUSE_LIMIT = 8.0  # how long A waits for the go file at most
STEP_TIMEOUT = 9.0  # per subprocess wait in the test
HELD_MARK = "HELD steadfast.Held"


# --------------------------------------------------------------------------
# Helper-script side
# --------------------------------------------------------------------------


def _open_saver(kind: str, db: str):
    """Return (saver, close) for the saver named by ``kind``."""
    if kind == "stock":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(db, check_same_thread=False)
        return SqliteSaver(conn), conn.close
    if kind == "steadfast":
        from steadfast.langgraph import SteadfastSaver

        saver = SteadfastSaver(f"sqlite:{db}")
        close = getattr(saver, "close", None) or (lambda: None)
        return saver, close
    raise SystemExit(f"unknown saver kind {kind!r}")


def _build_graph(role: str, workdir: Path):
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        log: Annotated[list[str], operator.add]

    def first(state: State) -> dict:
        return {"log": [f"{role}:first"]}

    def wait(state: State) -> dict:
        if role == "A":
            # The checkpoint after "first" is already stored (durability
            # "sync"); say so, then hold the thread open until told to go on.
            (workdir / "a_paused").touch()
            deadline = time.monotonic() + PAUSE_LIMIT
            while not (workdir / "go").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("process A: no go file within the limit")
                time.sleep(0.02)
        return {"log": [f"{role}:wait"]}

    def last(state: State) -> dict:
        return {"log": [f"{role}:last"]}

    g = StateGraph(State)
    g.add_node("first", first)
    g.add_node("wait", wait)
    g.add_node("last", last)
    g.add_edge(START, "first")
    g.add_edge("first", "wait")
    g.add_edge("wait", "last")
    g.add_edge("last", END)
    return g


def _held_in_chain(exc: BaseException):
    """The first steadfast.Held in the exception's cause/context chain."""
    try:
        import steadfast
    except ImportError:
        return None
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, steadfast.Held):
            return e
        e = e.__cause__ or e.__context__
    return None


def _run(kind: str, db: str, role: str, workdir: Path) -> int:
    saver, close = _open_saver(kind, db)
    try:
        graph = _build_graph(role, workdir).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": THREAD}}
        try:
            out = graph.invoke(
                {"log": [f"{role}:input"]}, config, durability="sync"
            )
        except Exception as e:  # reported to the test through stderr
            held = _held_in_chain(e)
            cls = type(e)
            print(f"ERROR {cls.__module__}.{cls.__qualname__}: {e}", file=sys.stderr)
            if held is not None:
                print(f"{HELD_MARK}: {held}", file=sys.stderr)
            return 3
        print(json.dumps({"role": role, "log": out["log"]}))
        return 0
    finally:
        close()


def _dump(kind: str, db: str) -> int:
    """Print the thread's checkpoints as JSON, newest first."""
    saver, close = _open_saver(kind, db)
    try:
        rows = []
        for t in saver.list({"configurable": {"thread_id": THREAD}}):
            if t.config["configurable"].get("checkpoint_ns", "") != "":
                continue
            parent = None
            if t.parent_config is not None:
                parent = t.parent_config["configurable"]["checkpoint_id"]
            rows.append(
                {
                    "id": t.config["configurable"]["checkpoint_id"],
                    "parent": parent,
                    "step": t.metadata.get("step"),
                    "source": t.metadata.get("source"),
                    "log": t.checkpoint["channel_values"].get("log"),
                }
            )
        print(json.dumps(rows))
        return 0
    finally:
        close()


def _main(argv: list[str]) -> int:
    mode, kind, db = argv[0], argv[1], argv[2]
    if mode == "run":
        return _run(kind, db, argv[3], Path(argv[4]))
    if mode == "dump":
        return _dump(kind, db)
    raise SystemExit(f"unknown mode {mode!r}")


# --------------------------------------------------------------------------
# Test side
# --------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, HELPER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(p: subprocess.Popen, name: str) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"process {name} did not finish in time:\n{err}")
    return p.returncode, out, err


def _race(kind: str, tmp_path: Path) -> dict:
    """A pauses mid-graph on t1, B runs t1 fully, then A goes on."""
    db = str(tmp_path / "checkpoints.db")
    a = _spawn("run", kind, db, "A", str(tmp_path))
    try:
        deadline = time.monotonic() + STEP_TIMEOUT
        while not (tmp_path / "a_paused").exists():
            if a.poll() is not None or time.monotonic() > deadline:
                _, _, err = _finish(a, "A")
                raise AssertionError(f"process A never paused:\n{err}")
            time.sleep(0.02)
        b_rc, b_out, b_err = _finish(_spawn("run", kind, db, "B", str(tmp_path)), "B")
    finally:
        (tmp_path / "go").touch()
    a_rc, a_out, a_err = _finish(a, "A")
    d_rc, d_out, d_err = _finish(_spawn("dump", kind, db), "dump")
    assert d_rc == 0, d_err
    return {
        "a": (a_rc, a_out, a_err),
        "b": (b_rc, b_out, b_err),
        "rows": json.loads(d_out),
    }


def _children(rows: list[dict]) -> dict[str | None, list[str]]:
    kids: dict[str | None, list[str]] = {}
    for r in rows:
        kids.setdefault(r["parent"], []).append(r["id"])
    return kids


def _forks(rows: list[dict]) -> dict[str, list[str]]:
    """Parents with more than one child (the root's None parent counts too)."""
    return {p: ids for p, ids in _children(rows).items() if len(ids) > 1}


def test_stock_sqlite_saver_forks_the_thread(tmp_path: Path) -> None:
    r = _race("stock", tmp_path)
    a_rc, _, a_err = r["a"]
    b_rc, _, b_err = r["b"]
    # Neither writer is told about the other.
    assert a_rc == 0, a_err
    assert b_rc == 0, b_err
    rows = r["rows"]
    forks = _forks(rows)
    assert forks, f"expected a fork, chain was linear: {rows}"
    # One fork, at the checkpoint A had written when it paused: one branch
    # below it holds B's run, the other A's run and nothing of B's.
    assert len(forks) == 1, forks
    (parent, kids), = forks.items()
    assert parent is not None, forks
    writers = sorted((_writers_below(rows, k) for k in kids), key=len)
    assert writers == [{"A"}, {"A", "B"}], (parent, kids, writers)


def _writers_below(rows: list[dict], start: str) -> set[str]:
    """Roles named in the logs of ``start`` and every checkpoint under it."""
    kids = _children(rows)
    by_id = {row["id"]: row for row in rows}
    roles: set[str] = set()
    todo = [start]
    while todo:
        cid = todo.pop()
        roles.update(e.split(":")[0] for e in by_id[cid]["log"] or [])
        todo.extend(kids.get(cid, []))
    return roles


def test_steadfast_saver_refuses_the_second_writer(tmp_path: Path) -> None:
    # Imported here, not skipped: this test must fail while steadfast is missing.
    import steadfast  # noqa: F401
    from steadfast.langgraph import SteadfastSaver  # noqa: F401

    r = _race("steadfast", tmp_path)
    a_rc, a_out, a_err = r["a"]
    b_rc, _, b_err = r["b"]
    assert b_rc != 0, f"process B should have been refused:\n{b_err}"
    assert HELD_MARK in b_err, b_err
    assert a_rc == 0, a_err
    assert json.loads(a_out)["log"] == ["A:input", "A:first", "A:wait", "A:last"]
    rows = r["rows"]
    assert rows, "no checkpoints were stored"
    assert not _forks(rows), f"two children of one parent: {rows}"
    # Nothing of B's reached the store.
    assert all(not e.startswith("B:") for row in rows for e in row["log"] or []), rows


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
