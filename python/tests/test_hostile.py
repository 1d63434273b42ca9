"""Hostile inputs at the Python boundary: each is a clear error or a correct
result, never a crash, a hang or a store that can no longer be read."""

from __future__ import annotations

import math
import os

import pytest

import steadfast
from steadfast._native import GraphStore


def nested(depth: int) -> list:
    """A list holding a list holding a list…, `depth` deep."""
    top: list = []
    cur = top
    for _ in range(depth):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    return top


def test_graph_store_urls_and_files(tmp_path) -> None:
    with pytest.raises(steadfast.InvalidInput, match="expected sqlite:PATH"):
        GraphStore("sqlite:")
    with pytest.raises(steadfast.Unsupported, match="ftp://"):
        GraphStore("ftp://example")
    with pytest.raises(steadfast.InvalidInput, match="directory"):
        GraphStore(f"sqlite:{tmp_path}")
    # A FIFO would make SQLite wait for a writer or fail with a bare I/O
    # error; a file others may write could have been planted.
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    with pytest.raises(steadfast.InvalidInput, match="not a regular file"):
        GraphStore(f"sqlite:{fifo}")
    planted = tmp_path / "planted.db"
    GraphStore(f"sqlite:{planted}").close()
    os.chmod(planted, 0o666)
    with pytest.raises(steadfast.InvalidInput, match="planted.db"):
        GraphStore(f"sqlite:{planted}")
    os.chmod(planted, 0o600)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(steadfast.InvalidInput, match="shared"):
        GraphStore(f"sqlite:{shared}/graph.db")
    assert not (shared / "graph.db").exists(), "nothing is created in a directory others can write"
    made = tmp_path / "new" / "dir" / "graph.db"
    GraphStore(f"sqlite:{made}").close()
    assert made.parent.stat().st_mode & 0o777 == 0o700
    assert made.stat().st_mode & 0o777 == 0o600, "a new graph database is the user's alone"
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(steadfast.Corrupt, match="junk.db"):
        GraphStore(f"sqlite:{junk}")
    assert junk.read_bytes() == b"not a database at all" * 100, "a corrupt file is never replaced"
    link = tmp_path / "link.db"
    os.symlink(junk, link)
    with pytest.raises(steadfast.Corrupt):
        GraphStore(f"sqlite:{link}")
    assert junk.read_bytes() == b"not a database at all" * 100


@pytest.mark.parametrize("seconds", [math.nan, -1.0, math.inf, 1e20, 0.001, 10.0 * 86400])
def test_lease_seconds_out_of_range(seconds: float) -> None:
    with pytest.raises(steadfast.InvalidInput, match="lease_seconds"):
        GraphStore("memory:", seconds)


def test_graph_store_rows_and_queries() -> None:
    g = GraphStore("memory:")
    for bad in ["{nope", "[1]", "[" * 100_000 + "]" * 100_000, "", "null"]:
        with pytest.raises(steadfast.InvalidInput, match="not a JSON object; nothing was written|not a JSON object"):
            g.put("t", "", "1", None, "json", b"x", bad, None)
    assert g.list("t") == []
    # Empty and NUL-holding ids are kept and read back as given.
    g.put("", "", "1", None, "json", b"", "{}", None)
    assert g.get("", "")[:3] == ("", "", "1")
    g.put("a\x00b", "n\x00s", "1\x00", None, "json", b"\x00\xff", '{"k": "\\u0000"}', None)
    row = g.get("a\x00b", "n\x00s")
    assert row[2] == "1\x00" and row[5] == b"\x00\xff" and row[6] == '{"k": "\\u0000"}'
    for bad in ["[1]", '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "nope"]:
        with pytest.raises(steadfast.InvalidInput, match="filter"):
            g.list(filter=bad)
    assert len(g.list(limit=2**63)) == 2
    assert len(g.list(limit=10**30)) == 2
    with pytest.raises(steadfast.InvalidInput, match="limit=-1"):
        g.list(limit=-1)
    g.put_writes("t", "", "1", "task", "", [(2**63 - 1, "c", "t", b"")])
    assert g.get("t", "1") is None  # writes without their checkpoint are kept, not a checkpoint


def test_values_at_the_boundary() -> None:
    store = steadfast.open_store("memory:")
    deep = nested(5000)
    with pytest.raises(steadfast.InvalidInput) as e:
        steadfast.start(store, "w", "deep", {"d": deep})
    assert "nested deeper" in str(e.value) and len(str(e.value)) < 600, "a deep path is shortened"
    with pytest.raises(steadfast.InvalidInput, match="not valid Unicode"):
        steadfast.start(store, "w", "surrogate", {"\ud800": 1})
    with pytest.raises(steadfast.InvalidRunId, match="100000 bytes"):
        steadfast.start(store, "w", "x" * 100_000, {})
    with pytest.raises(steadfast.InvalidRunId, match="empty"):
        steadfast.show(store, "")
    far = steadfast.Workflow("w")
    far.step("a", lambda ctx, state: {}, timeout=1e18)
    with pytest.raises(steadfast.InvalidInput, match="timeout"):
        steadfast.run("far", far, store)
    with pytest.raises(steadfast.InvalidInput, match="sleep"):
        steadfast.run("later", steadfast.Workflow("w").sleep("z", 1e12), store)
    assert steadfast.runs(store) == [], "nothing was written by any of these"


def test_a_step_returning_a_deep_value_names_a_short_path() -> None:
    store = steadfast.open_store("memory:")
    deep = nested(3000)
    wf = steadfast.Workflow("w")
    wf.step("deep", lambda ctx, state: {"d": deep}, retries=0)
    with pytest.raises(steadfast.InvalidValue) as e:
        steadfast.run("r", wf, store)
    assert "…" in str(e.value) and len(str(e.value)) < 600
    assert steadfast.show(store, "r")["state"] == {}
