"""Sync durable functions: a plain ``def`` whose context calls return values,
with its steps run and recorded on the calling thread."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import steadfast


def test_steps_are_recorded_and_skipped_on_resume(store):
    calls, needed = [], {"n": 3}

    @steadfast.durable("sync-agent")
    def agent(ctx, question):
        plan = ctx.step("plan", lambda: calls.append("plan") or {"q": question, "tools": 2})
        if ctx.step("count", lambda: calls.append("count") or len(calls)) < needed["n"]:
            raise RuntimeError("not yet")
        answer = ctx.step("answer", lambda: calls.append("answer") or f"{plan['q']}!")
        return {"answer": answer}

    with pytest.raises(RuntimeError, match="not yet"):
        agent.run("r1", store, "why")
    assert calls == ["plan", "count"]
    assert [h["name"] for h in steadfast.history(store, "r1") if not h["name"].startswith("__")] == ["plan", "count"]
    # The function's own exception left a resumable run; the recorded
    # "count" (2) is replayed, so it raises again without calling anything.
    with pytest.raises(RuntimeError, match="not yet"):
        steadfast.run("r1", agent, store)
    assert calls == ["plan", "count"]

    needed["n"] = 0
    assert agent.run("r1", store).value == {"answer": "why!"}, "the recorded input is passed on a resume"
    assert calls == ["plan", "count", "answer"]
    assert steadfast.run("r1", agent, store).value == {"answer": "why!"}
    assert calls == ["plan", "count", "answer"], "a completed run calls nothing again"


def test_a_step_runs_on_the_calling_thread_unless_it_has_a_timeout_or_a_lease(store):
    seen = {}

    @steadfast.durable("threads")
    def f(ctx):
        ctx.step("here", lambda: seen.setdefault("here", threading.get_ident()) and 1)
        ctx.step("timed", lambda: seen.setdefault("timed", threading.get_ident()) and 1, timeout=30)
        ctx.step("limited", lambda: seen.setdefault("limited", threading.get_ident()) and 1, limit="model:2")
        return seen["caller"]

    seen["caller"] = threading.get_ident()
    assert f.run("r1", store).value == seen["caller"]
    assert seen["here"] == seen["caller"], "a step without a timeout runs on the function's thread"
    assert seen["timed"] != seen["caller"], "a step with a timeout runs on a thread the engine can give up on"
    assert seen["limited"] != seen["caller"], "a limited step's slot is renewed while it runs elsewhere"

    seen.clear()
    seen["caller"] = threading.get_ident()
    f.run("r2", store, lease=30)
    assert seen["here"] != seen["caller"], "a leased run's step leaves the thread free to renew the lease"


def test_parallel_branches_run_at_once_on_threads_of_their_own(store):
    barrier = threading.Barrier(3, timeout=10)

    def branch(i):
        def go():
            barrier.wait()  # each waits for the other two: only at once can they pass
            return i

        return go

    @steadfast.durable("fan-out")
    def f(ctx):
        return ctx.parallel([(f"b{i}", branch(i)) for i in range(3)])

    assert f.run("r1", store).value == [0, 1, 2]


def test_gate_sleep_signal_and_recorded_values_replay(store):
    @steadfast.durable("waits")
    def f(ctx):
        first = (ctx.now().isoformat(), ctx.random(), ctx.uuid())
        approval = ctx.gate("review")
        signal_ = ctx.wait_for("go")
        ctx.sleep("nap", 0.05)
        return {"first": list(first), "approval": approval, "signal": signal_["data"], "patched": ctx.patched("p1")}

    out = f.run("r1", store)
    assert out.waiting and out.gate == "review"
    steadfast.approve(store, "r1", "review", {"ok": 1}, by="ada")
    assert f.run("r1", store).waiting  # at the wait for "go"
    steadfast.signal(store, "r1", "go", [1, 2])
    first = f.run("r1", store)
    assert first.sleeping
    done = f.run("r1", store, wait_for_timers=True)
    assert done.status == "completed", done
    assert done.value["approval"] == {"ok": 1} and done.value["signal"] == [1, 2] and done.value["patched"] is True
    again = f.run("r1", store)
    assert again.value == done.value, "now, random and uuid are recorded: every replay sees the same"


def test_retries_terminal_errors_and_step_failed(store):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("flake")
        return len(attempts)

    @steadfast.durable("retry")
    def f(ctx):
        n = ctx.step("flaky", flaky, retries=2, backoff=0.01)
        try:
            ctx.step("fatal", lambda: (_ for _ in ()).throw(steadfast.TerminalError("no way")), retries=5)
        except steadfast.StepFailed as e:
            return {"n": n, "err": str(e)}

    out = f.run("r1", store)
    assert out.value["n"] == 3 and "no way" in out.value["err"]
    assert attempts == [1, 1, 1]

    @steadfast.durable("fails")
    def g(ctx):
        return ctx.step("s", lambda: 1 / 0, retries=0)

    with pytest.raises(steadfast.StepFailed, match="ZeroDivisionError"):
        g.run("r2", store)
    assert steadfast.show(store, "r2")["status"] == "failed"


def test_a_step_past_its_timeout_is_given_up(store):
    release = threading.Event()

    @steadfast.durable("slow")
    def f(ctx):
        try:
            ctx.step("slow", lambda: release.wait(10), timeout=0.2, retries=0)
        except steadfast.StepFailed as e:
            return str(e)

    started = time.monotonic()
    out = f.run("r1", store)
    release.set()
    assert time.monotonic() - started < 5
    assert "timed out" in out.value


def test_a_leased_run_is_renewed_while_a_step_runs(store):
    seen = []

    @steadfast.durable("renewed")
    def f(ctx):
        def slow():
            seen.append(steadfast.show(store, "r1")["lease"]["until"])
            time.sleep(1.0)
            seen.append(steadfast.show(store, "r1")["lease"]["until"])
            return 1

        return ctx.step("slow", slow)

    assert f.run("r1", store, lease=0.3).value == 1
    assert seen[1] > seen[0], f"the lease was not renewed while the step ran: {seen}"
    assert steadfast.show(store, "r1").get("lease") is None


def test_async_step_functions_are_refused_before_anything_runs(store):
    async def coro():
        return 1

    @steadfast.durable("mixed")
    def f(ctx):
        ctx.step("first", lambda: 1)
        return ctx.step("async", coro)

    with pytest.raises(steadfast.InvalidInput, match=r'step "async".*coroutine function'):
        f.run("r1", store)
    assert [h["name"] for h in steadfast.history(store, "r1") if not h["name"].startswith("__")] == ["first"]

    @steadfast.durable("sneaky")
    def g(ctx):
        return ctx.step("awaitable", lambda: coro(), retries=3)

    with pytest.raises(steadfast.StepFailed, match="returned an awaitable"):
        g.run("r2", store)


def test_calls_from_another_thread_and_async_branches_are_refused(store):
    errors = []

    @steadfast.durable("threaded")
    def f(ctx):
        def other():
            try:
                ctx.step("elsewhere", lambda: 1)
            except steadfast.InvalidInput as e:
                errors.append(str(e))

        t = threading.Thread(target=other)
        t.start()
        t.join()

        async def coro():
            return 1

        try:
            ctx.parallel([("a", lambda: 1), ("b", coro)])
        except steadfast.InvalidInput as e:
            errors.append(str(e))
        return ctx.step("here", lambda: 2)

    assert f.run("r1", store).value == 2
    assert len(errors) == 2
    assert "another thread" in errors[0]
    assert "branch 'b'" in errors[1] and "coroutine function" in errors[1]
    assert [h["name"] for h in steadfast.history(store, "r1") if not h["name"].startswith("__")] == ["here"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_step_ends_the_call_and_is_not_recorded(store, exc):
    attempts = []

    def interrupted():
        attempts.append(1)
        if len(attempts) == 1:
            raise exc()
        return "ok"

    @steadfast.durable("interrupted")
    def f(ctx):
        ctx.step("before", lambda: 1)
        return ctx.step("s", interrupted, retries=5, backoff=0.01)

    with pytest.raises(exc):
        f.run("r1", store)
    assert attempts == [1], "an interrupt is not retried"
    record = steadfast.show(store, "r1")
    assert record["status"] != "failed" and record["completed"] == ["before"]
    assert f.run("r1", store).value == "ok", "the run resumes at the interrupted step"


@pytest.mark.parametrize(
    "call",
    [
        lambda ctx: ctx.step("s", lambda: 1, timeout=-1),
        lambda ctx: ctx.step("s", lambda: 1, timeout=math.nan),
        lambda ctx: ctx.step("s", lambda: 1, backoff=math.inf),
        lambda ctx: ctx.step("", lambda: 1),
        lambda ctx: ctx.step("x" * 100_000, lambda: 1),
        lambda ctx: ctx.step("$py", lambda: 1),
        lambda ctx: ctx.sleep("z", -5),
        lambda ctx: ctx.sleep("z", 1e300),
        lambda ctx: ctx.gate("g", timeout=1, on_timeout="perhaps"),
        lambda ctx: ctx.patched("not an id!"),
    ],
    ids=["negative-timeout", "nan-timeout", "inf-backoff", "empty-name", "huge-name", "mark-name",
         "negative-sleep", "far-future-sleep", "bad-on-timeout", "bad-patch-id"],
)
def test_bad_arguments_are_refused_and_nothing_is_recorded(store, call):
    @steadfast.durable("bad")
    def f(ctx):
        ctx.step("ok", lambda: 1)
        return call(ctx)

    with pytest.raises((steadfast.InvalidInput, steadfast.InvalidWorkflow)):
        f.run("r1", store)
    assert steadfast.show(store, "r1")["completed"] == ["ok"]


def test_a_callable_object_and_a_nested_run(store):
    class Agent:
        def __call__(self, ctx, n):
            inner = ctx.step("inner", lambda: helper.run("inner-run", store, n).value)
            return inner + 1

    @steadfast.durable("helper")
    def helper_fn(ctx, n):
        return ctx.step("double", lambda: n * 2)

    helper = helper_fn
    agent = steadfast.durable("outer")(Agent())
    assert agent.is_sync
    assert agent.run("outer-run", store, 5).value == 11
    assert steadfast.show(store, "inner-run")["completed"] == ["double"]
    assert steadfast.show(store, "outer-run")["completed"] == ["inner"]

    class AsyncCall:
        async def __call__(self, ctx):
            return 1

    # Not a coroutine function to `inspect`: taken as sync, and its body's
    # awaitable is refused with the way out.
    with pytest.raises(steadfast.TerminalError, match="returned an awaitable"):
        steadfast.durable("async-object")(AsyncCall()).run("r2", store)


HOLDER = textwrap.dedent(
    """
    import sys, time
    import steadfast

    url, log = sys.argv[1], sys.argv[2]

    @steadfast.durable("held")
    def f(ctx):
        def slow():
            with open(log, "a") as out:
                out.write("ran\\n")
            time.sleep(float(sys.argv[3]))
            return 1
        return ctx.step("slow", slow)

    try:
        print(f.run("r1", steadfast.open_store(url), lease=30).value, flush=True)
    except steadfast.Held as e:
        print("held", flush=True)
    """
)


def test_a_second_process_on_a_leased_run_is_held_while_the_first_runs(tmp_path: Path):
    script, url, log = tmp_path / "holder.py", f"sqlite:{tmp_path}/runs.db", tmp_path / "ran.log"
    script.write_text(HOLDER)
    first = subprocess.Popen([sys.executable, str(script), url, str(log), "3"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not log.exists():
        assert first.poll() is None and time.monotonic() < deadline, "the first caller did not start its step"
        time.sleep(0.02)
    second = subprocess.run([sys.executable, str(script), url, str(log), "0"], capture_output=True, text=True, timeout=60)
    assert second.stdout.strip() == "held", second.stderr
    out, _ = first.communicate(timeout=60)
    assert out.strip() == "1"
    assert log.read_text().count("ran") == 1, "the held caller ran nothing"


def test_emit_and_spend_from_a_step(store):
    @steadfast.durable("emits")
    def f(ctx):
        def work():
            ctx.emit({"token": "a"})
            ctx.spend("tokens", 12)
            return 1

        return ctx.step("work", work)

    assert f.run("r1", store).value == 1

    async def collect():
        return [item async for item in steadfast.watch(store, "r1")]

    events = [(i["step"], i["value"]) for i in asyncio.run(collect()) if i["kind"] == "event"]
    assert events == [("work", {"token": "a"})]
    assert steadfast.show(store, "r1")["spend"]["spent"] == {"tokens": 12.0}


@pytest.mark.asyncio
async def test_run_async_runs_it_off_the_loop(memory_store):
    ticks = []

    async def ticker():
        for _ in range(5):
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    @steadfast.durable("blocking")
    def f(ctx):
        return ctx.step("s", lambda: time.sleep(0.2) or 7)

    t = asyncio.ensure_future(ticker())
    out = await f.run_async("r1", memory_store)
    await t
    assert out.value == 7
    assert len(ticks) == 5 and max(b - a for a, b in zip(ticks, ticks[1:])) < 0.15, "the loop was not blocked"


AGENT = textwrap.dedent(
    """
    import json, sys, time
    import steadfast

    url, log = sys.argv[1], sys.argv[2]

    def note(event, step):
        with open(log, "a") as f:
            f.write(json.dumps({"event": event, "step": step}) + "\\n")

    def tool(name, seconds):
        def go():
            note("start", name)
            time.sleep(seconds)
            note("end", name)
            return name.upper()
        return go

    @steadfast.durable("sync-kill")
    def agent(ctx):
        out = [ctx.step(f"s{i}", tool(f"s{i}", 0.15)) for i in range(6)]
        return out

    print(json.dumps(agent.run("killed", steadfast.open_store(url)).value))
    """
)


def test_sigkill_mid_step_resumes_with_only_the_step_in_flight_run_again(tmp_path: Path):
    script, url, log = tmp_path / "agent.py", f"sqlite:{tmp_path}/runs.db", tmp_path / "steps.log"
    script.write_text(AGENT)

    def events():
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    p = subprocess.Popen([sys.executable, str(script), url, str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while sum(e["event"] == "start" for e in events()) < 3:
        assert p.poll() is None, f"the agent ended before it was killed: {p.communicate()}"
        assert time.monotonic() < deadline, "the agent did not get going"
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    started = [e["step"] for e in events() if e["event"] == "start"]
    ended = [e["step"] for e in events() if e["event"] == "end"]
    in_flight = [s for s in started if s not in ended]
    assert in_flight == ["s2"], f"the kill landed while s2 ran: {started}, {ended}"
    record = steadfast.show(steadfast.open_store(url), "killed")
    assert record["completed"] == ["s0", "s1"]

    log.write_text("")
    out = subprocess.run([sys.executable, str(script), url, str(log)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [f"S{i}" for i in range(6)]
    assert [e["step"] for e in events() if e["event"] == "start"] == ["s2", "s3", "s4", "s5"]


SLEEPER = textwrap.dedent(
    """
    import signal, sys, threading, time
    import steadfast

    # Ctrl-C raises KeyboardInterrupt as at a terminal, even where this
    # process was started with SIGINT ignored (a job in the background of a
    # shell without job control), which Python would keep ignoring.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    url, mode = sys.argv[1], sys.argv[2]

    @steadfast.durable("sleeper")
    def sleeper(ctx):
        ctx.step("first", lambda: 1)
        ctx.sleep("nap", 60)
        return 2

    store = steadfast.open_store(url)
    if mode == "main":
        print("ready", flush=True)
        sleeper.run("r1", store, wait_for_timers=True)
    else:
        threading.Thread(target=lambda: sleeper.run("r2", store, wait_for_timers=True), daemon=True).start()
        time.sleep(0.5)
        print("leaving", flush=True)
    """
)


def test_ctrl_c_stops_a_sync_durable_function_waiting_on_a_timer(tmp_path: Path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    url = f"sqlite:{tmp_path}/runs.db"
    p = subprocess.Popen([sys.executable, str(script), url, "main"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30

    def at_timer():
        try:
            return steadfast.show(steadfast.open_store(url), "r1")["completed"] == ["first"]
        except steadfast.NoSuchRun:
            return False

    while not at_timer():
        assert time.monotonic() < deadline, "the run did not reach its timer"
        time.sleep(0.05)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert time.monotonic() - sent < 10, "Ctrl-C waited for the 60 s timer"
    assert p.returncode != 0 and "KeyboardInterrupt" in err, err


def test_a_daemon_thread_in_a_sync_durable_function_does_not_hold_the_exit(tmp_path: Path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(script), f"sqlite:{tmp_path}/runs.db", "daemon"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "leaving"
    assert time.monotonic() - started < 20, "the process waited for a daemon thread's 60 s timer"
    assert "abandoned" not in out.stderr
