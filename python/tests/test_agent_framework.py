"""steadfast.agent_framework.SteadfastCheckpointStorage: Agent Framework's
CheckpointStorage protocol, tested from its documentation (the
agent-framework-core package ships no tests of its own), one writer per
workflow run, and a real workflow with a human in the loop killed in the
middle of a superstep and resumed from the storage."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("agent_framework") if not os.environ.get("CI") else None

from agent_framework import WorkflowCheckpoint  # noqa: E402
from agent_framework.exceptions import WorkflowCheckpointException  # noqa: E402

import steadfast  # noqa: E402
from steadfast.agent_framework import SteadfastCheckpointStorage  # noqa: E402

from conftest import PG_ENV, _drop_schema, _with_schema  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "maf_review.py"


# The local Cosmos server's well-known account key (not a secret: it opens
# only the test server on 127.0.0.1).
COSMOS_KEY = "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="


def _url(kind: str, tmp_path: Path):
    """A store URL of `kind` for one test, and what to drop afterwards."""
    if kind == "memory":
        return "memory:", None
    if kind == "sqlite":
        return f"sqlite:{tmp_path}/maf.db", None
    if kind == "file":
        return f"file:{tmp_path}/maf.json", None
    if kind == "cosmos":
        server, ca = os.environ.get("STEADFAST_TEST_COSMOS"), os.environ.get("STEADFAST_TEST_COSMOS_CA")
        if not server or not ca:
            if os.environ.get("CI"):
                pytest.fail("STEADFAST_TEST_COSMOS and STEADFAST_TEST_COSMOS_CA are not set: .ci/run starts the server")
            pytest.skip("no Cosmos test server (run ci/cosmos/start.sh DIR and export what it prints)")
        key = tmp_path / "cosmos-key"
        if not key.exists():
            key.write_text(COSMOS_KEY)
            key.chmod(0o600)
        return f"{server}/maf{secrets.token_hex(6)}/runs?keyfile={key}&cafile={ca}", None
    base = os.environ.get(PG_ENV)
    if not base:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but ${PG_ENV} is not: the PostgreSQL storage would go untested")
        pytest.skip(f"set ${PG_ENV} to test the postgres storage")
    schema = f"maf_{secrets.token_hex(6)}"
    return _with_schema(base, schema), (base, schema)


def _each(request: pytest.FixtureRequest, tmp_path: Path):
    url, drop = _url(request.param, tmp_path)
    try:
        yield url
    finally:
        if drop is not None:
            _drop_schema(*drop)


@pytest.fixture(params=["memory", "sqlite", "postgres", "file", "cosmos"])
def maf_url(request: pytest.FixtureRequest, tmp_path: Path):
    yield from _each(request, tmp_path)


@pytest.fixture(params=["sqlite", "postgres", "file", "cosmos"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path):
    """A store two storages (or processes) open by URL: every kind but memory."""
    yield from _each(request, tmp_path)


def checkpoint(workflow: str = "wf", previous: str | None = None, **kw) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(
        workflow_name=workflow, graph_signature_hash="sig", previous_checkpoint_id=previous, **kw
    )


def run(coro):
    return asyncio.run(coro)


def test_save_load_list_latest_delete(maf_url: str) -> None:
    s = SteadfastCheckpointStorage(maf_url)

    async def go() -> None:
        a = checkpoint(state={"n": 1, "nested": {"x": [1, 2.5, "três", None]}}, iteration_count=1,
                       timestamp="2026-12-01T10:00:00+00:00", metadata={"superstep": 1})
        b = checkpoint(previous=a.checkpoint_id, state={"n": 2}, timestamp="2026-12-01T10:00:01+00:00")
        other = checkpoint(workflow="other", timestamp="2026-12-01T11:00:00+00:00")
        assert await s.save(a) == a.checkpoint_id
        assert await s.save(b) == b.checkpoint_id
        await s.save(other)
        loaded = await s.load(a.checkpoint_id)
        assert loaded.to_dict() == a.to_dict()
        assert loaded is not a
        assert [c.checkpoint_id for c in await s.list_checkpoints(workflow_name="wf")] == [a.checkpoint_id, b.checkpoint_id]
        assert await s.list_checkpoint_ids(workflow_name="other") == [other.checkpoint_id]
        assert await s.list_checkpoints(workflow_name="nothing") == []
        assert (await s.get_latest(workflow_name="wf")).checkpoint_id == b.checkpoint_id
        assert await s.get_latest(workflow_name="nothing") is None
        with pytest.raises(WorkflowCheckpointException, match="No checkpoint found"):
            await s.load("no-such-id")
        assert await s.delete(b.checkpoint_id) is True
        assert await s.delete(b.checkpoint_id) is False
        assert await s.list_checkpoint_ids(workflow_name="wf") == [a.checkpoint_id]
        with pytest.raises(WorkflowCheckpointException):
            await s.load(b.checkpoint_id)
        # Saving an ID again replaces it.
        a.state = {"n": 10}
        await s.save(a)
        assert (await s.load(a.checkpoint_id)).state == {"n": 10}

    run(go())
    s.close()


def test_checkpoints_survive_a_new_storage(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/maf.db"
    first = SteadfastCheckpointStorage(url)
    cp = checkpoint(state={"kept": True})
    run(first.save(cp))
    first.close()
    del first
    again = SteadfastCheckpointStorage(url)
    assert run(again.load(cp.checkpoint_id)).state == {"kept": True}


@dataclass
class NotAllowed:
    value: int


def test_a_checkpoint_that_would_not_load_back_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    s = SteadfastCheckpointStorage(f"sqlite:{tmp_path}/maf.db")
    cp = checkpoint(state={"obj": NotAllowed(1)})
    with pytest.raises(WorkflowCheckpointException, match="deserialization blocked"):
        run(s.save(cp))
    assert run(s.list_checkpoints(workflow_name="wf")) == []
    allowed = SteadfastCheckpointStorage(
        f"sqlite:{tmp_path}/maf.db", allowed_checkpoint_types=[f"{NotAllowed.__module__}:NotAllowed"]
    )
    run(allowed.save(cp))
    assert run(allowed.load(cp.checkpoint_id)).state == {"obj": NotAllowed(1)}
    with pytest.raises(TypeError, match="not one string"):
        SteadfastCheckpointStorage("memory:", allowed_checkpoint_types="x:y")  # type: ignore[arg-type]


def test_urls_no_store_opens_and_bad_leases_are_refused(tmp_path: Path) -> None:
    with pytest.raises(steadfast.Unsupported):
        SteadfastCheckpointStorage(f"ftp://{tmp_path}/runs")
    with pytest.raises(steadfast.InvalidInput):
        SteadfastCheckpointStorage("memory:", lease_seconds=-1)


def test_a_large_checkpoint_and_odd_text_round_trip(maf_url: str) -> None:
    s = SteadfastCheckpointStorage(maf_url)
    # Over a megabyte of escapes, beyond what one document holds.
    big = '"\\\n\u0001 é 😀 ' * 120_000
    cp = checkpoint(state={"big": big, "lone": "a\udc80b", "nan-free": 1.5})
    run(s.save(cp))
    assert run(s.load(cp.checkpoint_id)).state == cp.state
    if maf_url != "memory:":
        # Read back by another storage, from the store itself.
        again = SteadfastCheckpointStorage(maf_url)
        assert run(again.get_latest(workflow_name="wf")).state == cp.state


def test_hostile_checkpoints_are_refused_with_nothing_written(tmp_path: Path) -> None:
    s = SteadfastCheckpointStorage(f"file:{tmp_path}/maf.json")
    deep: dict = {}
    cur = deep
    for _ in range(5000):
        cur["x"] = {}
        cur = cur["x"]
    for bad in [
        checkpoint(state={"deep": deep}),
        checkpoint(workflow=""),
        checkpoint(timestamp="t" * 2000),
        checkpoint(workflow="w\udc80"),
    ]:
        with pytest.raises((WorkflowCheckpointException, steadfast.InvalidInput)):
            run(s.save(bad))
    assert run(s.list_checkpoints(workflow_name="wf")) == []
    assert run(s.list_checkpoints(workflow_name="")) == []


def test_equal_timestamps_keep_their_order_of_saving(tmp_path: Path) -> None:
    s = SteadfastCheckpointStorage(f"sqlite:{tmp_path}/maf.db")
    when = "2026-12-01T10:00:00+00:00"
    first = checkpoint(checkpoint_id="z-first", timestamp=when)
    second = checkpoint(checkpoint_id="a-second", previous="z-first", timestamp=when)
    run(s.save(first))
    run(s.save(second))
    assert run(s.get_latest(workflow_name="wf")).checkpoint_id == "a-second"


def test_one_writer_per_workflow_run_on_every_shared_store(shared_url: str) -> None:
    a, b = SteadfastCheckpointStorage(shared_url), SteadfastCheckpointStorage(shared_url)
    root = checkpoint(state={"step": 0})
    run(a.save(root))
    fork = checkpoint(previous=root.checkpoint_id, state={"step": "b"})
    with pytest.raises(steadfast.Held):
        run(b.save(fork))
    with pytest.raises(steadfast.Held):
        run(b.load(root.checkpoint_id))
    assert run(b.list_checkpoint_ids(workflow_name="wf")) == [root.checkpoint_id], "a refused save wrote nothing"
    a.close()
    run(b.save(fork))
    assert run(a.list_checkpoints(workflow_name="wf"))[-1].state == {"step": "b"}
    with pytest.raises(steadfast.Held):
        run(a.load(fork.checkpoint_id))


def test_encrypted_checkpoints_are_sealed_and_need_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"file:{tmp_path}/maf.json"
    monkeypatch.delenv("STEADFAST_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("STEADFAST_ENCRYPTION_KEY_FILE", raising=False)
    with pytest.raises(steadfast.InvalidInput, match="needs the keys"):
        SteadfastCheckpointStorage(url, encrypt=True)
    monkeypatch.setenv("STEADFAST_ENCRYPTION_KEY", "k1:" + base64.b64encode(bytes(range(32))).decode())
    sealed = SteadfastCheckpointStorage(url, encrypt=True)
    cp = checkpoint(state={"secret": "the launch code is 1234"})
    run(sealed.save(cp))
    assert "launch code" not in (tmp_path / "maf.json").read_text()
    assert run(sealed.load(cp.checkpoint_id)).state == {"secret": "the launch code is 1234"}
    sealed.close()
    plain = SteadfastCheckpointStorage(url)
    assert run(plain.list_checkpoints(workflow_name="wf")) == [], "unreadable here: skipped"
    with pytest.raises(steadfast.SteadfastError, match="encrypt"):
        run(plain.load(cp.checkpoint_id))
    # A checkpoint written in plain text is refused where seals are expected.
    planted = checkpoint(state={"forged": True})
    run(plain.save(planted))
    plain.close()
    assert run(sealed.list_checkpoint_ids(workflow_name="wf")) == [cp.checkpoint_id]
    with pytest.raises(steadfast.SteadfastError, match="not sealed"):
        run(sealed.load(planted.checkpoint_id))


def test_one_writer_per_workflow_run(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/maf.db"
    a, b = SteadfastCheckpointStorage(url), SteadfastCheckpointStorage(url)
    root = checkpoint(state={"step": 0})
    run(a.save(root))
    # B resumed from the same checkpoint while A still runs: refused.
    fork = checkpoint(previous=root.checkpoint_id, state={"step": "b"})
    with pytest.raises(steadfast.Held):
        run(b.save(fork))
    with pytest.raises(WorkflowCheckpointException):
        run(b.load(fork.checkpoint_id))
    # Another workflow run is B's to write.
    run(b.save(checkpoint(state={"other run": True})))
    # A's next checkpoint in its own run goes on.
    run(a.save(checkpoint(previous=root.checkpoint_id, state={"step": 1})))
    a.release(root.checkpoint_id)
    run(b.save(fork))
    assert run(b.load(fork.checkpoint_id)).state == {"step": "b"}


def events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def example(url: str, *args: str, log: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, str(EXAMPLE), "--store", url, *args]
    if log is not None:
        cmd += ["--log", str(log)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_workflow_killed_mid_superstep_resumes_and_its_human_answers(shared_url: str, tmp_path: Path) -> None:
    url = shared_url
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    p = example(url, "--topic", "tides", "--delay", "0.2", log=first)
    deadline = time.monotonic() + 30
    while not any(e["event"] == "start" and e["step"] == "polish" for e in events(first)):
        assert p.poll() is None, f"the workflow ended before it was killed: {p.communicate()}"
        assert time.monotonic() < deadline, "the workflow did not reach polish"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    assert p.returncode == -signal.SIGKILL
    assert not any(e["event"] == "end" and e["step"] == "polish" for e in events(first)), "killed while polish ran"

    p = example(url, "--resume", "--delay", "0", log=second)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 4, err
    waiting = json.loads(out)
    assert waiting["status"] == "waiting" and len(waiting["pending"]) == 1
    assert [e["step"] for e in events(second) if e["event"] == "start"] == ["polish", "review"]

    p = example(url, "--answer", "ship it")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out)["outputs"] == ["a draft about tides, polished: ship it"]


def _example_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("maf_review_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    mod.DELAY = 0
    return mod


def test_resuming_a_run_another_live_storage_holds_fails_with_held_before_anything_runs(tmp_path: Path) -> None:
    """Agent Framework logs and swallows an error from save, so a refused save
    alone would let a second resume run everything unrecorded: the load that
    starts a resume claims the run, and its Held reaches the caller."""
    ex = _example_module()
    url = f"sqlite:{tmp_path}/maf.db"
    a, b = SteadfastCheckpointStorage(url), SteadfastCheckpointStorage(url)

    async def go() -> None:
        first = await ex.build(a).run("tides")
        assert [e.request_id for e in first.get_request_info_events()]
        latest = await b.get_latest(workflow_name=ex.NAME)
        answers = {rid: "from B" for rid in latest.pending_request_info_events}
        # Agent Framework wraps what load raised: Held is the cause.
        with pytest.raises(WorkflowCheckpointException) as refused:
            await ex.build(b).run(checkpoint_id=latest.checkpoint_id, responses=answers)
        assert isinstance(refused.value.__cause__, steadfast.Held)
        assert (await b.get_latest(workflow_name=ex.NAME)).checkpoint_id == latest.checkpoint_id, "B wrote nothing"
        a.close()
        done = await ex.build(b).run(checkpoint_id=latest.checkpoint_id, responses=answers)
        assert done.get_outputs() == ["a draft about tides, polished: from B"]

    run(go())


def test_a_checkpoint_this_storage_cannot_read_does_not_hide_the_others(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/maf.db"
    allowed = SteadfastCheckpointStorage(url, allowed_checkpoint_types=[f"{NotAllowed.__module__}:NotAllowed"])
    odd = checkpoint(state={"obj": NotAllowed(2)}, timestamp="2026-12-01T10:00:00+00:00")
    plain = checkpoint(state={"n": 1}, timestamp="2026-12-01T10:00:01+00:00")
    run(allowed.save(odd))
    run(allowed.save(plain))
    strict = SteadfastCheckpointStorage(url)
    assert run(strict.list_checkpoint_ids(workflow_name="wf")) == [plain.checkpoint_id]
    assert run(strict.get_latest(workflow_name="wf")).checkpoint_id == plain.checkpoint_id
    allowed.close()
    with pytest.raises(WorkflowCheckpointException, match="blocked"):
        run(strict.load(odd.checkpoint_id))


def test_a_checkpoint_of_another_workflow_starts_a_run_of_its_own(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/maf.db"
    a, b = SteadfastCheckpointStorage(url), SteadfastCheckpointStorage(url)
    root = checkpoint(workflow="one")
    run(a.save(root))
    other = checkpoint(workflow="two", previous=root.checkpoint_id)
    run(b.save(other))  # not Held: it does not join workflow one's run
    run(a.save(checkpoint(workflow="one", previous=root.checkpoint_id)))


def test_ids_and_names_that_are_not_text_are_simply_absent() -> None:
    s = SteadfastCheckpointStorage("memory:")
    with pytest.raises(WorkflowCheckpointException):
        run(s.load("q\udc80"))
    assert run(s.delete("q\udc80")) is False
    assert run(s.list_checkpoints(workflow_name="zz\udc80")) == []
