"""A LangGraph checkpointer that keeps graph checkpoints in a Steadfast store.

`SteadfastSaver` stores each checkpoint, its metadata and the pending writes
of its tasks through `steadfast._native.GraphStore`, on SQLite, PostgreSQL or
memory, chosen by URL. A saver takes a lease on every thread it writes to, so
two processes never append to one thread at once: the second one's write
raises `steadfast.Held` until the first releases the thread (`release`,
`close`, leaving a `with` block) or its lease lapses.

Example:

    from langgraph.graph import StateGraph
    from steadfast.langgraph import SteadfastSaver

    with SteadfastSaver("sqlite:.steadfast/graph.db") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "ticket-42"}})
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Optional, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from steadfast._native import GraphStore

__all__ = ["PRUNE_STRATEGIES", "SteadfastSaver"]

PRUNE_STRATEGIES: tuple[str, ...] = ("keep_latest", "delete")
"""The strategies `SteadfastSaver.prune` accepts."""

_T = TypeVar("_T")

# A large channel value kept apart from its checkpoint: (channel, type, bytes).
_Channel = tuple[str, str, bytes]

# What GraphStore.get and GraphStore.list return for one checkpoint:
# (thread_id, ns, checkpoint_id, parent_id, type, blob, metadata_json, writes,
# channels), writes being (task_id, channel, type, blob) in (task_path,
# task_id, idx) order, channels the large channel values left out of blob.
_Row = tuple[
    str,
    str,
    str,
    Optional[str],
    str,
    bytes,
    str,
    list[tuple[str, str, str, bytes]],
    list[_Channel],
]


def _surely_small(value: Any, threshold: int) -> bool:
    """Whether `value` serializes to no more than `threshold` bytes, known
    without serializing it: None, booleans, numbers, and strings and bytes
    short enough that even four bytes a character and a header fit."""
    if value is None or isinstance(value, (bool, float)):
        return True
    if isinstance(value, int):
        return value.bit_length() <= 64
    if isinstance(value, (str, bytes)):
        return 4 * len(value) + 16 <= threshold
    return False


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _thread_and_ns(config: RunnableConfig) -> tuple[str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), conf.get("checkpoint_ns") or ""


def _close_quietly(store: GraphStore) -> None:
    try:
        store.close()
    except Exception:  # the database may be gone at exit; leases lapse anyway
        pass


def _ids(values: Sequence[str], what: str) -> list[str]:
    # A bare string is a Sequence too; taking it letter by letter would act on
    # the wrong threads or runs.
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of IDs, not a single string")
    return [str(v) for v in values]


class SteadfastSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver backed by a Steadfast store.

    Args:
        url: Where checkpoints live: `"sqlite:PATH"`, `"postgres://..."`
            (with `?schema=NAME` to pick the schema) or `"memory:"`. Tables are
            created on first use.
        serde: Serializer for checkpoints and write values; LangGraph's
            default (`JsonPlusSerializer`) when not given.
        encrypt: Seal every checkpoint and write with AES-256-GCM under the
            key in `STEADFAST_ENCRYPTION_KEY` (or the file named by
            `STEADFAST_ENCRYPTION_KEY_FILE`), bound to its thread, namespace,
            checkpoint and task, so that a blob moved to another row does
            not open (`steadfast.Corrupt`). Metadata stays in clear text for
            the filters.
        lease_seconds: How long this saver's claim on a thread lasts after
            its latest write, unless released earlier. Another saver (in this
            process or another) writing to the thread within that time gets
            `steadfast.Held`.

    A channel value whose serialized bytes are longer than the store's blob
    threshold (64 KiB; `?blob_threshold=SIZE` in the URL), and a pending
    write as long, is stored once per thread however many checkpoints carry
    it, and read back whole (with encryption each checkpoint keeps its own
    sealed copy). Deleting or pruning the last checkpoint that refers to
    such a value frees it.

    Checkpoint versions are strings that sort in write order, as with the
    SQLite and PostgreSQL savers shipped with LangGraph. The synchronous
    methods block; the `a`-prefixed ones run the same work in the event
    loop's default executor. One saver may be used from many threads and
    tasks at once.
    """

    def __init__(
        self,
        url: str = "sqlite:.steadfast/graph.db",
        *,
        serde: SerializerProtocol | None = None,
        lease_seconds: float = 60.0,
        encrypt: bool = False,
    ) -> None:
        super().__init__(serde=serde)
        self._store = GraphStore(url, lease_seconds, encrypt)
        self._threshold: int = self._store.blob_threshold
        # A saver dropped without close() (a notebook cell run again, one
        # saver per request) gives up its threads when it is collected, so
        # that the next saver need not wait for its leases to run out.
        weakref.finalize(self, _close_quietly, self._store)
        # Threads this saver has written to and not released; `close` lets
        # go of them. Shared by the shallow copies `with_allowlist` makes,
        # which share the store and therefore its leases.
        self._leased: set[str] = set()
        self._leased_lock = threading.Lock()

    # -- reading ------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Load one checkpoint with its metadata, parent and pending writes.

        The checkpoint named by `config["configurable"]["checkpoint_id"]` in
        the thread and namespace of `config` (namespace `""` when absent), or
        the thread's newest checkpoint in that namespace when no ID is given.

        Returns:
            The tuple, or `None` when there is no such checkpoint. Its
            `pending_writes` are in `writes_sort_key` order.
        """
        thread_id, ns = _thread_and_ns(config)
        row = self._store.get(thread_id, ns, get_checkpoint_id(config))
        return None if row is None else self._tuple(row)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Yield matching checkpoints, newest (greatest checkpoint ID) first.

        Args:
            config: Restricts to its thread; to its namespace when
                `checkpoint_ns` is present (all namespaces when it is absent);
                to one checkpoint when `checkpoint_id` is present. `None`
                lists every thread.
            filter: Metadata a checkpoint must have: for each key, the value
                stored under that top-level key must equal the given value
                (`None` also matches a missing key).
            before: Only checkpoints whose ID is less than this config's
                `checkpoint_id`.
            limit: At most this many checkpoints.
        """
        yield from self._list(config, filter, before, limit)

    # -- writing ------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save a checkpoint as a child of the checkpoint `config` names.

        Saving a checkpoint ID that already exists in the thread and namespace
        replaces it. The metadata saved is `metadata` plus the scalar entries
        of the config's `metadata` and `configurable` (as every LangGraph saver
        does); its `run_id` is what `delete_for_runs` matches.

        Returns:
            The config of the saved checkpoint.

        Raises:
            steadfast.Held: Another saver holds the thread's lease.
        """
        thread_id, ns = _thread_and_ns(config)
        parent_id = config["configurable"].get("checkpoint_id")
        kept, large = self._split_channels(checkpoint)
        type_, blob = self.serde.dumps_typed(kept)
        saved = get_serializable_checkpoint_metadata(config, metadata)
        # Lone surrogates cannot cross into Rust as UTF-8: drop them.
        metadata_json = (
            json.dumps(saved, ensure_ascii=False).encode("utf-8", "ignore").decode("utf-8")
        )
        run_id = saved.get("run_id")
        self._store.put(
            thread_id,
            ns,
            checkpoint["id"],
            None if parent_id is None else str(parent_id),
            type_,
            blob,
            metadata_json,
            None if run_id is None else str(run_id),
            large,
        )
        self._note_lease(thread_id)
        return _config(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save the writes a task made, pending on the checkpoint `config` names.

        A write is keyed by (checkpoint, task, index): saving it again keeps
        the first value, except for the special channels (error, interrupt,
        resume, scheduled), whose latest value replaces the earlier one.

        Raises:
            steadfast.Held: Another saver holds the thread's lease.
        """
        if not writes:
            return
        thread_id, ns = _thread_and_ns(config)
        rows = []
        for idx, (channel, value) in enumerate(writes):
            type_, blob = self.serde.dumps_typed(value)
            rows.append((WRITES_IDX_MAP.get(channel, idx), channel, type_, blob))
        self._store.put_writes(
            thread_id,
            ns,
            str(config["configurable"]["checkpoint_id"]),
            str(task_id),
            task_path,
            rows,
        )
        self._note_lease(thread_id)

    # -- removing and copying -------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of a thread, in all namespaces.

        A thread with nothing stored is not an error. This saver's lease on
        the thread, if any, goes with it.

        Raises:
            steadfast.Held: Another saver holds the thread's lease.
        """
        thread_id = str(thread_id)
        self._store.delete_thread(thread_id)
        self._forget_lease(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints saved by the given runs, with their writes.

        A checkpoint belongs to the run named by its metadata's `run_id`; all
        threads and namespaces are searched. Unknown run IDs are ignored.

        Raises:
            TypeError: `run_ids` is a single string.
            steadfast.Held: Another saver holds the lease of a thread with a
                checkpoint to delete; nothing is deleted.
        """
        ids = _ids(run_ids, "run_ids")
        if ids:
            self._store.delete_for_runs(ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread into another.

        All namespaces are copied; checkpoint IDs, parents, metadata and
        writes stay as they are, so the copy lists in the same order. A source
        with nothing stored copies nothing. The target must be empty.

        Raises:
            ValueError: The two threads are the same.
            steadfast.InvalidInput: The target thread already has checkpoints.
            steadfast.Held: Another saver holds the target thread's lease.
        """
        source, target = str(source_thread_id), str(target_thread_id)
        if source == target:
            raise ValueError(f"cannot copy thread {source!r} onto itself")
        self._store.copy_thread(source, target)

    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
    ) -> None:
        """Delete old checkpoints of the given threads.

        Args:
            thread_ids: The threads to prune; others are untouched.
            strategy: `"keep_latest"` keeps the newest checkpoint of each
                namespace with its pending writes (it becomes a checkpoint
                without a parent) and deletes the rest; `"delete"` deletes
                everything, like `delete_thread` on each thread.

        Raises:
            TypeError: `thread_ids` is a single string.
            ValueError: `strategy` is not one of `PRUNE_STRATEGIES`.
            steadfast.Unsupported: `"keep_latest"` was asked of a thread
                that uses a `DeltaChannel`, whose latest value needs older
                checkpoints; nothing is deleted.
            steadfast.Held: Another saver holds one of the threads' leases;
                nothing is deleted.
        """
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(
                f"unknown prune strategy {strategy!r}, expected one of {PRUNE_STRATEGIES}"
            )
        ids = _ids(thread_ids, "thread_ids")
        if ids:
            self._store.prune(ids, strategy == "keep_latest")

    # -- leases ---------------------------------------------------------------

    def release(self, thread_id: str) -> None:
        """Give up this saver's lease on a thread, so another may write to it.

        Releasing a thread this saver does not hold does nothing. Writing to
        the thread again takes the lease again.
        """
        thread_id = str(thread_id)
        self._store.release(thread_id)
        self._forget_lease(thread_id)

    def close(self) -> None:
        """Release every thread this saver has written to.

        The saver stays usable; a later write takes its thread's lease again.
        """
        with self._leased_lock:
            held = sorted(self._leased)
        for thread_id in held:
            self.release(thread_id)

    def __enter__(self) -> SteadfastSaver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> SteadfastSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- versions -------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Return a channel version greater than `current`.

        The version is a 32-digit counter, a dot and a random fraction, the
        format LangGraph's SQLite and PostgreSQL savers use, so a thread
        written by one of them continues here. Integer versions from the
        in-memory saver are accepted as `current`.
        """
        if current is None:
            counter = 0
        elif isinstance(current, (int, float)):
            counter = int(current)
        else:
            counter = int(str(current).split(".", 1)[0])
        return f"{counter + 1:032}.{random.random():016}"

    # -- async twins ----------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async `get_tuple`."""
        return await self._off_loop(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async `list`: the matches are read in one call, then yielded."""
        found = await self._off_loop(self._list, config, filter, before, limit)
        for tup in found:
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async `put`."""
        return await self._off_loop(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async `put_writes`."""
        await self._off_loop(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async `delete_thread`."""
        await self._off_loop(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async `delete_for_runs`."""
        await self._off_loop(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async `copy_thread`."""
        await self._off_loop(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
    ) -> None:
        """Async `prune`."""
        await self._off_loop(functools.partial(self.prune, strategy=strategy), thread_ids)

    async def arelease(self, thread_id: str) -> None:
        """Async `release`."""
        await self._off_loop(self.release, thread_id)

    async def aclose(self) -> None:
        """Async `close`."""
        await self._off_loop(self.close)

    # -- internals ------------------------------------------------------------

    async def _off_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(fn, *args))

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[CheckpointTuple]:
        if limit is not None and limit <= 0:
            return []
        conf = (config or {}).get("configurable") or {}
        thread_id = conf.get("thread_id")
        rows = self._store.list(
            None if thread_id is None else str(thread_id),
            conf.get("checkpoint_ns"),
            conf.get("checkpoint_id"),
            None if before is None else get_checkpoint_id(before),
            limit,
            json.dumps(filter, ensure_ascii=False, default=str) if filter else None,
        )
        return [self._tuple(row) for row in rows]

    def _split_channels(self, checkpoint: Checkpoint) -> tuple[Checkpoint, list[_Channel]]:
        """The checkpoint without its large channel values, and those values.

        A channel value whose serialized bytes are longer than the store's
        blob threshold is stored apart, once per thread however many
        checkpoints carry it unchanged; the rest stay in the checkpoint.
        """
        values = checkpoint.get("channel_values") or {}
        threshold = self._threshold
        small: dict[str, Any] = {}
        large: list[_Channel] = []
        for channel, value in values.items():
            if _surely_small(value, threshold):
                small[channel] = value
                continue
            type_, data = self.serde.dumps_typed(value)
            if len(data) > threshold:
                large.append((channel, type_, data))
            else:
                small[channel] = value
        if not large:
            return checkpoint, large
        return {**checkpoint, "channel_values": small}, large

    def _tuple(self, row: _Row) -> CheckpointTuple:
        thread_id, ns, checkpoint_id, parent_id, type_, blob, metadata_json, writes, large = row
        pending: list[PendingWrite] = [
            (task_id, channel, self.serde.loads_typed((w_type, w_blob)))
            for task_id, channel, w_type, w_blob in writes
        ]
        checkpoint = self.serde.loads_typed((type_, blob))
        if large:
            values = dict(checkpoint.get("channel_values") or {})
            for channel, c_type, c_blob in large:
                values[channel] = self.serde.loads_typed((c_type, c_blob))
            # Back in the order of the channels' versions, as they were put.
            order = {name: i for i, name in enumerate(checkpoint.get("channel_versions") or {})}
            checkpoint["channel_values"] = dict(
                sorted(values.items(), key=lambda kv: order.get(kv[0], len(order)))
            )
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=json.loads(metadata_json) if metadata_json else {},
            parent_config=_config(thread_id, ns, parent_id) if parent_id else None,
            pending_writes=pending,
        )

    def _note_lease(self, thread_id: str) -> None:
        with self._leased_lock:
            self._leased.add(thread_id)

    def _forget_lease(self, thread_id: str) -> None:
        with self._leased_lock:
            self._leased.discard(thread_id)
