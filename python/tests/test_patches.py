"""Patches in Python durable functions: a run started before the patch keeps
the old branch, a run started after takes the new one, also when its process
is SIGKILLed between the recorded patch and the step it guards; a deprecated
patch is stepped over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import steadfast

AGENT = textwrap.dedent(
    """
    import sys, time
    import steadfast

    url, run_id, version, mark = sys.argv[1:5]

    @steadfast.durable("agent")
    async def agent(ctx):
        if version == "v1":
            new = False
        elif version == "v2":
            new = await ctx.patched("fix-1")
        else:
            await ctx.deprecate_patch("fix-1")
            new = True

        def call():
            with open(mark, "a") as f:
                f.write(f"{run_id}:{'new' if new else 'old'}\\n")
            if run_id == "slow":
                time.sleep(60)
            return "new" if new else "old"

        value = await ctx.step("a2" if new else "a", call)
        await ctx.gate("g")
        return value

    out = agent.run(run_id, steadfast.open_store(url))
    print(out.gate if out.waiting else out.value)
    """
)


def _run(tmp_path, url, run_id, version, *, wait=True):
    mark = str(tmp_path / "calls")
    args = [sys.executable, "-c", AGENT, url, run_id, version, mark]
    # Started outside python/, where `import steadfast` would find the source tree.
    if not wait:
        return subprocess.Popen(args, cwd=tmp_path)
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _calls(tmp_path):
    path = tmp_path / "calls"
    return path.read_text().split() if path.exists() else []


def test_patches_keep_old_runs_on_the_old_branch_across_a_kill(tmp_path):
    url = f"sqlite:{tmp_path / 'runs.db'}"
    assert _run(tmp_path, url, "old", "v1") == "g"
    # Under the patched code, "slow" records the patch, starts its step
    # and is killed in it.
    child = _run(tmp_path, url, "slow", "v2", wait=False)
    deadline = time.monotonic() + 60
    while "slow:new" not in _calls(tmp_path):
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    store = steadfast.open_store(url)
    assert [r["name"] for r in steadfast.history(store, "slow")] == ["__patch:fix-1"]
    # Resumed (the step now quick: the run id decides), the recorded patch
    # holds: the new branch again.
    os.rename(tmp_path / "calls", tmp_path / "calls.before")
    store2 = steadfast.open_store(url)
    steadfast.approve(store2, "old", "g")
    assert _run(tmp_path, url, "old", "v2") == "old"
    assert _calls(tmp_path) == []  # "a" was recorded: not run again
    # "slow" resumes in a fresh process under the same code: its patch was
    # recorded before the kill, so it takes the new branch again.
    out = subprocess.run(
        [sys.executable, "-c", AGENT.replace('if run_id == "slow":', "if False:"), url, "slow", "v2",
         str(tmp_path / "calls")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "g", out.stderr
    assert _calls(tmp_path) == ["slow:new"]
    # Deprecated: the recorded patch is stepped over, nothing runs again.
    steadfast.approve(store2, "slow", "g")
    assert _run(tmp_path, url, "slow", "v3") == "new"
    assert _calls(tmp_path) == ["slow:new"]


def test_a_bad_patch_id_is_refused(memory_store):
    @steadfast.durable("bad")
    async def bad(ctx):
        return await ctx.patched("has space")

    with pytest.raises(steadfast.InvalidWorkflow):
        bad.run("b", memory_store)
