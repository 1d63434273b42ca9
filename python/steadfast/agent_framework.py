"""Checkpoint storage for Microsoft Agent Framework workflows in a Steadfast store.

`SteadfastCheckpointStorage` implements Agent Framework's `CheckpointStorage`
protocol (``save``, ``load``, ``list_checkpoints``, ``list_checkpoint_ids``,
``get_latest``, ``delete``) on ``sqlite:PATH``, ``postgres://…`` and
``memory:``, through the same graph store as the LangGraph checkpointer:

- every save is one transaction, synced before ``save`` returns
  (``synchronous=FULL`` on SQLite, ``synchronous_commit=on`` on PostgreSQL);
  Agent Framework's own `FileCheckpointStorage` renames a file into place
  without syncing it;
- one writer per workflow run. A run's checkpoints form a chain through
  ``previous_checkpoint_id``; the storage takes a lease on the chain with
  every save, in the same transaction, and when it loads a checkpoint of it
  (which is how Agent Framework resumes a run). Another storage loading or
  saving into a chain whose holder is alive gets `steadfast.Held` and nothing
  is written, until the holder calls `release` or `close`, or its lease
  (``lease_seconds``) runs out, or its process is gone. Agent Framework
  swallows an error from ``save`` (it logs it and goes on), but not one from
  the ``load`` of a resume: a second process resuming a held run fails there,
  before any executor runs, with Agent Framework's
  ``WorkflowCheckpointException`` whose ``__cause__`` is `steadfast.Held`. Without this, two processes resumed from one
  checkpoint would fork the run and both carry on.

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
import threading
import weakref
from datetime import datetime
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from agent_framework import WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from steadfast._native import GraphStore

__all__ = ["SteadfastCheckpointStorage"]

_T = TypeVar("_T")

# Checkpoints live in a namespace of their own in the graph store's tables,
# apart from LangGraph threads saved in the same database.
_NS = "agent-framework"
_TYPE = "maf-json"
# A checkpoint's metadata names it as the graph store's "run" so that it can
# be deleted alone; the prefix keeps it apart from LangGraph's run ids.
_RUN = "agent-framework:"


# How many checkpoints' chains a storage remembers.
_CACHE = 4096

logger = logging.getLogger(__name__)


def _is_text(s: str) -> bool:
    """Whether `s` is well-formed Unicode (no lone surrogates), as ids must be."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _close_quietly(store: GraphStore) -> None:
    try:
        store.close()
    except Exception:
        pass


