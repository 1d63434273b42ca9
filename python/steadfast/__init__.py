"""Durable execution for Python agents, on Steadfast's Rust engine.

A workflow is a list of named steps; a checkpoint is written after every step;
running the same run id again skips what is done and resumes at the next step.
The stores, the record format and the guarantees are those of the Rust
library: a run started here can be shown, approved or resumed by the
``steadfast`` command, and the other way round.

Listed workflows::

    import steadfast

    store = steadfast.open_store("sqlite:.steadfast/runs.db")
    wf = steadfast.Workflow("research")

    @wf.step("retrieve", retries=2)
    def retrieve(ctx, state):
        return {"docs": ["a", "b"]}

    wf.gate("review")

    @wf.step("write")
    async def write(ctx, state):
        return {"report": f"{len(state['docs'])} docs, {state['review']}"}

    outcome = steadfast.run("run-1", wf, store)   # stops at the gate: outcome.waiting
    steadfast.approve(store, "run-1", "review", {"ok": True}, by="ada")
    outcome = steadfast.run("run-1", wf, store)   # outcome.completed, outcome.state

Durable functions, ordinary code whose steps are recorded by name::

    @steadfast.durable("agent")
    async def agent(ctx, question):
        plan = await ctx.step("plan", lambda: call_model(question))
        results = await ctx.parallel([(f"tool-{i}", tool(t)) for i, t in enumerate(plan)])
        return {"answer": results}

    outcome = agent.run("run-2", store, "what changed?")
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import datetime as _dt
import functools
import inspect
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Union

try:
    from steadfast import _native
except ImportError as _missing:  # pragma: no cover - depends on how it was installed
    import importlib.machinery as _machinery
    import os as _os

    _here = _os.path.dirname(__file__)
    if any(_os.path.exists(_os.path.join(_here, "_native" + x)) for x in _machinery.EXTENSION_SUFFIXES):
        raise  # a compiled module that fails to load: its own error says why
    raise ImportError(
        "steadfast: the compiled module steadfast._native is missing beside "
        f"{_here}. This is the package's source tree, not an installed build: "
        "install it with `pip install ./python` (from the repository's root) and "
        "import it from anywhere but the python/ directory."
    ) from _missing
from steadfast._errors import *  # noqa: F401,F403
from steadfast._errors import InvalidWorkflow
from steadfast._errors import __all__ as _error_names
from steadfast._native import DurableContext as _NativeDurableContext
from steadfast._native import StepContext, Store

__version__: str = _native.__version__

#: The store used when none is named: SQLite under ``.steadfast/`` in the
#: current directory.
DEFAULT_STORE_URL: str = _native.DEFAULT_STORE_URL

JSON = Any
"""A JSON-compatible value: None, bool, int, float (finite), str, list, dict with str keys."""


def open_store(url: str = DEFAULT_STORE_URL) -> Store:
    """Opens the store a URL names, creating it when missing.

    Every URL the Rust library accepts works here (:func:`backends` lists
    them): ``sqlite:PATH`` (the embedded default), ``file:PATH``,
    ``postgres://…`` (with ``?schema=NAME``), ``memory:`` (this process
    only), and ``cosmos://…`` where the native module was built with Cosmos
    DB support. A file that is not a store raises :class:`Corrupt`; nothing
    is ever replaced by a fresh store.
    """
    return _native.open_store(url)


def backends() -> List[Dict[str, Any]]:
    """The kinds of store this build opens: name, URL schemes, URL form and purpose of each."""
    return _native.backends()


# At exit, wait for step functions abandoned after their timeout to return
# before the interpreter goes away under them (saying so after 5 s).
atexit.register(_native.drain, 5.0)


def _settle(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if not fut.done():
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


class _Notifier:
    """Settles the futures of one event loop's native operations.

    The engine's threads never take the interpreter's lock to hand a result
    over: a finished operation's token goes into a native queue and one byte
    into a pipe this loop watches; the loop, on its own thread, takes the
    results, builds the Python values and settles the futures. Futures are
    held weakly, so that an abandoned one keeps neither its loop nor this
    notifier alive.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.native = _native.Notifier()
        self.waiting: Dict[int, Tuple[Any, "weakref.ReferenceType[asyncio.Future[Any]]"]] = {}
        self.tokens = itertools.count(1)
        loop.add_reader(self.native.fileno(), self._drain)

    def watch(self, pending: Any, fut: "asyncio.Future[Any]") -> int:
        token = next(self.tokens)
        self.waiting[token] = (pending, weakref.ref(fut))
        pending.notify(self.native, token)
        return token

    def _drain(self) -> None:
        self._settle_all(self.native.take_ready())

    def _settle_all(self, tokens: List[int]) -> None:
        for i, token in enumerate(tokens):
            try:
                self._settle_one(token)
            except BaseException:
                # Whatever stopped this drain, the other results are not lost.
                rest = tokens[i + 1 :]
                if rest:
                    asyncio.get_running_loop().call_soon(self._settle_all, rest)
                raise

    def _settle_one(self, token: int) -> None:
        entry = self.waiting.pop(token, None)
        if entry is None:
            return  # its awaiting task was cancelled
        pending, ref = entry
        fut = ref()
        try:
            value, ok = pending.wait(), True  # finished: does not block
        except BaseException as e:  # handed to the awaiting task as it is (Suspended too)
            value, ok = e, False
        if fut is not None:
            _settle(fut, ok, value)


_NOTIFIERS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Notifier]" = weakref.WeakKeyDictionary()


def _notifier(loop: asyncio.AbstractEventLoop) -> _Notifier:
    n = _NOTIFIERS.get(loop)
    if n is None:
        n = _NOTIFIERS[loop] = _Notifier(loop)
    return n


