'use strict';
// A LangGraph.js checkpointer that keeps graph checkpoints in a Steadfast
// store: SQLite, PostgreSQL or memory, chosen by URL, through the same Rust
// graph store as the Python package's saver.
//
// A saver takes a lease on every thread it writes to, in the same
// transaction as the rows: two processes never append to one thread at once.
// The second one's write throws `Held` until the first releases the thread
// (`release`, `close`) or its lease lapses (or its process is gone).
//
//     const { SteadfastSaver } = require('steadfast/langgraph');
//     const saver = await SteadfastSaver.open('sqlite:.steadfast/graph.db');
//     const graph = builder.compile({ checkpointer: saver });
//     await graph.invoke(inputs, { configurable: { thread_id: 'ticket-42' } });
//     await saver.close();

const { BaseCheckpointSaver, TASKS, WRITES_IDX_MAP, copyCheckpoint, maxChannelVersion } = require('@langchain/langgraph-checkpoint');
const steadfast = require('./index.js');

const { native, fromNative } = steadfast._internal;

/** Calls `f` (a native call), with a rejection or throw as the Steadfast error it carries. */
async function call(f) {
  try {
    return await f();
  } catch (e) {
    throw fromNative(e);
  }
}

/** `v` as text for the store: well-formed (a lone surrogate would turn into U+FFFD, and two ids into one). */
function text(what, v) {
  const s = String(v);
  if (!s.isWellFormed()) throw new steadfast.InvalidInput(`${what} holds a lone surrogate, which is not Unicode text`);
  return s;
}

const opt = (what, v) => (v == null ? null : text(what, v));

function threadOf(config, what) {
  const c = config && config.configurable;
  if (!c) throw new steadfast.InvalidInput(`${what}: the config has no "configurable"`);
  if (c.thread_id === undefined || c.thread_id === null || c.thread_id === '') {
    throw new steadfast.InvalidInput(`${what}: the config's "configurable" has no thread_id`);
  }
  return [text(`${what}: thread_id`, c.thread_id), c.checkpoint_ns == null ? '' : text(`${what}: checkpoint_ns`, c.checkpoint_ns)];
}

/** Metadata as JSON text: strings made well-formed, as LangGraph's Python savers drop lone surrogates. */
function metadataJson(meta) {
  try {
    return JSON.stringify(meta, (_k, v) => (typeof v === 'string' ? v.toWellFormed() : v));
  } catch (e) {
    throw new steadfast.InvalidInput(`put: the metadata is not JSON: ${e && e.message}`);
  }
}

/** LangGraph.js checkpoints in a Steadfast store, with one writer per thread. */
class SteadfastSaver extends BaseCheckpointSaver {
  /**
   * Opens (creating its tables when missing) the store a URL names:
   * `sqlite:PATH`, `postgres://...` (with `?schema=NAME`) or `memory:`.
   * Options: `leaseMs` (how long a thread stays this saver's after its last
   * write; 60 s), `encrypt` (seal every value with the keys in
   * STEADFAST_KEY or STEADFAST_KEY_FILE), `serde` (LangGraph's serializer).
   */
  static async open(url, options) {
    const o = options ?? {};
    for (const k of Object.keys(o)) {
      if (!['leaseMs', 'encrypt', 'serde'].includes(k)) {
        throw new steadfast.InvalidInput(`SteadfastSaver.open: unknown option ${JSON.stringify(k)} (expected leaseMs, encrypt, serde)`);
      }
    }
    if (typeof url !== 'string') throw new steadfast.InvalidInput('SteadfastSaver.open: the URL must be a string');
    const leaseMs = o.leaseMs ?? 60_000;
    if (typeof leaseMs !== 'number') throw new steadfast.InvalidInput('SteadfastSaver.open: leaseMs must be a number');
    const store = await call(() => native.openGraphStore(url, leaseMs, Boolean(o.encrypt)));
    return new SteadfastSaver(store, o.serde);
  }

  /** Use `SteadfastSaver.open(url)`. */
  constructor(store, serde) {
    super(serde);
    if (!(store instanceof native.NativeGraphStore)) {
      throw new steadfast.InvalidInput('SteadfastSaver: open one with SteadfastSaver.open(url)');
    }
    Object.defineProperty(this, '_store', { value: store });
    // The channel versions the last checkpoint this saver put in each
    // thread's namespace stored a value for: while the saver holds the
    // thread's lease no one else writes it, so the next put (whose parent
    // that checkpoint is) needs no read to know them.
    Object.defineProperty(this, '_stored', { value: new Map() });
  }