def _when(cp: WorkflowCheckpoint) -> tuple[float, str, str]:
    """Order of checkpoints: by timestamp (as Agent Framework's own storages
    judge the latest), unreadable timestamps first, then by ID."""
    try:
        return (datetime.fromisoformat(cp.timestamp).timestamp(), "", cp.checkpoint_id)
    except (TypeError, ValueError):
        return (float("-inf"), str(cp.timestamp), cp.checkpoint_id)


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
        """Open (creating its tables when missing) the store `url` names.

        Args:
            url: ``sqlite:PATH``, ``postgres://…`` (with ``?schema=NAME``) or
                ``memory:``.
            lease_seconds: How long a workflow run stays this storage's after
                its last save.
            allowed_checkpoint_types: Types beyond Agent Framework's safe set
                that checkpoints may hold, as ``"module:qualname"`` (as for
                `FileCheckpointStorage`).
            encrypt: Seal every checkpoint with the keys in
                ``STEADFAST_KEY`` or ``STEADFAST_KEY_FILE``.

        Raises:
            steadfast.Unsupported: A store URL the graph store does not open
                (``file:`` and ``cosmos://`` are not supported here).
            steadfast.InvalidInput: A lease out of range.
        """
        if isinstance(allowed_checkpoint_types, str):
            raise TypeError("allowed_checkpoint_types is a list of 'module:qualname' strings, not one string")
        self._store = GraphStore(url, lease_seconds, encrypt)
        self._allowed: frozenset[str] = frozenset(allowed_checkpoint_types or [])
        weakref.finalize(self, _close_quietly, self._store)
        # The chain (workflow run) and workflow of checkpoints saved or read
        # here, at most _CACHE of them.
        self._chain: dict[str, tuple[str, str | None]] = {}
        self._lock = threading.Lock()

    # -- the protocol -----------------------------------------------------------

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store a copy of `checkpoint`; its ID.

        Saving an ID again replaces the checkpoint.

        Raises:
            WorkflowCheckpointException: The checkpoint cannot be encoded, or
                would not load back under this storage's allowed types.
            steadfast.Held: Another live process holds the workflow run's
                chain of checkpoints; nothing was written.
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
        chain = self._chain_of(str(checkpoint_id))
        if chain is not None:
            self._store.release(chain)

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
        try:
            encoded = encode_checkpoint_value(checkpoint.to_dict())
            decode_checkpoint_value(encoded, allowed_types=self._allowed)
            blob = json.dumps(encoded, ensure_ascii=False).encode("utf-8")
        except WorkflowCheckpointException:
            raise
        except Exception as ex:
            raise WorkflowCheckpointException(
                f"checkpoint {cid} cannot be encoded, or would not load back under this storage's "
                "allowed types; nothing was written"
            ) from ex
        previous = checkpoint.previous_checkpoint_id
        chain = self._chain_of(str(previous), checkpoint.workflow_name) if previous is not None else None
        if chain is None:
            # The first checkpoint of a run (or one whose predecessor is
            # gone) starts a chain of its own.
            chain = self._chain_of(cid, checkpoint.workflow_name) or cid
        metadata = json.dumps(
            {"workflow_name": checkpoint.workflow_name, "timestamp": checkpoint.timestamp, "run_id": _RUN + cid},
            ensure_ascii=False,
        )
        self._store.put(
            chain, _NS, cid, None if previous is None else str(previous), _TYPE, blob, metadata, _RUN + cid
        )
        self._remember(cid, chain, checkpoint.workflow_name)
        return cid

    def _row(self, checkpoint_id: str) -> Any:
        if not _is_text(checkpoint_id):
            return None
        rows = self._store.list(None, _NS, checkpoint_id, None, 1, None)
        return rows[0] if rows else None

    def _chain_of(self, checkpoint_id: str, workflow_name: str | None = None) -> str | None:
        """The chain checkpoint `checkpoint_id` is in, when it is stored (and
        is of workflow `workflow_name`, when one is given)."""
        with self._lock:
            known = self._chain.get(checkpoint_id)
        if known is not None and (workflow_name is None or known[1] == workflow_name):
            return known[0]
        row = self._row(checkpoint_id)
        if row is None:
            return None
        try:
            name = json.loads(row[6]).get("workflow_name")
        except (ValueError, AttributeError):
            name = None
        self._remember(checkpoint_id, row[0], name)
        if workflow_name is not None and name != workflow_name:
            return None
        return row[0]

    def _remember(self, checkpoint_id: str, chain: str, workflow_name: str | None) -> None:
        with self._lock:
            if len(self._chain) >= _CACHE:
                # A cache, not a record: start it again rather than grow.
                self._chain.clear()
            self._chain[checkpoint_id] = (chain, workflow_name)

    def _decode(self, row: Any) -> WorkflowCheckpoint:
        from agent_framework._workflows._checkpoint_encoding import decode_checkpoint_value

        thread_id, _ns, cid, _parent, type_, blob, _meta, _writes, _channels = row
        if type_ != _TYPE:
            raise WorkflowCheckpointException(f"checkpoint {cid} is stored as {type_!r}, not {_TYPE!r}")
        try:
            data = decode_checkpoint_value(json.loads(blob.decode("utf-8")), allowed_types=self._allowed)
        except WorkflowCheckpointException:
            raise
        except Exception as ex:
            raise WorkflowCheckpointException(f"checkpoint {cid} cannot be read back: {ex}") from ex
        checkpoint = WorkflowCheckpoint.from_dict(data)
        self._remember(cid, thread_id, checkpoint.workflow_name)
        return checkpoint

    def _load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        row = self._row(str(checkpoint_id))
        if row is None:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        checkpoint = self._decode(row)
        # Claim the run before anyone resumes it here: a write of no rows
        # takes the chain's lease, or raises Held when a live storage has it.
        self._store.put_writes(row[0], _NS, row[2], "claim", "", [])
        return checkpoint

    def _list(self, workflow_name: str) -> list[WorkflowCheckpoint]:
        name = str(workflow_name)
        if not _is_text(name):
            return []
        rows = self._store.list(None, _NS, None, None, None, json.dumps({"workflow_name": name}, ensure_ascii=False))
        found = []
        for r in rows:
            try:
                found.append(self._decode(r))
            except WorkflowCheckpointException as e:
                # As Agent Framework's file storage does: one checkpoint that
                # cannot be read here does not hide the others.
                logger.warning("skipping checkpoint %s: %s", r[2], e)
        found.sort(key=_when)
        return found

    def _delete(self, checkpoint_id: str) -> bool:
        cid = str(checkpoint_id)
        if self._row(cid) is None:
            return False
        self._store.delete_for_runs([_RUN + cid])
        with self._lock:
            self._chain.pop(cid, None)
        return True