async def _wait(pending: Any) -> Any:
    """Awaits a native operation: the loop is woken when it has finished.

    An awaiting task that is cancelled (or a coroutine closed) stops the
    operation.
    """
    if pending.done():
        # Finished on this thread (a step recorded before): no wake-up to wait
        # for, but other tasks still get their turn, as after any await.
        await asyncio.sleep(0)
        return pending.wait()
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    notifier = _notifier(loop)
    token = notifier.watch(pending, fut)
    done = False
    try:
        value = await fut
        done = True
        return value
    finally:
        # Cancelled (the task cancels the future it awaits) or closed: stop
        # the operation. One that finished with an error has nothing to stop.
        if not done and (not fut.done() or fut.cancelled()):
            notifier.waiting.pop(token, None)
            pending.cancel()


#: The step whose function runs now (in this thread, or this task), for
#: :meth:`DurableContext.emit`.
_CURRENT_STEP: "contextvars.ContextVar[Optional[StepContext]]" = contextvars.ContextVar(
    "steadfast_current_step", default=None
)


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _LoopTask:
    """A task made on its loop's thread, as the engine holds a coroutine's
    future: its end is reported by ``add_done_callback`` (on the loop), and
    ``cancel`` may come from any thread (the engine dropping the step)."""

    __slots__ = ("loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: "asyncio.Task[Any]") -> None:
        self.loop = loop
        self.task = task

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self.task.add_done_callback(fn)

    def cancel(self) -> None:
        if _running_loop() is self.loop:
            self.task.cancel()
            return
        try:
            self.loop.call_soon_threadsafe(self.task.cancel)
        except RuntimeError:
            pass  # the loop is closed: its tasks run no more


def _invoke(
    loop: Optional[asyncio.AbstractEventLoop], step: Optional[StepContext], fn: Callable[..., Any], *args: Any
) -> Tuple[bool, Any]:
    """Calls ``fn`` with ``step`` as the current step; an awaitable it returns
    is scheduled on ``loop``, in a task that keeps ``step`` current.

    Returns ``(True, future)`` for an awaitable (a ``concurrent.futures.Future``,
    or a :class:`_LoopTask` on the loop's own thread) and
    ``(False, value)`` otherwise. Called by the engine from a worker thread,
    or from the loop's own thread for a coroutine function's step.
    """
    token = _CURRENT_STEP.set(step)
    try:
        result = fn(*args)
        if loop is None and inspect.isawaitable(result):
            # A sync durable function's call: there is no loop to run it on.
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise TerminalError(
                f"{fn!r} returned an awaitable inside a sync durable function (a plain `def`), which waits for "
                "each call on its own thread: return a value, or make the durable function an `async def`"
            )
        if inspect.isawaitable(result):

            async def wait() -> Any:
                return await result

            # The task copies this context, the current step included. On
            # the loop's own thread (an async step started there) it is
            # made right here, without a trip through the loop's wake-up
            # pipe; from any other thread, or where the loop has a task
            # factory of its own (which may start a task eagerly, inside
            # this call), it is handed to the loop.
            if _running_loop() is loop and loop.get_task_factory() is None:
                return True, _LoopTask(loop, loop.create_task(wait()))
            return True, asyncio.run_coroutine_threadsafe(wait(), loop)
        return False, result
    finally:
        _CURRENT_STEP.reset(token)


@dataclass(frozen=True)
class Outcome:
    """How a call to :func:`run` ended.

    ``status`` is one of ``"completed"``, ``"waiting"`` (at a gate: approve or
    reject it, then run again; or at a wait for a signal: send it, then run
    again; ``gate`` names the step), ``"sleeping"`` (at a durable timer: run again
    after ``until``) and ``"rejected"`` (a gate was rejected; the run is over).
    """

    status: str
    #: The final state (listed workflow) or return value (durable function) when completed.
    value: JSON = None
    #: The gate the run waits at, or that was rejected.
    gate: Optional[str] = None
    #: When a sleeping run's timer fires.
    until: Optional[_dt.datetime] = None
    #: Why the gate was rejected, if the rejection said.
    reason: Optional[str] = None

    @property
    def completed(self) -> bool:
        """Whether every step is done."""
        return self.status == "completed"

    @property
    def waiting(self) -> bool:
        """Whether the run stopped at a gate."""
        return self.status == "waiting"

    @property
    def sleeping(self) -> bool:
        """Whether the run stopped at a durable timer."""
        return self.status == "sleeping"

    @property
    def rejected(self) -> bool:
        """Whether a gate was rejected."""
        return self.status == "rejected"

    @property
    def state(self) -> JSON:
        """The final state of a completed run (the same as ``value``)."""
        return self.value


def _outcome(t: Tuple[str, Any, Any, Any]) -> Outcome:
    status, value, gate, until = t
    if status == "rejected":
        return Outcome(status, gate=gate, reason=value)
    if status == "sleeping":
        return Outcome(status, until=_from_millis(until))
    return Outcome(status, value=value, gate=gate)


def _from_millis(ms: int) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc)


StepFunction = Callable[[StepContext, Dict[str, JSON]], Union[Optional[Dict[str, JSON]], Awaitable[Optional[Dict[str, JSON]]]]]


