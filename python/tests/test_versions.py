"""Versions of a whole workflow from Python, on every store: a run records
the version it was started with and resumes only under it; ``runs`` picks
out a version's runs; the plan names both versions; ``migrate`` moves a run
to another version on purpose, and the audit says so."""

from __future__ import annotations

import pytest

import steadfast


def _agent(version, log):
    wf = steadfast.Workflow("agent", version=version)

    @wf.step("draft")
    def draft(ctx, state):
        log.append(f"{ctx.run_id} v{version} draft")
        return {"draft": version}

    wf.gate("approve")

    @wf.step("publish")
    def publish(ctx, state):
        log.append(f"{ctx.run_id} v{version} publish")
        return {"published": version}

    return wf


def test_a_run_resumes_only_under_its_version_until_migrated(store):
    log = []
    v1, v2 = _agent("1", log), _agent("2", log)
    assert repr(v1).startswith("Workflow('agent', version='1'")
    assert steadfast.run("r", v1, store).waiting
    assert steadfast.start(store, v2, "s", {})
    assert steadfast.show(store, "r")["origin"]["version"] == "1"
    steadfast.approve(store, "r", "approve")

    # Version 2 refuses the run of version 1, running nothing.
    with pytest.raises(steadfast.WorkflowChanged) as e:
        steadfast.run("r", v2, store)
    assert "version 1 of workflow agent" in str(e.value)
    assert log == ["r v1 draft"]
    plan = steadfast.plan(store, "r", v2)
    assert (plan["recorded_version"], plan["given_version"]) == ("1", "2")
    assert not plan["clean"] and plan["stops_at"] == {"at": 0, "recorded": "version 1", "given": "version 2"}
    assert steadfast.plan(store, "r", v1)["clean"]

    # Under version 1 it goes on.
    assert steadfast.run("r", v1, store).completed
    assert log[-1] == "r v1 publish"

    # Each version's runs (as each run's summary says); the limit counts
    # the runs picked out.
    assert {r["run_id"]: r.get("workflow_version") for r in steadfast.runs(store)} == {"r": "1", "s": "2"}
    assert steadfast.run("t", v1, store).waiting
    assert [r["run_id"] for r in steadfast.runs(store, version="1")] == ["r", "t"]
    assert [r["run_id"] for r in steadfast.runs(store, version="1", limit=1)] == ["r"]
    assert [r["run_id"] for r in steadfast.runs(store, version="2")] == ["s"]
    assert steadfast.runs(store, version="3") == []
    with pytest.raises(steadfast.InvalidInput):
        steadfast.runs(store, version="")

    # Starting a run again under another version is refused.
    with pytest.raises(steadfast.InvalidInput):
        steadfast.start(store, v1, "s", {})

    # Moved on purpose: the audit says to which version, and version 2 runs it.
    after = steadfast.migrate(store, "t", v2, by="ada")
    assert after["clean"], after
    shown = steadfast.show(store, "t")
    assert shown["origin"]["version"] == "2"
    assert shown["audit"][-1]["action"]["kind"] == "migrate"
    assert shown["audit"][-1]["action"]["version"] == "2"
    steadfast.approve(store, "t", "approve")
    assert steadfast.run("t", v2, store).completed
    assert log[-1] == "t v2 publish"


def test_bad_versions_are_refused(store):
    with pytest.raises(TypeError):
        steadfast.Workflow("agent", version=2)
    for bad in ["", "x" * 101, "a\nb"]:
        with pytest.raises(steadfast.InvalidWorkflow):
            steadfast.run("r", _agent(bad, []), store)
        with pytest.raises(steadfast.InvalidInput):
            steadfast.start(store, _agent(bad, []), "r", {})
    assert steadfast.runs(store) == []


def _fetch(ctx, state):
    return {"fetched": 1}


def _fetch_edited(ctx, state):
    return {"fetched": 2}


def test_a_step_version_can_come_from_its_code(store):
    v = steadfast.code_version(_fetch)
    assert v.startswith("sha256:") and len(v) == 31
    assert steadfast.code_version(_fetch) == v
    assert steadfast.code_version(_fetch_edited) != v
    with pytest.raises(steadfast.InvalidInput):
        steadfast.code_version(len)

    def flow(func):
        wf = steadfast.Workflow("coded")
        wf.step("fetch", func, version=steadfast.code_version(func))
        wf.gate("approve")
        return wf

    assert steadfast.run("r", flow(_fetch), store).waiting
    assert steadfast.plan(store, "r", flow(_fetch))["clean"]
    edited = steadfast.plan(store, "r", flow(_fetch_edited))
    assert edited["steps"][0]["action"] == "changed", edited
    assert edited["steps"][0]["changes"] == [
        {"field": "version", "was": v, "now": steadfast.code_version(_fetch_edited)}
    ]
