"""A Microsoft Agent Framework workflow with a human in the loop, checkpointed in
a Steadfast store.

Three executors in a line: ``draft`` writes a draft, ``polish`` improves it
(slowly: it stands for a model call), and ``review`` asks a person to approve
it (Agent Framework's ``request_info``) and yields the answer. Agent
Framework checkpoints after every superstep into
``steadfast.agent_framework.SteadfastCheckpointStorage``. Kill the process at
any moment and run it with ``--resume``: it goes on from the last checkpoint,
re-running only the superstep that was cut off. When it waits for the
review, answer with ``--answer``:

    python3 python/examples/maf_review.py --topic tides
    python3 python/examples/maf_review.py --answer "ship it"

Prints one JSON line: the status, the request waiting for an answer, and the
outputs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from agent_framework import Executor, WorkflowBuilder, WorkflowContext, handler, response_handler

from steadfast.agent_framework import SteadfastCheckpointStorage

NAME = "maf-review"
DELAY = 0.3
LOG: str | None = None


def log(event: str, name: str) -> None:
    """One line per executor start and end, for the kill test to count."""
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"event": event, "step": name, "pid": os.getpid()}) + "\n")


class Draft(Executor):
    @handler
    async def write(self, topic: str, ctx: WorkflowContext[str]) -> None:
        log("start", "draft")
        await asyncio.sleep(DELAY)
        log("end", "draft")
        await ctx.send_message(f"a draft about {topic}")


class Polish(Executor):
    @handler
    async def improve(self, draft: str, ctx: WorkflowContext[str]) -> None:
        log("start", "polish")
        await asyncio.sleep(DELAY * 3)
        log("end", "polish")
        await ctx.send_message(f"{draft}, polished")


class Review(Executor):
    @handler
    async def ask(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        log("start", "review")
        await ctx.request_info(text, str)

    @response_handler
    async def answered(self, original_request: str, response: str, ctx: WorkflowContext[str, str]) -> None:
        log("end", "review")
        await ctx.yield_output(f"{original_request}: {response}")


def build(storage: SteadfastCheckpointStorage) -> Any:
    draft, polish, review = Draft(id="draft"), Polish(id="polish"), Review(id="review")
    return (
        WorkflowBuilder(name=NAME, start_executor=draft, checkpoint_storage=storage)
        .add_edge(draft, polish)
        .add_edge(polish, review)
        .build()
    )


async def main() -> int:
    global DELAY, LOG
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", default="sqlite:.steadfast/maf.db", help="store URL (default: %(default)s)")
    p.add_argument("--topic", default="durable execution")
    p.add_argument("--resume", action="store_true", help="go on from the last checkpoint")
    p.add_argument("--answer", help="answer the review the workflow waits for (resumes from the last checkpoint)")
    p.add_argument("--delay", type=float, default=DELAY, help="seconds the draft takes (the polish, three times that)")
    p.add_argument("--log", help="append a line per executor start and end to this file")
    a = p.parse_args()
    if a.delay < 0:
        p.error("--delay: expected seconds, 0 or more")
    DELAY, LOG = a.delay, a.log
    storage = SteadfastCheckpointStorage(a.store)
    workflow = build(storage)
    try:
        if a.resume or a.answer is not None:
            latest = await storage.get_latest(workflow_name=NAME)
            if latest is None:
                print(json.dumps({"status": "no checkpoint to resume from"}))
                return 1
            if a.answer is not None:
                responses = {rid: a.answer for rid in latest.pending_request_info_events}
                if not responses:
                    print(json.dumps({"status": "nothing waits for an answer"}))
                    return 1
                result = await workflow.run(checkpoint_id=latest.checkpoint_id, responses=responses)
            else:
                result = await workflow.run(checkpoint_id=latest.checkpoint_id)
        else:
            result = await workflow.run(a.topic)
    finally:
        storage.close()
    pending = [e.request_id for e in result.get_request_info_events()]
    outputs = result.get_outputs()
    print(json.dumps({"status": "waiting" if pending else "completed", "pending": pending, "outputs": outputs}))
    return 4 if pending else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