class Workflow:
    """A listed workflow: named steps run in order, each checkpointed.

    A step function takes ``(ctx, state)`` — a :class:`StepContext` and the
    run's state as a dict — and returns a dict of updates merged key by key
    into the state (or None for none). It may be ``def`` or ``async def``.
    Raising retries the step under its policy; raising :class:`TerminalError`
    fails it at once. An exception with a ``retry_after`` attribute (seconds,
    as a provider's HTTP 429 gives) makes the next attempt wait at least that
    long, at most a day, and pauses the step's ``limit`` key for every
    process; a ``retry_after`` that is not a finite number from 0 is ignored.

    ``version`` (``"2026-12-01"``: 1 to 100 bytes) declares the version
    of the workflow: a run records the version it was started with and
    resumes only under it (another raises :class:`WorkflowChanged`), until
    :func:`migrate` moves it; ``runs(version=...)`` lists a version's runs.
    A workflow without a version runs any run, as before versions existed.
    """

    def __init__(self, name: str, *, version: Optional[str] = None) -> None:
        if version is not None and not isinstance(version, str):
            raise TypeError(f"workflow {name!r}: a version is a str, not {type(version).__name__}")
        self.name = name
        self.version = version
        self._steps: List[Dict[str, Any]] = []

    def _add(self, kind: str, name: str, **options: Any) -> None:
        """Adds a step of `kind`; the options it does not give are None."""
        if not isinstance(name, str):
            raise TypeError(f"workflow {self.name!r}: a step name is a str, not {type(name).__name__}")
        if name.startswith("__"):
            raise InvalidWorkflow(
                f"invalid workflow {self.name!r}: step name {name!r}: names starting with '__' are reserved"
            )
        spec: Dict[str, Any] = dict.fromkeys(
            ("func", "retries", "backoff", "max_backoff", "timeout", "on_timeout", "seconds", "signal", "workflow",
             "limit", "version")
        )
        spec.update(options, kind=kind, name=name)
        self._steps.append(spec)

    def step(
        self,
        name: str,
        func: Optional[StepFunction] = None,
        *,
        retries: Optional[int] = None,
        backoff: Optional[float] = None,
        max_backoff: Optional[float] = None,
        timeout: Optional[float] = None,
        limit: Optional[str] = None,
        version: Optional[str] = None,
    ) -> Any:
        """Adds a step named ``name``; usable as a decorator when ``func`` is omitted.

        ``retries`` is the number of extra attempts after a failure (default 2),
        ``backoff`` the first delay between attempts in seconds (doubling, with
        jitter, up to ``max_backoff``), ``timeout`` the seconds an attempt may take.
        ``limit`` (``"openai:8"``, or ``"openai"`` with a size set by
        ``steadfast limits set``) holds a slot of that shared key while each
        attempt runs: at most its size of such steps run at once across every
        process on the store; one that finds none free waits for one.
        ``version`` (``"2"``: 1 to 100 characters) declares the version of
        the step's code: each completion records it, and :func:`plan` shows
        a recorded step whose version has changed since it ran.
        """

        def add(f: StepFunction) -> StepFunction:
            if not callable(f):
                raise TypeError(f"step {name!r}: {f!r} is not callable")
            self._add("step", name, func=f, retries=retries, backoff=backoff, max_backoff=max_backoff,
                      timeout=timeout, limit=limit, version=version)
            return f

        return add if func is None else add(func)

    def gate(self, name: str, *, timeout: Optional[float] = None, on_timeout: str = "reject") -> "Workflow":
        """Adds a gate: the run stops until :func:`approve` or :func:`reject` decides it.

        An approval's data is merged into the state under the gate's name.
        With ``timeout`` (seconds), the gate decides ``on_timeout``
        (``"reject"`` or ``"approve"``) by itself when no one has.
        """
        self._add("gate", name, timeout=timeout, on_timeout=on_timeout)
        return self

    def sleep(self, name: str, seconds: float) -> "Workflow":
        """Adds a durable timer: the run stops until ``seconds`` have passed; a crash does not restart it."""
        self._add("sleep", name, seconds=seconds)
        return self

    def wait(self, name: str, signal: str, *, timeout: Optional[float] = None) -> "Workflow":
        """Adds a wait for signal ``signal`` (sent with :func:`signal`): the run
        takes the oldest one no earlier wait took, or stops until one is sent.

        The delivery (``signal``, ``data``, ``by``, ``at``, ``seq``) is merged
        into the state under the step's name; with ``timeout`` (seconds), None
        is when none came in time.
        """
        if not isinstance(signal, str):
            raise TypeError(f"wait {name!r}: a signal's name is a str, not {type(signal).__name__}")
        self._add("wait", name, timeout=timeout, signal=signal)
        return self

    def child(self, name: str, workflow: str, *, retries: Optional[int] = None) -> "Workflow":
        """Adds a child step: a run of ``workflow`` (another workflow's name)
        started as a child of this run, with this run's state as its input;
        the run waits for it without holding a process, and the child's
        result (its final state, or a durable function's value) is merged
        into the state under the step's name. A failed child fails the step,
        after ``retries`` more tries of the child.
        """
        if not isinstance(workflow, str):
            raise TypeError(f"child {name!r}: a workflow's name is a str, not {type(workflow).__name__}")
        self._add("child", name, workflow=workflow, retries=retries)
        return self

    @property
    def step_names(self) -> List[str]:
        """The steps' names, in order."""
        return [s["name"] for s in self._steps]

    def __repr__(self) -> str:
        version = "" if self.version is None else f", version={self.version!r}"
        return f"Workflow({self.name!r}{version}, steps={self.step_names!r})"