  /** The checkpoint `config` names (its thread's newest when it names none), with its pending writes. */
  async getTuple(config) {
    const c = config && config.configurable;
    if (!c || c.thread_id === undefined || c.thread_id === null) return undefined;
    const [thread, ns] = threadOf(config, 'getTuple');
    const id = config.configurable.checkpoint_id;
    const row = await call(() => this._store.get(thread, ns, opt('getTuple: checkpoint_id', id)));
    return row ? this._tuple(row) : undefined;
  }

  /**
   * Matching checkpoints, newest first: of `config`'s thread (every thread
   * when it names none), its namespace when it names one; `before` keeps
   * older ids, `filter` metadata keys that must equal, `limit` at most so
   * many.
   */
  async *list(config, options) {
    const { limit, before, filter } = options ?? {};
    const c = (config && config.configurable) || {};
    const kept = Object.fromEntries(Object.entries(filter ?? {}).filter(([, v]) => v !== undefined));
    if (limit !== undefined && limit !== null && !Number.isSafeInteger(limit)) {
      throw new steadfast.InvalidInput(`list: limit ${limit}: expected a whole number`);
    }
    const rows = await call(() => this._store.list(
      opt('list: thread_id', c.thread_id),
      opt('list: checkpoint_ns', c.checkpoint_ns),
      opt('list: checkpoint_id', c.checkpoint_id),
      opt('list: before', before?.configurable?.checkpoint_id),
      limit ?? null,
      Object.keys(kept).length > 0 ? JSON.stringify(kept) : null,
    ));
    for (const row of rows) {
      yield await this._tuple(row);
    }
  }

