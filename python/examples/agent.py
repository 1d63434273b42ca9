"""A tool-calling agent loop as a durable function, with a scripted model.

The loop asks the "model" what to do, runs the tools it picked in parallel,
hands the results back, and stops when the model answers. Every model call and
every tool call is a step: kill the process at any moment (Ctrl-C, SIGKILL, an
OOM kill) and run the same command again; finished calls are not repeated and
the loop goes on where it stopped.

    python3 python/examples/agent.py --run-id demo "How many tools does it take?"

The model is a script (no network, no key), so the run is the same every time;
each call sleeps ``--delay`` seconds to stand for the latency of a real one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Dict, List

import steadfast

# What the scripted model answers, turn by turn: tool calls, then an answer.
SCRIPT: List[Dict[str, Any]] = [
    {"tool_calls": [
        {"name": "search", "args": {"query": "durable execution"}},
        {"name": "search", "args": {"query": "checkpoint after every step"}},
    ]},
    {"tool_calls": [
        {"name": "calculator", "args": {"a": 6, "b": 7}},
        {"name": "fetch", "args": {"doc": "doc-2"}},
    ]},
    {"tool_calls": [{"name": "fetch", "args": {"doc": "doc-4"}}]},
    {"answer": None},
]

DELAY = 0.3
LOG = None


def log(event: str, name: str) -> None:
    """Appends one line per step start/end, for the kill test to count."""
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"event": event, "step": name, "pid": os.getpid()}) + "\n")
            f.flush()


def call_model(name: str, messages: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The scripted model: the reply for this turn, with the answer built from what the tools said."""
    log("start", name)
    time.sleep(DELAY)
    turn = sum(1 for m in messages if m["role"] == "assistant")
    reply = dict(SCRIPT[min(turn, len(SCRIPT) - 1)])
    if "answer" in reply:
        seen = [r for m in messages if m["role"] == "tool" for r in m["results"]]
        reply["answer"] = f"{len(seen)} tool results; 6*7 = {seen[2]['result']}"
    log("end", name)
    return reply


async def run_tool(name: str, call: Dict[str, Any]) -> Dict[str, Any]:
    """The tools: async, as network calls would be."""
    log("start", name)
    await asyncio.sleep(DELAY)
    args = call["args"]
    if call["name"] == "search":
        result: Any = [f"doc-{len(args['query']) % 5}", f"doc-{len(args['query']) % 3}"]
    elif call["name"] == "calculator":
        result = args["a"] * args["b"]
    else:
        result = f"contents of {args['doc']}"
    log("end", name)
    return {"tool": call["name"], "result": result}


@steadfast.durable("tool-agent")
async def agent(ctx: steadfast.DurableContext, task: Dict[str, Any]) -> Dict[str, Any]:
    """Model, tools, model, …, answer: each call a recorded step."""
    messages: List[Dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    for turn in range(8):
        name = f"model-{turn}"
        reply = await ctx.step(name, lambda: call_model(name, messages), retries=2, backoff=0.2)
        messages.append({"role": "assistant", **reply})
        if reply.get("answer"):
            return {"answer": reply["answer"], "turns": turn + 1}
        branches = [
            (f"tool-{turn}-{i}-{c['name']}", (lambda n=f"tool-{turn}-{i}-{c['name']}", c=c: run_tool(n, c)))
            for i, c in enumerate(reply["tool_calls"])
        ]
        results = await ctx.parallel(branches)
        messages.append({"role": "tool", "results": results})
    raise steadfast.TerminalError("the model did not answer within 8 turns")


def main() -> int:
    global DELAY, LOG
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("question", nargs="?", default="What does a checkpoint cost?")
    p.add_argument("--store", default=steadfast.DEFAULT_STORE_URL, help="store URL (default: %(default)s)")
    p.add_argument("--run-id", default="agent-demo")
    p.add_argument("--delay", type=float, default=DELAY, help="seconds each model or tool call takes")
    p.add_argument("--log", help="append a line per step start and end to this file")
    p.add_argument(
        "--lease", type=float, default=30.0,
        help="seconds the run is leased to this process while it runs, so that a second copy gets Held "
        "instead of running the same steps; 0 runs without a lease (default: %(default)s)",
    )
    a = p.parse_args()
    DELAY, LOG = a.delay, a.log
    store = steadfast.open_store(a.store)
    outcome = agent.run(a.run_id, store, {"question": a.question}, lease=a.lease or None)
    print(json.dumps({"status": outcome.status, "value": outcome.value}))
    return 0 if outcome.completed else 4


if __name__ == "__main__":
    sys.exit(main())