class _Context:
    """What both kinds of durable function's context share."""

    def __init__(self, native: _NativeDurableContext) -> None:
        self._native = native

    def numbered(self, base: str) -> str:
        """``base``, then ``base#2``, ``base#3``…: distinct names for steps in a loop."""
        return self._native.numbered(base)

    def emit(self, value: JSON) -> None:
        """Emits ``value`` into the run's event log from inside a step's
        function (sync or async): a model's tokens, a tool's progress.
        ``steadfast watch`` and :func:`watch` show events as they happen.

        Events are written in batches (within 100 ms, and all of them before
        the step's checkpoint). Raises :class:`InvalidInput` for a value that
        cannot be stored or a call outside a step's function, and
        :class:`StoreError` when the store keeps no events.
        """
        step = _CURRENT_STEP.get()
        if step is None:
            raise InvalidInput("ctx.emit is called outside a step: call it inside the function given to ctx.step")
        step.emit(value)

    def spend(self, what: str, amount: float) -> None:
        """Reports, from inside a step's function, that this attempt spent
        ``amount`` of ``what`` (``"tokens"``, ``"usd"``): see
        :meth:`StepContext.spend`. Raises :class:`InvalidInput` for a name or
        amount out of range or a call outside a step's function.
        """
        step = _CURRENT_STEP.get()
        if step is None:
            raise InvalidInput("ctx.spend is called outside a step: call it inside the function given to ctx.step")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise InvalidInput(f"ctx.spend: the amount {amount!r} is not a number")
        step.spend(what, float(amount))


class DurableContext(_Context):
    """What a durable function uses to make steps.

    Code between steps must be deterministic: the same inputs and recorded
    outputs must lead it to ask for the same steps in the same order. Take time
    and randomness from :meth:`now`, :meth:`random` and :meth:`uuid`, which are
    recorded; do every side effect inside a step. A gate or timer that stops
    the run raises :class:`Suspended` (a ``BaseException``): let it propagate.
    """

    async def step(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        retries: Optional[int] = None,
        backoff: Optional[float] = None,
        max_backoff: Optional[float] = None,
        timeout: Optional[float] = None,
        limit: Optional[str] = None,
        version: Optional[str] = None,
    ) -> JSON:
        """Runs ``fn()`` (sync or async) as step ``name`` and returns its value,
        saved before this returns; on a resume, returns the saved value without
        calling ``fn``. Options, and what an exception's ``retry_after``
        does, as for :meth:`Workflow.step` and :class:`Workflow`.
        """
        on_loop = inspect.iscoroutinefunction(fn)
        return await _wait(
            self._native.step(name, fn, retries, backoff, max_backoff, timeout, on_loop, limit, version)
        )

    async def parallel(self, branches: Union[Sequence[Tuple[str, Callable[[], Any]]], Dict[str, Callable[[], Any]]]) -> List[JSON]:
        """Runs several steps at once and returns their values in order.

        ``branches`` is a list of ``(name, fn)`` pairs or a dict. Each output is
        saved as soon as its step ends, so a crash re-runs only unfinished ones.
        """
        items = list(branches.items()) if isinstance(branches, dict) else list(branches)
        return await _wait(self._native.parallel(items))

    async def gate(self, name: str, *, timeout: Optional[float] = None, on_timeout: str = "reject") -> JSON:
        """Waits at gate ``name``; returns the approval's data (None without data)."""
        return await _wait(self._native.gate(name, timeout, on_timeout))

    async def wait_for(self, name: str, timeout: Optional[float] = None) -> Optional[Dict[str, JSON]]:
        """Waits for signal ``name`` (sent with :func:`signal`): the oldest one
        no earlier wait of the run took, or one sent later. Without one the run
        stops (status ``waiting``) and holds no process; running it again after
        the signal was sent goes on. Returns the delivery, a dict with
        ``signal``, ``data``, ``by``, ``at`` and ``seq``; None when ``timeout``
        seconds passed first. The step is named ``name`` (``name#2`` for a
        second wait in one call).
        """
        return await _wait(self._native.wait_for(name, timeout))

    async def child(self, name: str, workflow: str, input: JSON = None, *, retries: Optional[int] = None) -> JSON:
        """Runs ``workflow`` as a child run of this one, with ``input``, and
        returns its result; see :meth:`children`."""
        out = await self.children([(name, workflow, input)], retries=retries)
        return out[0]

    async def children(
        self,
        children: Sequence[Tuple[str, str, JSON]],
        *,
        at_once: Optional[int] = None,
        retries: Optional[int] = None,
    ) -> List[JSON]:
        """Starts child runs and returns their results, in the order given.

        ``children`` is a list of ``(step name, workflow, input)``. Each child
        is a run of its own, with the id :func:`child_id` ``(this run, step
        name)``, recorded for whoever runs that workflow (a worker, or a
        call of it with that id). While any is under way the run stops
        (status ``waiting``) and holds no process; a child's end marks it due.
        At most ``at_once`` (default 10) are under way at a time. Each result
        is recorded as a step of this run, so a resume never runs a child
        again. A child that fails, is rejected or is cancelled fails the step
        (:class:`StepFailed`), after ``retries`` more tries of it; cancelling
        this run cancels its children under way.
        """
        items = [(n, w, i) for (n, w, i) in children]
        return await _wait(self._native.children(items, at_once, retries))

    async def sleep(self, name: str, seconds: float) -> None:
        """A durable timer: the run stops and resumes once ``seconds`` have passed."""
        await _wait(self._native.sleep(name, seconds))

    async def now(self) -> _dt.datetime:
        """The current time (UTC), recorded: the same on every replay."""
        return _from_millis(await _wait(self._native.now()))

    async def patched(self, id: str) -> bool:
        """Whether this run takes the new branch of patch ``id``: True for a
        run that reaches this point under code with the patch, False for one
        that passed it under older code. Recorded, so every replay answers
        the same. ``id``: 1 to 100 letters, digits, ``_ . : -``.

        Once no run needs the old branch, call :meth:`deprecate_patch` here
        instead and keep only the new branch.
        """
        return bool(await _wait(self._native.patched(id)))

    async def deprecate_patch(self, id: str) -> None:
        """Steps over patch ``id``'s record in runs that have it here; records nothing."""
        await _wait(self._native.deprecate_patch(id))

    async def random(self) -> int:
        """A random integer in ``[0, 2**64)``, recorded."""
        return await _wait(self._native.random())

    async def uuid(self) -> str:
        """A random UUID (version 4) as a string, recorded."""
        return await _wait(self._native.uuid())

    async def input(self) -> JSON:
        """The run's input as recorded when it started (None without one)."""
        return await _wait(self._native.input())