  /**
   * Saves `checkpoint` as a child of the one `config` names; the saved
   * checkpoint's config. A channel's value is kept when it is new
   * (`newVersions` names it) or its version is one this thread stored a
   * value for (in the parent); a value at a version never stored is not.
   * Values over the store's blob threshold are stored apart, once per
   * thread however many checkpoints carry them.
   */
  async put(config, checkpoint, metadata, newVersions) {
    const [thread, ns] = threadOf(config, 'put');
    const parent = config.configurable.checkpoint_id;
    const versions = checkpoint.channel_versions ?? {};
    const fresh = newVersions ?? {};
    const known = await this._storedIn(thread, ns, parent);
    const values = {};
    const unknown = new Map();
    for (const [ch, value] of Object.entries(checkpoint.channel_values ?? {})) {
      if (ch in fresh || (ch in versions && known.get(ch) === String(versions[ch]))) {
        values[ch] = value;
      } else if (ch in versions) {
        unknown.set(ch, String(versions[ch]));
      }
    }
    if (unknown.size > 0) {
      // Not new and not in the parent (a copy of a checkpoint that forks
      // from its parent, say): kept when any checkpoint of the thread's
      // namespace stored it at that version.
      const found = await this._storedSomewhere(thread, ns, unknown);
      for (const ch of found) values[ch] = checkpoint.channel_values[ch];
    }
    const small = {};
    const large = [];
    const threshold = this._store.blobThreshold;
    for (const [ch, value] of Object.entries(values)) {
      const [type, data] = await this.serde.dumpsTyped(value);
      if (data.length > threshold) {
        large.push({ channel: ch, type, blob: data });
      } else {
        small[ch] = value;
      }
    }
    const [type, blob] = await this.serde.dumpsTyped({ ...copyCheckpoint(checkpoint), channel_values: small });
    const meta = metadata ?? {};
    const runId = meta.run_id;
    await call(() => this._store.put({
      threadId: thread,
      ns,
      checkpointId: text('put: checkpoint id', checkpoint.id),
      parentId: parent == null ? undefined : text('put: checkpoint_id', parent),
      type,
      blob,
      metadata: metadataJson(meta),
      runId: runId == null ? undefined : text('put: metadata run_id', runId),
    }, large));
    const stored = new Map(Object.keys(values).filter((ch) => ch in versions).map((ch) => [ch, String(versions[ch])]));
    this._stored.set(`${thread}\u0000${ns}`, { id: String(checkpoint.id), stored });
    return { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
  }

  /** Which of the channels `wanted` (channel to version) some checkpoint of the namespace stored a value for at that version. */
  async _storedSomewhere(thread, ns, wanted) {
    const found = new Set();
    const rows = await call(() => this._store.list(thread, ns, null, null, null, null));
    for (const row of rows) {
      const cp = (await this._tuple(row)).checkpoint;
      const versions = cp.channel_versions ?? {};
      for (const [ch, v] of wanted) {
        if (!found.has(ch) && ch in (cp.channel_values ?? {}) && ch in versions && String(versions[ch]) === v) found.add(ch);
      }
      if (found.size === wanted.size) break;
    }
    return found;
  }

  /** The channel versions checkpoint `id` of a thread's namespace stored values for. */
  async _storedIn(thread, ns, id) {
    if (id == null) return new Map();
    const last = this._stored.get(`${thread}\u0000${ns}`);
    if (last && last.id === String(id)) return last.stored;
    const row = await call(() => this._store.get(thread, ns, String(id)));
    if (!row) return new Map();
    const cp = (await this._tuple(row)).checkpoint;
    const versions = cp.channel_versions ?? {};
    return new Map(Object.keys(cp.channel_values ?? {}).filter((ch) => ch in versions).map((ch) => [ch, String(versions[ch])]));
  }

  /**
   * Saves the writes task `taskId` made, pending on the checkpoint `config`
   * names. A write saved again keeps its first value, but for the special
   * channels (errors, interrupts, resumes), whose latest replaces it.
   */
  async putWrites(config, writes, taskId, taskPath) {
    const [thread, ns] = threadOf(config, 'putWrites');
    const id = config.configurable.checkpoint_id;
    if (id == null) throw new steadfast.InvalidInput("putWrites: the config's \"configurable\" has no checkpoint_id");
    if (writes.length === 0) return;
    const rows = await Promise.all(writes.map(async ([channel, value], idx) => {
      const [type, blob] = await this.serde.dumpsTyped(value);
      return { idx: WRITES_IDX_MAP[channel] ?? idx, channel, type, blob };
    }));
    await call(() => this._store.putWrites(thread, ns, text('putWrites: checkpoint_id', id), text('putWrites: task id', taskId), text('putWrites: task path', taskPath ?? ''), rows));
  }

  /** Deletes every checkpoint and write of a thread, in all namespaces. */
  async deleteThread(threadId) {
    const thread = text('deleteThread: thread id', threadId);
    await call(() => this._store.deleteThread(thread));
  }

  /** Gives up this saver's lease on a thread, so another saver may write it. */
  async release(threadId) {
    const thread = text('release: thread id', threadId);
    await call(() => this._store.release(thread));
  }

  /** Releases every thread this saver holds; it stays usable. */
  async close() {
    await call(() => this._store.close());
  }

  async _tuple(row) {
    const checkpoint = await this.serde.loadsTyped(row.type, row.blob);
    if (row.channels.length > 0) {
      const values = { ...(checkpoint.channel_values ?? {}) };
      for (const ch of row.channels) {
        values[ch.channel] = await this.serde.loadsTyped(ch.type, ch.blob);
      }
      // Back in the order of the channels' versions, as they were put.
      const order = Object.keys(checkpoint.channel_versions ?? {});
      const rank = (k) => (order.includes(k) ? order.indexOf(k) : order.length);
      checkpoint.channel_values = Object.fromEntries(Object.entries(values).sort((a, b) => rank(a[0]) - rank(b[0])));
    }
    const config = { configurable: { thread_id: row.threadId, checkpoint_ns: row.ns, checkpoint_id: row.checkpointId } };
    const pendingWrites = await Promise.all(
      row.writes.map(async (w) => [w.taskId, w.channel, await this.serde.loadsTyped(w.type, w.blob)]),
    );
    if (checkpoint.v < 4 && row.parentId != null) await this._migrateSends(checkpoint, row);
    const tuple = { config, checkpoint, metadata: JSON.parse(row.metadata), pendingWrites };
    if (row.parentId != null) {
      tuple.parentConfig = { configurable: { thread_id: row.threadId, checkpoint_ns: row.ns, checkpoint_id: row.parentId } };
    }
    return tuple;
  }
}

/**
 * A checkpoint of format 3 or older keeps the sends of its step as pending
 * writes of its parent: they become its TASKS channel's value, as
 * LangGraph's own savers do.
 */
SteadfastSaver.prototype._migrateSends = async function migrateSends(checkpoint, row) {
  const parent = await call(() => this._store.get(row.threadId, row.ns, row.parentId));
  // In the store's order of writes: (task path, task id, index).
  const sends = (parent ? parent.writes : []).filter((w) => w.channel === TASKS);
  checkpoint.channel_values = checkpoint.channel_values ?? {};
  checkpoint.channel_values[TASKS] = await Promise.all(sends.map((w) => this.serde.loadsTyped(w.type, w.blob)));
  const versions = Object.values(checkpoint.channel_versions ?? {});
  checkpoint.channel_versions = checkpoint.channel_versions ?? {};
  checkpoint.channel_versions[TASKS] = versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
};

module.exports = { SteadfastSaver };
