"""The Python API on the Azure Cosmos DB store, against the local protocol
server that `.ci/run` starts (`ci/cosmos/start.sh`)."""

from __future__ import annotations

import os
import secrets

import pytest

import steadfast

# The local server's well-known account key (not a secret: it opens only the
# test server on 127.0.0.1).
TEST_KEY = "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="


@pytest.fixture
def cosmos(tmp_path) -> steadfast.Store:
    server, ca = os.environ.get("STEADFAST_TEST_COSMOS"), os.environ.get("STEADFAST_TEST_COSMOS_CA")
    if not server or not ca:
        if os.environ.get("CI"):
            pytest.fail("STEADFAST_TEST_COSMOS and STEADFAST_TEST_COSMOS_CA are not set: .ci/run starts the server")
        pytest.skip("no Cosmos test server (run ci/cosmos/start.sh DIR and export what it prints)")
    key = tmp_path / "key"
    key.write_text(TEST_KEY)
    key.chmod(0o600)
    url = f"{server}/py{secrets.token_hex(8)}/runs?keyfile={key}&cafile={ca}"
    return steadfast.open_store(url)


def test_listed_workflow_with_a_gate_on_cosmos(cosmos) -> None:
    wf = steadfast.Workflow("review")
    calls = []
    wf.step("draft", lambda ctx, state: calls.append("draft") or {"draft": state["topic"].upper()})
    wf.gate("approve")
    wf.step("publish", lambda ctx, state: calls.append("publish") or {"published": state["approve"]["ok"]})
    out = steadfast.run("c1", wf, cosmos, {"topic": "durability"})
    assert out.waiting and out.gate == "approve"
    steadfast.approve(cosmos, "c1", "approve", {"ok": True}, by="ada")
    out = steadfast.run("c1", wf, cosmos)
    assert out.completed and out.state["published"] is True and out.state["draft"] == "DURABILITY"
    assert calls == ["draft", "publish"]
    record = steadfast.show(cosmos, "c1")
    assert [d["by"] for d in record["decisions"]] == ["ada"]
    assert [h["name"] for h in steadfast.history(cosmos, "c1")] == ["draft", "approve", "publish"]
    assert [r["run_id"] for r in steadfast.runs(cosmos, status="completed")] == ["c1"]


def test_durable_function_resumes_on_cosmos(cosmos) -> None:
    ran = []

    @steadfast.durable("agent")
    async def agent(ctx, task):
        a = await ctx.step("a", lambda: ran.append("a") or task["n"] * 2)
        both = await ctx.parallel([("b", lambda: ran.append("b") or a + 1), ("c", lambda: ran.append("c") or a + 2)])
        await ctx.gate("ok")
        return {"sum": sum(both)}

    assert agent.run("c2", cosmos, {"n": 5}).waiting
    steadfast.approve(cosmos, "c2", "ok")
    assert agent.run("c2", cosmos).value == {"sum": 23}
    assert sorted(ran) == ["a", "b", "c"]
