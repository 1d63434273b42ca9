"""Versions and the resume plan from Python, on every store: a step's
declared ``version`` is recorded with its completion and never reaches the
state; :func:`steadfast.plan` says what a resume with changed code would do
(a changed version, a renamed step, a step inserted before the gate) and
agrees with what the resume then does."""

from __future__ import annotations

import pytest

import steadfast


def _flow(*, summarize="1", name="summarize", lint=False):
    wf = steadfast.Workflow("review")
    wf.step("fetch", lambda ctx, state: {"doc": 1}, version="1")
    wf.step(name, lambda ctx, state: {"sum": 1}, version=summarize)
    if lint:
        wf.step("lint", lambda ctx, state: {"lint": True})
    wf.gate("approve")
    wf.step("publish", lambda ctx, state: {"done": True})
    return wf


def test_a_plan_reports_each_change_and_the_resume_agrees(store):
    out = steadfast.run("r", _flow(), store)
    assert out.waiting and out.gate == "approve", out
    assert "__step" not in steadfast.show(store, "r")["state"]
    history = steadfast.history(store, "r")
    assert history[1]["update"]["__step"]["fields"] == {"version": "1"}

    same = steadfast.plan(store, "r", _flow())
    assert same["clean"], same
    assert [s["action"] for s in same["steps"]] == ["skip", "skip", "run", "run"]

    edited = steadfast.plan(store, "r", _flow(summarize="2"))
    assert not edited["clean"] and "stops_at" not in edited
    assert edited["steps"][1]["action"] == "changed"
    assert edited["steps"][1]["changes"] == [{"field": "version", "was": "1", "now": "2"}]

    # Renamed: a declared version says nothing of what a step does, so the
    # old name is removed and the new one added (a flow step's command would
    # show it as renamed).
    renamed = steadfast.plan(store, "r", _flow(name="digest"))
    assert [s["action"] for s in renamed["steps"][1:3]] == ["removed", "added"]
    assert renamed["steps"][1]["name"] == "summarize"
    assert renamed["stops_at"] == {"at": 1, "recorded": "summarize", "given": "digest"}
    assert renamed["accept"]["relabelled"] == [["summarize", "digest"]]
    with pytest.raises(steadfast.WorkflowChanged):
        steadfast.run("r", _flow(name="digest"), store)

    before = steadfast.plan(store, "r", _flow(lint=True))
    assert "stops_at" not in before and not before["clean"]
    assert before["steps"][2] == {"action": "run", "index": 2, "name": "lint", "recorded_index": None}
    # The resume does what the plan said: lint runs, then the gate waits.
    out = steadfast.run("r", _flow(lint=True), store)
    assert out.waiting and out.gate == "approve", out
    assert steadfast.show(store, "r")["state"]["lint"] is True


def test_a_durable_step_records_its_version_and_bad_versions_are_refused(store):
    @steadfast.durable("agent")
    async def agent(ctx):
        return await ctx.step("ask", lambda: 3, version="2026-12-03")

    assert agent.run("d", store).value == 3
    assert steadfast.history(store, "d")[0]["update"]["__step"]["fields"]["version"] == "2026-12-03"

    @steadfast.durable("bad")
    async def bad(ctx):
        return await ctx.step("ask", lambda: 3, version="")

    with pytest.raises(steadfast.InvalidWorkflow):
        bad.run("e", store)
    wf = steadfast.Workflow("w")
    wf.step("a", lambda ctx, state: None, version="x" * 101)
    with pytest.raises(steadfast.InvalidWorkflow):
        steadfast.run("f", wf, store)
    with pytest.raises(steadfast.NoSuchRun):
        steadfast.plan(store, "nobody", _flow())
    with pytest.raises(TypeError):
        steadfast.plan(store, "r", agent)


def test_migrate_with_a_rename_resumes_without_running_the_step_again(store):
    out = steadfast.run("m", _flow(), store)
    assert out.waiting, out
    with pytest.raises(steadfast.InvalidInput):
        steadfast.migrate(store, "m", _flow(name="digest"))
    calls = []
    v2 = _flow(name="digest")
    v2._steps[1]["func"] = lambda ctx, state: calls.append("digest") or {"sum": 2}
    after = steadfast.migrate(store, "m", v2, {"summarize": "digest"}, by="ada")
    assert after["clean"], after
    audit = steadfast.show(store, "m")["audit"][-1]
    assert audit["by"] == "ada" and audit["action"]["kind"] == "migrate"
    assert audit["action"]["renamed"] == [["summarize", "digest"]]
    steadfast.approve(store, "m", "approve")
    assert steadfast.run("m", v2, store).completed
    assert calls == []
    assert steadfast.show(store, "m")["state"]["sum"] == 1