class SyncDurableContext(_Context):
    """The context of a sync durable function (a plain ``def``, see
    :func:`durable`): the calls of :class:`DurableContext`, each returning its
    value once done instead of an awaitable, under the same rules.

    A step's function must be sync. It runs on the calling thread, and its
    value is recorded there before :meth:`step` returns; one with a
    ``timeout``, or of a run with a ``lease``, runs on a thread of its own
    while this one waits (so that the engine can give up on it, or renew the
    lease), and so does one with a shared ``limit``. :meth:`parallel` runs
    each branch on a thread of its own. Its calls are made from the
    function's own thread (the order of its steps is the record's): a call
    from another thread raises :class:`InvalidInput`.
    """

    def __init__(self, native: _NativeDurableContext) -> None:
        super().__init__(native)
        self._thread = threading.get_ident()

    def _here(self, what: str) -> None:
        if threading.get_ident() != self._thread:
            raise InvalidInput(
                f"ctx.{what} is called from another thread than the sync durable function's: a run's steps "
                "must come in one order, so make context calls from the function's own thread"
            )

    def step(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        retries: Optional[int] = None,
        backoff: Optional[float] = None,
        max_backoff: Optional[float] = None,
        timeout: Optional[float] = None,
        limit: Optional[str] = None,
        version: Optional[str] = None,
    ) -> JSON:
        """Runs ``fn()`` as step ``name`` and returns its value, saved before
        this returns; see :meth:`DurableContext.step`."""
        self._here("step")
        on_loop = inspect.iscoroutinefunction(fn)
        return self._native.step(name, fn, retries, backoff, max_backoff, timeout, on_loop, limit, version).wait()

    def parallel(self, branches: Union[Sequence[Tuple[str, Callable[[], Any]]], Dict[str, Callable[[], Any]]]) -> List[JSON]:
        """Runs several steps at once, each on a thread of its own; see :meth:`DurableContext.parallel`."""
        self._here("parallel")
        items = list(branches.items()) if isinstance(branches, dict) else list(branches)
        for item in items:
            if isinstance(item, tuple) and len(item) == 2 and inspect.iscoroutinefunction(item[1]):
                raise InvalidInput(
                    f"ctx.parallel: branch {item[0]!r}: its function is a coroutine function, and a sync durable "
                    "function runs its branches on threads: give sync functions, or make it an `async def`"
                )
        return self._native.parallel(items).wait()

    def gate(self, name: str, *, timeout: Optional[float] = None, on_timeout: str = "reject") -> JSON:
        """Waits at gate ``name``; see :meth:`DurableContext.gate`."""
        self._here("gate")
        return self._native.gate(name, timeout, on_timeout).wait()

    def wait_for(self, name: str, timeout: Optional[float] = None) -> Optional[Dict[str, JSON]]:
        """Waits for signal ``name``; see :meth:`DurableContext.wait_for`."""
        self._here("wait_for")
        return self._native.wait_for(name, timeout).wait()

    def child(self, name: str, workflow: str, input: JSON = None, *, retries: Optional[int] = None) -> JSON:
        """Runs ``workflow`` as a child run; see :meth:`DurableContext.child`."""
        return self.children([(name, workflow, input)], retries=retries)[0]

    def children(
        self,
        children: Sequence[Tuple[str, str, JSON]],
        *,
        at_once: Optional[int] = None,
        retries: Optional[int] = None,
    ) -> List[JSON]:
        """Starts child runs and returns their results; see :meth:`DurableContext.children`."""
        self._here("children")
        items = [(n, w, i) for (n, w, i) in children]
        return self._native.children(items, at_once, retries).wait()

    def sleep(self, name: str, seconds: float) -> None:
        """A durable timer; see :meth:`DurableContext.sleep`."""
        self._here("sleep")
        self._native.sleep(name, seconds).wait()

    def now(self) -> _dt.datetime:
        """The current time (UTC), recorded."""
        self._here("now")
        return _from_millis(self._native.now().wait())

    def patched(self, id: str) -> bool:
        """Whether this run takes the new branch of patch ``id``; see :meth:`DurableContext.patched`."""
        self._here("patched")
        return bool(self._native.patched(id).wait())

    def deprecate_patch(self, id: str) -> None:
        """Steps over patch ``id``'s record; see :meth:`DurableContext.deprecate_patch`."""
        self._here("deprecate_patch")
        self._native.deprecate_patch(id).wait()

    def random(self) -> int:
        """A random integer in ``[0, 2**64)``, recorded."""
        self._here("random")
        return self._native.random().wait()

    def uuid(self) -> str:
        """A random UUID (version 4) as a string, recorded."""
        self._here("uuid")
        return self._native.uuid().wait()

    def input(self) -> JSON:
        """The run's input as recorded when it started (None without one)."""
        self._here("input")
        return self._native.input().wait()


