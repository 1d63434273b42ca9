"""Guards found by review: a saver whose lease ran out cannot fork a thread
another saver moved on, a forked child cannot write as its parent, a durable
function cannot run steps past a gate it swallowed or record calls it never
awaited, and many runs can wait at once."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import steadfast
from steadfast._native import GraphStore

from conftest import _drop_schema, _with_schema


def put(g: GraphStore, thread: str, cid: str, parent: str | None) -> None:
    g.put(thread, "", cid, parent, "json", b"{}", "{}", None)


def chain(g: GraphStore, thread: str):
    return [(row[2], row[3]) for row in g.list(thread, "")]


def graph_url(request: pytest.FixtureRequest, tmp_path, kind: str) -> str:
    """A graph store's URL: a file, or a PostgreSQL schema of the test's own,
    dropped when the test ends."""
    if kind == "sqlite":
        return f"sqlite:{tmp_path}/graph.db"
    base = os.environ.get("STEADFAST_TEST_PG")
    if not base:
        if os.environ.get("CI"):
            pytest.fail("STEADFAST_TEST_PG is not set under CI")
        pytest.skip("STEADFAST_TEST_PG is not set")
    schema = f"guard_{os.getpid()}_{time.monotonic_ns()}"
    request.addfinalizer(lambda: _drop_schema(base, schema))
    return _with_schema(base, schema)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_saver_whose_lease_lapsed_cannot_fork_a_thread_another_moved_on(request, tmp_path, kind: str) -> None:
    url = graph_url(request, tmp_path, kind)
    a = GraphStore(url, 0.2)
    b = GraphStore(url, 0.2)
    put(a, "t", "01", None)
    with pytest.raises(steadfast.Held):
        put(b, "t", "02", "01")  # a is alive and its lease has not run out
    time.sleep(0.3)
    put(b, "t", "02", "01")  # a's lease ran out: b takes over
    b.release("t")
    # a goes on from where it was, as a node that outlived its lease would.
    with pytest.raises(steadfast.Held, match="fork"):
        put(a, "t", "02a", "01")
    with pytest.raises(steadfast.Held, match="fork"):
        a.put_writes("t", "", "01", "task", "", [(0, "ch", "json", b"1")])
    assert chain(a, "t") == [("02", "01"), ("01", None)]
    # A write that extends the latest checkpoint is fine: a new invocation.
    put(a, "t", "03", "02")
    assert chain(a, "t")[0] == ("03", "02")
    # After release, a fresh start of the thread is not held against anyone.
    a.release("t")
    put(b, "t", "04", "03")


def test_a_forked_child_cannot_write_as_its_parent(tmp_path) -> None:
    g = GraphStore(f"sqlite:{tmp_path}/graph.db")
    put(g, "t", "01", None)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            put(g, "t", "02", "01")
            code = 1
        except steadfast.InvalidInput as e:
            code = 0 if "fork" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert chain(g, "t") == [("01", None)]


def test_steps_after_a_swallowed_gate_do_not_run(tmp_path) -> None:
    store = steadfast.open_store(f"sqlite:{tmp_path}/runs.db")
    paid = []

    @steadfast.durable("swallow")
    async def pay(ctx):
        await asyncio.gather(ctx.gate("approve-payment"), return_exceptions=True)
        try:
            await ctx.step("pay", lambda: paid.append(1) or True)
        except BaseException:
            pass
        return "paid"

    out = pay.run("r", store)
    assert out.waiting and out.gate == "approve-payment"
    assert paid == []
    assert steadfast.show(store, "r")["completed"] == []
    steadfast.approve(store, "r", "approve-payment")
    assert pay.run("r", store).value == "paid"
    assert paid == [1]


def _run_leaving_a_straggler(tmp_path, name, straggler):
    """Runs a durable function that starts `straggler` as a step without
    awaiting it; returns the run's record once the straggler has ended."""
    store = steadfast.open_store(f"sqlite:{tmp_path}/runs.db")

    @steadfast.durable(name)
    async def f(ctx):
        await ctx.step("a", lambda: 1)
        asyncio.ensure_future(ctx.step("notify", straggler))
        return "done"

    with pytest.raises(steadfast.InvalidWorkflow, match="await every ctx call"):
        f.run("r", store)
    time.sleep(0.7)
    return steadfast.show(store, "r")


def test_a_ctx_call_not_awaited_is_refused_not_recorded(tmp_path) -> None:
    record = _run_leaving_a_straggler(tmp_path, "straggler", lambda: time.sleep(0.5) or 2)
    assert record["status"] != "completed"
    assert "notify" not in record["completed"]


def test_a_ctx_call_not_awaited_that_fails_is_not_recorded(tmp_path) -> None:
    def late_failure():
        time.sleep(0.5)
        raise steadfast.TerminalError("a late failure")

    record = _run_leaving_a_straggler(tmp_path, "straggler-fails", late_failure)
    assert record["status"] != "failed"
    assert "a late failure" not in repr(record), record


@pytest.mark.asyncio
async def test_many_runs_wait_at_once() -> None:
    store = steadfast.open_store("memory:")

    @steadfast.durable("fan")
    async def f(ctx, i):
        a = await ctx.step("a", lambda: i)
        b = await ctx.step("b", lambda: a + 1)
        return b

    outs = await asyncio.wait_for(
        asyncio.gather(*(f.run_async(f"r{i}", store, i) for i in range(150))), timeout=60
    )
    assert [o.value for o in outs] == [i + 1 for i in range(150)]


