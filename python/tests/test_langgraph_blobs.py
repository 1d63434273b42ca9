"""Large channel values of a LangGraph thread are stored once.

A graph whose first node reads a 1 MiB document into a channel and whose
next nodes leave it unchanged writes a checkpoint per node, each carrying
the document. SteadfastSaver keeps a channel value longer than the store's
blob threshold apart from the checkpoint, once per thread: the database
holds the document once, every checkpoint reads it back whole, and deleting
the thread frees it. On SQLite always; on PostgreSQL at `$STEADFAST_TEST_PG`
(in a schema of its own).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import pytest

from steadfast.langgraph import SteadfastSaver

DOC_BYTES = 1 << 20
NODES = 6


class State(TypedDict):
    doc: str
    visits: int


def build(doc: str):
    from langgraph.graph import END, START, StateGraph

    def read(state: State) -> dict:
        return {"doc": doc, "visits": state["visits"] + 1}

    def think(state: State) -> dict:
        return {"visits": state["visits"] + 1}

    g = StateGraph(State)
    names = [f"n{i}" for i in range(NODES)]
    g.add_node(names[0], read)
    for name in names[1:]:
        g.add_node(name, think)
    g.add_edge(START, names[0])
    for a, b in zip(names, names[1:]):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, object]]:
    """A saver URL and a way to count rows of one of its tables."""
    if request.param == "sqlite":
        path = tmp_path / "graph.db"

        def count(sql: str) -> int:
            with sqlite3.connect(path) as conn:
                return conn.execute(sql.replace("{s}.", "")).fetchone()[0]

        yield f"sqlite:{path}", count
        return
    base = os.environ.get("STEADFAST_TEST_PG")
    if not base:
        reason = "STEADFAST_TEST_PG is not set, so the PostgreSQL case did not run"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    import psycopg

    schema = f"lgb_{uuid.uuid4().hex[:16]}"

    def count(sql: str) -> int:
        with psycopg.connect(base, autocommit=True) as conn:
            return conn.execute(sql.replace("{s}.", f'"{schema}".')).fetchone()[0]

    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}schema={schema}", count
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_an_unchanged_large_channel_is_stored_once_per_thread(store) -> None:
    url, count = store
    doc = secrets.token_urlsafe(DOC_BYTES)[:DOC_BYTES]
    with SteadfastSaver(url) as saver:
        graph = build(doc).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "reader"}}
        graph.invoke({"doc": "", "visits": 0}, config)

        checkpoints = list(saver.list(config))
        assert len(checkpoints) == NODES + 2  # the input, before n0, one per node
        carrying = [c for c in checkpoints if c.checkpoint["channel_values"].get("doc") == doc]
        assert len(carrying) == NODES, "every checkpoint after n0 reads the whole document back"
        assert graph.get_state(config).values == {"doc": doc, "visits": NODES}

        # The document is one blob: the checkpoints refer to it, and n0's
        # pending write of it is the same bytes.
        assert count("SELECT count(*) FROM {s}.graph_blobs") == 1
        stored = count("SELECT sum(length(data)) FROM {s}.graph_blobs")
        assert DOC_BYTES <= stored < DOC_BYTES + 64
        assert count("SELECT count(*) FROM {s}.graph_channels") == NODES
        inline = count("SELECT coalesce(sum(length(blob)), 0) FROM {s}.graph_checkpoints")
        assert inline < NODES * 16 * 1024, f"checkpoints hold {inline} bytes inline"

        # A copy has its own; deleting both threads frees every blob.
        saver.copy_thread("reader", "reader-copy")
        assert count("SELECT count(*) FROM {s}.graph_blobs") == 2
        copy = saver.get_tuple({"configurable": {"thread_id": "reader-copy"}})
        assert copy is not None and copy.checkpoint["channel_values"]["doc"] == doc
        saver.delete_thread("reader")
        saver.delete_thread("reader-copy")
        assert count("SELECT count(*) FROM {s}.graph_blobs") == 0
        assert count("SELECT count(*) FROM {s}.graph_channels") == 0


def test_a_threshold_from_the_url_decides_what_is_large(tmp_path: Path) -> None:
    path = tmp_path / "graph.db"
    with SteadfastSaver(f"sqlite:{path}?blob_threshold=2MiB") as saver:
        assert saver._store.blob_threshold == 2 << 20
        doc = "d" * DOC_BYTES
        graph = build(doc).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "inline"}}
        graph.invoke({"doc": "", "visits": 0}, config)
        assert graph.get_state(config).values["doc"] == doc
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM graph_blobs").fetchone()[0] == 0
    with pytest.raises(Exception, match="blob_threshold"):
        SteadfastSaver(f"sqlite:{path}?blob_threshold=12")


# A test key (not a secret): 32 bytes, base64.
TEST_KEY = "k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80="


def test_encrypted_large_values_read_back_and_are_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEADFAST_ENCRYPTION_KEY", TEST_KEY)
    path = tmp_path / "graph.db"
    marker = "plain-text-marker-"
    doc = (marker * (DOC_BYTES // len(marker) + 1))[:DOC_BYTES]
    with SteadfastSaver(f"sqlite:{path}", encrypt=True) as saver:
        graph = build(doc).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "secret"}}
        graph.invoke({"doc": "", "visits": 0}, config)
        assert graph.get_state(config).values["doc"] == doc
    with sqlite3.connect(path) as conn:
        blobs = conn.execute("SELECT data FROM graph_blobs").fetchall()
    assert blobs, "the document went to the blob table"
    # Sealed under a fresh nonce each time: nothing readable, and (as for
    # runs) no sharing between sealed copies.
    assert all(marker.encode() not in data for (data,) in blobs)
    assert len(blobs) == NODES + 1