class Durable:
    """A durable function, made by :func:`durable`: an ``async def`` (its
    context is a :class:`DurableContext`) or a plain ``def`` (a
    :class:`SyncDurableContext`)."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"durable function {name!r}: {fn!r} is not a function")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"durable function {name!r}: {fn!r} is a generator function; make it an `async def` or a plain `def`"
            )
        self.name = name
        self.fn = fn
        #: Whether the function is a plain ``def``: it runs on the thread that
        #: calls :meth:`run`, and so do its steps.
        self.is_sync = not inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)
        params = inspect.signature(fn).parameters.values()
        self._takes_input = sum(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
        ) >= 2

    async def run_async(
        self, run_id: str, store: Store, input: JSON = None, *, accept_changed: bool = False,
        wait_for_timers: bool = False, lease: Optional[float] = None,
        budget: Optional[Dict[str, float]] = None,
    ) -> Outcome:
        """Starts or resumes run ``run_id``; see :func:`run_async`. A sync
        function runs on a thread of its own (``asyncio.to_thread``)."""
        if self.is_sync:
            return await asyncio.to_thread(
                self.run, run_id, store, input, accept_changed=accept_changed, wait_for_timers=wait_for_timers,
                lease=lease, budget=budget,
            )
        loop = asyncio.get_running_loop()
        takes_input = self._takes_input

        def body(native: _NativeDurableContext) -> Awaitable[Any]:
            ctx = DurableContext(native)

            async def go() -> Any:
                if takes_input:
                    return await self.fn(ctx, await ctx.input())
                return await self.fn(ctx)

            return go()

        t = await _wait(
            _native.run_durable(
                loop, _invoke, run_id, self.name, body, store, input, accept_changed, wait_for_timers, lease,
                _budget(budget),
            )
        )
        return _outcome(t)

    def run(
        self, run_id: str, store: Store, input: JSON = None, *, accept_changed: bool = False,
        wait_for_timers: bool = False, lease: Optional[float] = None,
        budget: Optional[Dict[str, float]] = None,
    ) -> Outcome:
        """Starts or resumes run ``run_id`` and waits for it; see :func:`run`.

        A sync function runs on this thread, and so does each of its steps
        (one with a ``timeout``, or of a run with a ``lease``, on a thread of
        its own while this one waits): a step and its checkpoint cost no
        hand-off between threads.
        """
        if not self.is_sync:
            return _sync(
                self.run_async(
                    run_id, store, input, accept_changed=accept_changed, wait_for_timers=wait_for_timers,
                    lease=lease, budget=budget,
                )
            )
        takes_input = self._takes_input

        def body(native: _NativeDurableContext) -> Any:
            ctx = SyncDurableContext(native)
            if takes_input:
                return self.fn(ctx, ctx.input())
            return self.fn(ctx)

        t = _native.run_durable_sync(
            _invoke, run_id, self.name, body, store, input, accept_changed, wait_for_timers, lease, _budget(budget)
        )
        return _outcome(t)

    def __repr__(self) -> str:
        return f"<durable function {self.name!r}>"


def durable(name: str) -> Callable[[Callable[..., Any]], Durable]:
    """Makes ``async def f(ctx)`` or ``async def f(ctx, input)`` a durable function named ``name``.

    Run it with ``f.run(run_id, store, input)`` or :func:`run`. The input is
    recorded when the run starts; a resume passes the recorded one.

    A plain ``def f(ctx)`` (or ``def f(ctx, input)``) is a sync durable
    function: its context's calls (a :class:`SyncDurableContext`) return
    values instead of awaitables, and its steps' functions, which must be
    sync, run on the thread that runs it, each recorded there before the step
    returns, with no event loop and no hand-off to other threads::

        @steadfast.durable("agent")
        def agent(ctx, question):
            plan = ctx.step("plan", lambda: call_model(question))
            return ctx.step("answer", lambda: answer(plan))
    """

    def wrap(fn: Callable[..., Any]) -> Durable:
        return Durable(name, fn)

    return wrap


async def run_async(
    run_id: str,
    workflow: Union[Workflow, Durable],
    store: Store,
    input: JSON = None,
    *,
    accept_changed: bool = False,
    wait_for_timers: bool = False,
    lease: Optional[float] = None,
    budget: Optional[Dict[str, float]] = None,
) -> Outcome:
    """Starts or resumes run ``run_id`` of ``workflow`` on ``store``.

    The same call starts a fresh run and resumes a crashed one: completed steps
    are skipped, the run goes on at the first step without a checkpoint.
    ``input`` (a dict for a listed workflow) is recorded when the run starts.
    ``accept_changed`` cuts the record where changed code diverges instead of
    raising :class:`WorkflowChanged`; ``wait_for_timers`` sleeps through durable
    timers instead of returning a sleeping outcome.

    ``lease`` (seconds, 100 ms to 1 day; as ``steadfast run --lease``)
    leases the run to this process while the call runs, renewed as steps run
    and released when it returns, fails or is cancelled: another process
    running the same run meanwhile gets :class:`Held` and runs nothing; a
    lease whose process died on this host, or that was not renewed in time,
    is taken over. Two calls in one process share its lease. Without a
    lease (the default, as in the Rust library) two processes on one run both
    run steps and the slower one fails with :class:`Conflict` at its next
    checkpoint: nothing is lost, but a step may run twice.

    ``budget`` (``{"tokens": 200000, "usd": 5}``) is recorded with a run
    that has none yet: once the spend its steps report with
    :meth:`StepContext.spend` (or :meth:`DurableContext.spend`) passes one,
    the run stops at its ``budget`` gate before its next step (a waiting
    outcome, gate ``"budget"``) until :func:`approve` grants more
    (``data={"usd": 10}`` adds 10) or :func:`reject` ends it.
    """
    if isinstance(workflow, Durable):
        return await workflow.run_async(
            run_id, store, input, accept_changed=accept_changed, wait_for_timers=wait_for_timers, lease=lease,
            budget=budget,
        )
    if not isinstance(workflow, Workflow):
        raise TypeError(f"run: expected a Workflow or a durable function, not {type(workflow).__name__}")
    loop = asyncio.get_running_loop()
    t = await _wait(
        _native.run_workflow(
            loop, _invoke, run_id, workflow.name, workflow._steps, store, input, accept_changed, wait_for_timers,
            lease, _budget(budget), workflow.version,
        )
    )
    return _outcome(t)


def run(
    run_id: str,
    workflow: Union[Workflow, Durable],
    store: Store,
    input: JSON = None,
    *,
    accept_changed: bool = False,
    wait_for_timers: bool = False,
    lease: Optional[float] = None,
    budget: Optional[Dict[str, float]] = None,
) -> Outcome:
    """Starts or resumes a run and waits for it: :func:`run_async` on an event loop of its own.

    Inside a running event loop, ``await run_async(...)`` instead. A sync
    durable function runs on this thread (see :func:`durable`).
    """
    if isinstance(workflow, Durable) and workflow.is_sync:
        return workflow.run(
            run_id, store, input, accept_changed=accept_changed, wait_for_timers=wait_for_timers, lease=lease,
            budget=budget,
        )
    return _sync(
        run_async(
            run_id, workflow, store, input, accept_changed=accept_changed, wait_for_timers=wait_for_timers,
            lease=lease, budget=budget,
        )
    )


def _budget(budget: Optional[Dict[str, float]]) -> Optional[Dict[str, float]]:
    """A budget as the engine takes it: names and floats (a bool is no amount)."""
    if budget is None:
        return None
    if not isinstance(budget, dict):
        raise InvalidInput(f"the budget is a dict of names and amounts, not {type(budget).__name__}")
    out: Dict[str, float] = {}
    for name, amount in budget.items():
        if not isinstance(name, str) or isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise InvalidInput(f"the budget: {name!r}: {amount!r} is not a name and a number")
        out[name] = float(amount)
    return out


def _sync(coro: Awaitable[Outcome]) -> Outcome:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    coro.close()  # type: ignore[attr-defined]
    raise RuntimeError("steadfast.run was called inside a running event loop; use `await steadfast.run_async(...)`")


def child_id(parent: str, step: str) -> str:
    """The id of the child run that step ``step`` of run ``parent`` starts
    (``PARENT~STEP``, shortened with a hash when longer than a run id may be)."""
    return _native.child_id(parent, step)


def signal(store: Store, run_id: str, name: str, data: JSON = None, *, by: Optional[str] = None) -> int:
    """Sends signal ``name`` carrying ``data`` to run ``run_id`` (as
    ``steadfast signal``); returns its number in the run's event log.

    It is kept until a wait for ``name`` takes it: at once when the run waits
    for it now (the run is due: run it again, or a worker does), else at the
    run's next wait of that name. Each wait takes one signal, once. Raises
    :class:`NoSuchRun`, :class:`InvalidInput` (an ended run, a bad name or
    data) or :class:`StoreError`.
    """
    return _native.signal(store, run_id, name, data, by)


def approve(store: Store, run_id: str, gate: str, data: JSON = None, *, by: Optional[str] = None) -> Dict[str, JSON]:
    """Approves gate ``gate`` of waiting run ``run_id`` (as ``steadfast approve``); returns the saved record.

    ``data`` is merged into the state under the gate's name; ``by`` (default
    ``$USER``, else ``$LOGNAME``, else ``"python"``) is recorded with the
    time. Run again to go on.
    """
    return _native.approve(store, run_id, gate, data, by)


def reject(store: Store, run_id: str, gate: str, reason: Optional[str] = None, *, by: Optional[str] = None) -> Dict[str, JSON]:
    """Rejects gate ``gate`` of waiting run ``run_id``: the run ends as rejected; returns the saved record."""
    return _native.reject(store, run_id, gate, reason, by)


def show(store: Store, run_id: str) -> Dict[str, JSON]:
    """The run's record: status, state, completed steps, decisions, lease, error. Raises :class:`NoSuchRun`."""
    return _native.show(store, run_id)


