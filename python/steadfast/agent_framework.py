"""Checkpoint storage for Microsoft Agent Framework workflows in a Steadfast store.

`SteadfastCheckpointStorage` implements Agent Framework's `CheckpointStorage`
protocol (``save``, ``load``, ``list_checkpoints``, ``list_checkpoint_ids``,
``get_latest``, ``delete``) on every store URL: ``sqlite:PATH``,
``postgres://…``, ``file:PATH``, ``cosmos://…`` and ``memory:``. Checkpoints
are kept in the store's shared documents, apart from its runs:

- every save is durable before ``save`` returns, as a document write of the
  store is (``synchronous=FULL`` on SQLite, ``synchronous_commit=on`` on
  PostgreSQL, an fsynced file and directory on the file store, an
  acknowledged write on Cosmos DB); Agent Framework's own
  `FileCheckpointStorage` renames a file into place without syncing it;
- one writer per workflow run. A run's checkpoints form a chain through
  ``previous_checkpoint_id``, listed in one document of the store. A save
  writes the checkpoint's body first and then that listing by
  compare-and-swap, which is also where the storage takes or renews its
  lease on the run; a checkpoint exists once the listing has it, so a save
  refused or cut short by a crash leaves no checkpoint. Loading a checkpoint
  (which is how Agent Framework resumes a run) takes the lease too. Another
  storage loading or saving into a run whose holder is alive gets
  `steadfast.Held` and nothing is written, until the holder calls `release`
  or `close`, or its lease (``lease_seconds``) runs out, or its process is
  gone; a holder whose lease ran out and was taken by another may then only
  save a checkpoint that follows the run's latest. Agent Framework swallows
  an error from ``save`` (it logs it and goes on), but not one from the
  ``load`` of a resume: a second process resuming a held run fails there,
  before any executor runs, with Agent Framework's
  ``WorkflowCheckpointException`` whose ``__cause__`` is `steadfast.Held`.
  Without this, two processes resumed from one checkpoint would fork the run
  and both carry on.

A checkpoint is encoded as `FileCheckpointStorage` encodes it (JSON, with
values JSON cannot hold pickled and restored only for allowed types), and is
refused at save time when it would not load back.

Example::

    from agent_framework import WorkflowBuilder
    from steadfast.agent_framework import SteadfastCheckpointStorage

    storage = SteadfastCheckpointStorage("sqlite:.steadfast/maf.db")
    # A name of its own: without one, every process names the workflow anew.
    workflow = WorkflowBuilder(name="review", start_executor=first, checkpoint_storage=storage).build()
    result = await workflow.run("hello")
    # after a crash, in a new process:
    latest = await storage.get_latest(workflow_name="review")
    result = await workflow.run(checkpoint_id=latest.checkpoint_id)
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from datetime import datetime
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from agent_framework import WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from steadfast._native import ChainStore

__all__ = ["SteadfastCheckpointStorage"]

_T = TypeVar("_T")

# The documents' namespace: apart from any other use of the store's shared
# documents (concurrency limits, rate buckets).
_NS = "agent-framework"

logger = logging.getLogger(__name__)


def _is_text(s: str) -> bool:
    """Whether `s` is well-formed Unicode (no lone surrogates), as ids must be."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _close_quietly(store: ChainStore) -> None:
    try:
        store.close()
    except Exception:
        pass


def _when(cp: WorkflowCheckpoint) -> tuple[float, str]:
    """Order of checkpoints: by timestamp (as Agent Framework's own storages
    judge the latest), unreadable timestamps first; the sort is stable, so
    equal timestamps keep their order of saving."""
    try:
        return (datetime.fromisoformat(cp.timestamp).timestamp(), "")
    except (TypeError, ValueError):
        return (float("-inf"), str(cp.timestamp))