def test_listed_steps_cannot_take_or_write_the_engine_s_names() -> None:
    store = steadfast.open_store("memory:")
    wf = steadfast.Workflow("w")
    with pytest.raises(steadfast.InvalidWorkflow, match="reserved"):
        wf.step("__x", lambda ctx, state: {})
    # A step that returns the engine's keys (its state with a change, say)
    # does not change them: they are dropped, as for every listed step.
    wf.step("clobber", lambda ctx, state: {**state, "__start": "mine", "b": 2}, retries=0)
    out = steadfast.run("r", wf, store, {"a": 1})
    assert out.completed and out.value["b"] == 2
    assert steadfast.show(store, "r")["state"]["__start"] == {"a": 1}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(retries=-1), "retries = -1"),
        (dict(retries=10**6), "retries = 1000000"),
        (dict(timeout=0), "timeout"),
        (dict(timeout=1e300), "1e300"),
        (dict(backoff=-0.5), "backoff"),
    ],
)
def test_step_options_out_of_range_are_input_errors(kwargs, match) -> None:
    store = steadfast.open_store("memory:")
    wf = steadfast.Workflow("w")
    wf.step("s", lambda ctx, state: {}, **kwargs)
    with pytest.raises(steadfast.InvalidInput, match=match):
        steadfast.run("r", wf, store)
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.show(store, "r")


def test_gate_on_timeout_is_checked_without_a_timeout_and_runs_limit_is_checked() -> None:
    store = steadfast.open_store("memory:")
    wf = steadfast.Workflow("w")
    wf.gate("g", on_timeout="maybe")
    with pytest.raises(steadfast.InvalidInput, match="maybe"):
        steadfast.run("r", wf, store)
    with pytest.raises(steadfast.InvalidInput, match="limit=-1"):
        steadfast.runs(store, limit=-1)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_one_saver_writing_a_thread_from_many_threads_is_never_refused(request, tmp_path, kind: str) -> None:
    # LangGraph's default ("async") durability writes checkpoints and writes
    # from background threads, so one saver's writes to a thread overlap.
    from concurrent.futures import ThreadPoolExecutor

    g = GraphStore(graph_url(request, tmp_path, kind))
    put(g, "t", "00", None)

    def write(i: int) -> None:
        if i % 3 == 0:
            put(g, "t", f"{i + 1:04d}", "00")
        else:
            g.put_writes("t", "", "00", f"task-{i}", "", [(0, "ch", "json", b"1")])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(120)))
    assert len(g.list("t", "")) == 41


def test_step_failed_carries_the_step_s_own_exception_as_its_cause() -> None:
    store = steadfast.open_store("memory:")

    class QuotaExceeded(Exception):
        pass

    def call_model(ctx, state):
        raise QuotaExceeded("429 from the model")

    wf = steadfast.Workflow("w")
    wf.step("model", call_model, retries=1, backoff=0.01)
    with pytest.raises(steadfast.StepFailed) as e:
        steadfast.run("listed", wf, store)
    assert isinstance(e.value.__cause__, QuotaExceeded)
    assert str(e.value.__cause__) == "429 from the model"

    @steadfast.durable("d")
    async def agent(ctx):
        async def tool():
            raise KeyError("missing")

        try:
            await ctx.step("tool", tool, retries=0)
        except steadfast.StepFailed as failed:
            assert isinstance(failed.__cause__, KeyError)
            raise

    with pytest.raises(steadfast.StepFailed) as e:
        agent.run("durable", store)
    assert isinstance(e.value.__cause__, KeyError)


def test_encrypted_checkpoints_are_sealed_to_their_row(tmp_path, monkeypatch) -> None:
    import sqlite3

    monkeypatch.setenv("STEADFAST_ENCRYPTION_KEY", "k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=")
    path = tmp_path / "graph.db"
    g = GraphStore(f"sqlite:{path}", 60.0, True)
    g.put("a", "", "01", None, "json", b'{"secret": "hunter2"}', "{}", None)
    g.put("b", "", "01", None, "json", b'{"other": 1}', "{}", None)
    g.put_writes("a", "", "01", "task", "", [(0, "ch", "json", b'"also secret"')])
    assert g.get("a", "")[5] == b'{"secret": "hunter2"}'
    assert g.get("a", "")[7][0][3] == b'"also secret"'
    db = sqlite3.connect(path)
    stored = b"".join(r[0] for r in db.execute("SELECT blob FROM graph_checkpoints UNION ALL SELECT blob FROM graph_writes"))
    assert b"hunter2" not in stored and b"also secret" not in stored
    # A copy opens under its new thread.
    g.copy_thread("a", "c")
    assert g.get("c", "")[5] == b'{"secret": "hunter2"}'
    assert g.get("c", "")[7][0][3] == b'"also secret"'
    # Thread a's sealed blob moved into thread b's row does not open.
    (blob,) = db.execute("SELECT blob FROM graph_checkpoints WHERE thread_id = 'a'").fetchone()
    db.execute("UPDATE graph_checkpoints SET blob = ? WHERE thread_id = 'b'", (blob,))
    db.commit()
    with pytest.raises(steadfast.Corrupt, match="of thread .b."):
        g.get("b", "")
    # Without the key, an encrypted store says so instead of handing back ciphertext.
    plain = GraphStore(f"sqlite:{path}")
    with pytest.raises(steadfast.Corrupt, match="encrypt=True"):
        plain.get("a", "")
    monkeypatch.delenv("STEADFAST_ENCRYPTION_KEY")
    with pytest.raises(steadfast.InvalidInput, match="STEADFAST_ENCRYPTION_KEY"):
        GraphStore(f"sqlite:{path}", 60.0, True)