def history(store: Store, run_id: str) -> List[Dict[str, JSON]]:
    """The run's step records, oldest first: name, update, attempt, start and end. Raises :class:`NoSuchRun`."""
    return _native.history(store, run_id)


def code_version(func: Callable[..., Any]) -> str:
    """A step version taken from the source code of ``func``: ``sha256:``
    and 24 hex digits of the SHA-256 of its source text (as
    ``inspect.getsource`` reads it), so that any edit of the function makes
    a new version and :func:`plan` shows the step as changed::

        def fetch(ctx, state): ...
        wf.step("fetch", fetch, version=steadfast.code_version(fetch))

    Only the function's own text counts, not the functions it calls.
    Raises :class:`InvalidInput` when the source cannot be read (a builtin,
    code typed at a prompt).
    """
    import hashlib

    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as e:
        raise InvalidInput(f"code_version: the source of {func!r} cannot be read: {e}") from None
    return "sha256:" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:24]


def plan(store: Store, run_id: str, workflow: Workflow) -> Dict[str, JSON]:
    """What resuming ``run_id`` with ``workflow`` would do, as ``steadfast plan
    --json`` prints it; nothing is run or written.

    ``steps`` lists each step with its ``action``: ``"skip"`` (recorded),
    ``"changed"`` (recorded, but its definition, such as its ``version``,
    differs: ``changes`` says how), ``"removed"``, ``"renamed"``,
    ``"added"``, ``"moved"`` or ``"run"``. ``stops_at`` says where a resume
    would raise :class:`WorkflowChanged`, ``accept`` what ``accept_changed``
    would do instead, and ``clean`` is true when nothing recorded differs.
    Raises :class:`NoSuchRun`.
    """
    if not isinstance(workflow, Workflow):
        raise TypeError(f"plan: expected a Workflow, not {type(workflow).__name__}")
    return _native.plan(store, run_id, workflow.name, workflow._steps, workflow.version)