class SteadfastCheckpointStorage:
    """Agent Framework checkpoints in a Steadfast store, one writer per workflow run."""

    def __init__(
        self,
        url: str,
        *,
        lease_seconds: float = 60.0,
        allowed_checkpoint_types: Sequence[str] | None = None,
        encrypt: bool = False,
    ) -> None:
        """Open (creating it when missing) the store `url` names.

        Args:
            url: Any store URL: ``sqlite:PATH``, ``postgres://…`` (with
                ``?schema=NAME``), ``file:PATH``, ``cosmos://…`` or
                ``memory:`` (a store of this storage's own).
            lease_seconds: How long a workflow run stays this storage's after
                its last save or load.
            allowed_checkpoint_types: Types beyond Agent Framework's safe set
                that checkpoints may hold, as ``"module:qualname"`` (as for
                `FileCheckpointStorage`).
            encrypt: Seal every checkpoint with the keys in
                ``STEADFAST_ENCRYPTION_KEY`` or
                ``STEADFAST_ENCRYPTION_KEY_FILE``, bound to its ID.

        Raises:
            steadfast.Unsupported: A URL no store opens.
            steadfast.InvalidInput: A lease out of range, or encryption
                without keys.
        """
        if isinstance(allowed_checkpoint_types, str):
            raise TypeError("allowed_checkpoint_types is a list of 'module:qualname' strings, not one string")
        self._store = ChainStore(url, _NS, lease_seconds, encrypt)
        self._allowed: frozenset[str] = frozenset(allowed_checkpoint_types or [])
        weakref.finalize(self, _close_quietly, self._store)

    # -- the protocol -----------------------------------------------------------

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store a copy of `checkpoint`; its ID.

        Saving an ID again replaces the checkpoint.

        Raises:
            WorkflowCheckpointException: The checkpoint cannot be encoded, or
                would not load back under this storage's allowed types.
            steadfast.Held: Another live process holds the workflow run;
                nothing was written.
        """
        return await self._off_loop(self._save, checkpoint)

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """A copy of checkpoint `checkpoint_id`, its workflow run claimed for
        this storage (Agent Framework loads a checkpoint to resume from it).
        To look without claiming, use `list_checkpoints` or `get_latest`.

        Raises:
            WorkflowCheckpointException: There is no such checkpoint.
            steadfast.Held: Another live storage holds its workflow run.
        """
        return await self._off_loop(self._load, checkpoint_id)

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """Copies of every checkpoint of workflow `workflow_name`, oldest first."""
        return await self._off_loop(self._list, workflow_name)

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """The IDs of every checkpoint of workflow `workflow_name`, oldest first."""
        return [cp.checkpoint_id for cp in await self.list_checkpoints(workflow_name=workflow_name)]

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """A copy of the newest checkpoint (by timestamp) of workflow `workflow_name`, or None."""
        found = await self.list_checkpoints(workflow_name=workflow_name)
        return found[-1] if found else None

    async def delete(self, checkpoint_id: str) -> bool:
        """Delete checkpoint `checkpoint_id`; False when there is none.

        Raises:
            steadfast.Held: Another live process holds its workflow run.
        """
        return await self._off_loop(self._delete, checkpoint_id)

    # -- leases -------------------------------------------------------------------

    def release(self, checkpoint_id: str) -> None:
        """Give up this storage's lease on the workflow run `checkpoint_id` is in."""
        cid = str(checkpoint_id)
        if _is_text(cid):
            self._store.release(cid)

    def close(self) -> None:
        """Give up every workflow run this storage holds; it stays usable."""
        self._store.close()

    # -- the work, off the event loop ----------------------------------------

    async def _off_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(fn, *args)

    def _save(self, checkpoint: WorkflowCheckpoint) -> str:
        from agent_framework._workflows._checkpoint_encoding import (
            decode_checkpoint_value,
            encode_checkpoint_value,
        )

        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise TypeError(f"save takes a WorkflowCheckpoint, not {type(checkpoint).__name__}")
        cid = str(checkpoint.checkpoint_id)
        previous = checkpoint.previous_checkpoint_id
        previous = None if previous is None else str(previous)
        texts = [cid, str(checkpoint.workflow_name), str(checkpoint.timestamp), previous or ""]
        if not all(_is_text(t) for t in texts):
            raise WorkflowCheckpointException(
                f"checkpoint {cid!r}: its ID, predecessor, workflow name and timestamp must be "
                "well-formed text (no lone surrogates); nothing was written"
            )
        try:
            encoded = encode_checkpoint_value(checkpoint.to_dict())
            decode_checkpoint_value(encoded, allowed_types=self._allowed)
            body = json.dumps(encoded, ensure_ascii=False)
            if not _is_text(body):
                # Lone surrogates in a value: escaped, they read back as they were.
                body = json.dumps(encoded)
        except WorkflowCheckpointException:
            raise
        except Exception as ex:
            raise WorkflowCheckpointException(
                f"checkpoint {cid} cannot be encoded, or would not load back under this storage's "
                "allowed types; nothing was written"
            ) from ex
        self._store.put(cid, str(checkpoint.workflow_name), previous, str(checkpoint.timestamp), body)
        return cid

    def _decode(self, cid: str, body: str) -> WorkflowCheckpoint:
        from agent_framework._workflows._checkpoint_encoding import decode_checkpoint_value

        try:
            data = decode_checkpoint_value(json.loads(body), allowed_types=self._allowed)
        except WorkflowCheckpointException:
            raise
        except Exception as ex:
            raise WorkflowCheckpointException(f"checkpoint {cid} cannot be read back: {ex}") from ex
        return WorkflowCheckpoint.from_dict(data)

    def _load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        cid = str(checkpoint_id)
        # Claim the run before reading what to resume from (no other writer
        # can replace it after), or raise Held when a live storage has it.
        found = self._store.get(cid) if _is_text(cid) and self._store.claim(cid) else None
        if found is None:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        return self._decode(cid, found[5])

    def _list(self, workflow_name: str) -> list[WorkflowCheckpoint]:
        name = str(workflow_name)
        if not _is_text(name):
            return []
        found = []
        for item in self._store.list(name):
            # As Agent Framework's file storage does: one checkpoint that
            # cannot be read here does not hide the others.
            if isinstance(item, str):
                logger.warning("skipping a checkpoint of workflow %s: %s", name, item)
                continue
            try:
                found.append(self._decode(item[0], item[5]))
            except WorkflowCheckpointException as e:
                logger.warning("skipping checkpoint %s: %s", item[0], e)
        found.sort(key=_when)
        return found

    def _delete(self, checkpoint_id: str) -> bool:
        cid = str(checkpoint_id)
        return _is_text(cid) and self._store.delete(cid)