def migrate(
    store: Store,
    run_id: str,
    workflow: Workflow,
    renames: Optional[Dict[str, str]] = None,
    *,
    by: Optional[str] = None,
) -> Dict[str, JSON]:
    """Moves ``run_id`` to ``workflow``, a newer version of its workflow, as
    ``steadfast migrate`` does: recorded steps are renamed as ``renames``
    says (``{"old": "new"}``), and the move is recorded in the run's audit.
    Refused (:class:`InvalidInput`, nothing written) unless every recorded
    step is then in place with an unchanged definition; returns the plan
    after the move.
    """
    if not isinstance(workflow, Workflow):
        raise TypeError(f"migrate: expected a Workflow, not {type(workflow).__name__}")
    pairs = list((renames or {}).items())
    return _native.migrate(store, run_id, workflow.name, workflow._steps, pairs, by, workflow.version)


class Watch:
    """What :func:`watch` returns: an async iterator of a run's items as
    ``steadfast watch --json`` prints them, each a dict with a ``kind``:
    ``"event"`` (``seq``, ``step``, ``attempt``, ``at``, ``value``),
    ``"started"``, ``"superseded"``, ``"done"``, ``"failed"``, ``"signal"``
    (``seq``, ``signal``, ``data``, ``by``, ``at``), and last ``"waiting"``,
    ``"waiting_for_signal"``, ``"waiting_for_children"``, ``"sleeping"``,
    ``"completed"``, ``"ended"`` or
    ``"gone"``. The iteration ends when the run ends or stops.
    """

    def __init__(self, native: Any) -> None:
        self._native = native

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> Dict[str, JSON]:
        item = await _wait(self._native.next())
        if item is None:
            raise StopAsyncIteration
        return item


def watch(store: Store, run_id: str, *, after: int = 0, poll: float = 0.05) -> Watch:
    """Watches run ``run_id`` as it works, from any process::

        async for item in steadfast.watch(store, "run-1"):
            if item["kind"] == "event":
                print(item["seq"], item["value"])

    ``after`` skips the events numbered up to it (the last ``seq`` seen, to
    go on after a reconnect); ``poll`` is how often the store is looked at,
    in seconds (0.001 to 60). A run that does not exist yet is waited for.
    """
    return Watch(_native.watch(store, run_id, after, poll))


def runs(
    store: Store,
    *,
    status: Optional[str] = None,
    workflow: Optional[str] = None,
    after: Optional[str] = None,
    limit: Optional[int] = None,
    version: Optional[str] = None,
) -> List[Dict[str, JSON]]:
    """Runs in id order (as ``steadfast runs --json``), filtered by status,
    workflow and the ``version`` of the workflow they were started under
    (each run's ``workflow_version``), paged by ``after`` and ``limit``."""
    return _native.runs(store, status, workflow, after, limit, version)


def start(
    store: Store,
    workflow: Union[str, Workflow, Durable],
    run_id: str,
    input: JSON = None,
    *,
    priority: int = 0,
    partition: Optional[str] = None,
) -> bool:
    """Records a new pending run for a worker or a later :func:`run`.

    False if it exists already as started the same way; :class:`InvalidInput`
    (and the run left as it is) if it was started with another workflow,
    other steps, another input, or another priority or partition. A
    :class:`Workflow`'s step names are recorded, so that a later run with
    other steps under the same name is refused with :class:`WorkflowChanged`
    before any step runs, and so are its ``version``: the run resumes only
    under that version.

    Workers claim runs of higher ``priority`` first (-1000 to 1000), and
    within a priority share their claims between ``partition`` keys (a
    tenant, say), so one partition's backlog does not hold back another's.
    """
    durable_fn = isinstance(workflow, Durable)
    name = workflow if isinstance(workflow, str) else workflow.name
    steps = workflow.step_names if isinstance(workflow, Workflow) else None
    version = workflow.version if isinstance(workflow, Workflow) else None
    return _native.start(store, name, run_id, input, durable_fn, steps, priority, partition, version)


def add_schedule(
    store: Store,
    name: str,
    workflow: Union[str, Workflow, Durable],
    cron: str,
    *,
    tz: str = "UTC",
    input: JSON = None,
    catch_up: int = 1,
) -> Dict[str, JSON]:
    """Adds a schedule, as ``steadfast schedule add`` does, and returns it.

    A worker whose registry has ``workflow`` (``steadfast worker FLOW``, or a
    Rust ``Worker``) starts one run per slot of ``cron`` (five fields, or six
    with seconds first), read in the IANA time zone ``tz``; the run's id is
    ``NAME@SLOT`` with the slot in UTC. When several slots are due at once
    (no worker looked for a while) the latest and at most ``catch_up`` before
    it start. :class:`InvalidInput` when a part is wrong or the name is taken.
    """
    name_of = workflow if isinstance(workflow, str) else workflow.name
    return _native.add_schedule(store, name, name_of, cron, tz, input, catch_up)


def schedules(store: Store) -> List[Dict[str, JSON]]:
    """The store's schedules with their next slots, as ``steadfast schedule list --json``."""
    return _native.schedules(store)


def remove_schedule(store: Store, name: str) -> bool:
    """Removes schedule ``name`` (the runs it started stay); False when there is none."""
    return _native.remove_schedule(store, name)


__all__ = [
    "DEFAULT_STORE_URL",
    "backends",
    "code_version",
    "Durable",
    "SyncDurableContext",
    "DurableContext",
    "Outcome",
    "StepContext",
    "Store",
    "Workflow",
    "add_schedule",
    "approve",
    "signal",
    "durable",
    "history",
    "migrate",
    "open_store",
    "plan",
    "reject",
    "remove_schedule",
    "run",
    "run_async",
    "runs",
    "schedules",
    "show",
    "start",
    "watch",
    "Watch",
    *_error_names,
]
