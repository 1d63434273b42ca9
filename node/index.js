'use strict';
// Steadfast for Node.js: durable execution on the same engine and stores as
// the Rust library, the CLI and the Python package. A run started here is
// shown, approved and resumed by the others, and the other way round.
//
// The native module (steadfast.node, built from the checkout by
// `npm install`) holds the engine; this file is the API. Values cross to it
// as JSON text, checked here first: finite numbers, plain objects and
// arrays, well-formed strings, at most MAX_DEPTH levels deep.

const path = require('node:path');

function loadNative() {
  const file = path.join(__dirname, 'steadfast.node');
  try {
    return require(file);
  } catch (e) {
    const hint = e && e.code === 'MODULE_NOT_FOUND'
      ? 'the native module is not built: run `npm install` in the package directory (it builds it with cargo, from the checkout)'
      : `the native module ${file} could not be loaded: ${e && e.message}`;
    throw new Error(hint);
  }
}

const native = loadNative();

/** How deep a value may nest, the engine's own limit. */
const MAX_DEPTH = 100;
/** The store used when none is named: SQLite in `.steadfast/runs.db`. */
const DEFAULT_STORE_URL = native.defaultStoreUrl();
/** The package's version, the same as the engine's. */
const VERSION = native.version();
const PREFIX = 'steadfast-error:';
const ENGINE_ID = Symbol('steadfast.engineError');

// ---------------------------------------------------------------- errors

/** Base class of every error Steadfast throws. */
class SteadfastError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}
/** A run id that is empty, too long or holds characters a store cannot keep. */
class InvalidRunId extends SteadfastError {}
/** A workflow that cannot run: a duplicate or reserved step name, a duration out of range. */
class InvalidWorkflow extends SteadfastError {}
/** The run was recorded by a different workflow or different code; nothing new ran. */
class WorkflowChanged extends SteadfastError {}
/** A step failed for good: its attempts ran out or its error was terminal. `step` names it. */
class StepFailed extends SteadfastError {}
/** A value that cannot be stored and read back (the message gives its path). */
class InvalidValue extends SteadfastError {}
/** Another live process holds the run and its lease has not run out. */
class Held extends SteadfastError {}
/** An argument out of its range or shape; nothing was written. */
class InvalidInput extends SteadfastError {}
/** No run with that id in the store. */
class NoSuchRun extends SteadfastError {}
/** The run is not waiting at that gate. */
class NotWaiting extends SteadfastError {}
/** The run was cancelled. */
class Cancelled extends SteadfastError {}
/** Thrown inside a durable function when the run stops at a gate or timer: let it propagate. */
class Suspended extends SteadfastError {}
/** The store failed; the message names the store and what it was doing. */
class StoreFailure extends SteadfastError {}
/** Another writer saved the run first. */
class Conflict extends StoreFailure {}
/** A record or file that cannot be read: the store is never treated as empty. */
class Corrupt extends StoreFailure {}
/** A state or value over the store's size limit. */
class TooLarge extends StoreFailure {}
/** A save whose outcome is unknown (the connection dropped during the commit). */
class OutcomeUnknown extends StoreFailure {}
/** The store cannot be reached or is locked by another process. */
class Unavailable extends StoreFailure {}
/** The store or URL does not support what was asked. */
class Unsupported extends StoreFailure {}
/** The store (a file, a schema) does not exist. */
class NotFound extends StoreFailure {}

/**
 * Throw from a step to fail it for good: no retry, whatever its policy. Any
 * other error a step throws is retryable; one with a numeric `retryAfterMs`
 * (a provider's Retry-After) makes the next attempt wait that long.
 */
class TerminalError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'TerminalError';
  }
}

const CLASSES = {
  SteadfastError, InvalidRunId, InvalidWorkflow, WorkflowChanged, StepFailed, InvalidValue, Held,
  InvalidInput, NoSuchRun, NotWaiting, Cancelled, Suspended, StoreFailure, Conflict, Corrupt,
  TooLarge, OutcomeUnknown, Unavailable, Unsupported, NotFound,
};

/** The number of the engine error `e` is, or null (reading it may throw: a Proxy). */
function engineId(e) {
  try {
    return e !== null && typeof e === 'object' && typeof e[ENGINE_ID] === 'number' ? e[ENGINE_ID] : null;
  } catch {
    return null;
  }
}

/** The Steadfast error a native rejection carries, or the rejection itself. */
function fromNative(e) {
  if (!(e instanceof Error) || typeof e.message !== 'string' || !e.message.startsWith(PREFIX)) {
    return e;
  }
  let body;
  try {
    body = JSON.parse(e.message.slice(PREFIX.length));
  } catch {
    return e;
  }
  const Class = CLASSES[body.kind] || SteadfastError;
  const err = new Class(body.message);
  if (typeof body.id === 'number') {
    Object.defineProperty(err, ENGINE_ID, { value: body.id });
  }
  if (typeof body.step === 'string') {
    err.step = body.step;
  }
  return err;
}

/** Calls `f` (a native call), with a rejection or throw as the Steadfast error it carries. */
async function call(f) {
  try {
    return await f();
  } catch (e) {
    throw fromNative(e);
  }
}

/** What a thrown value says, as well-formed text (it crosses into Rust). */
function describe(e) {
  let text;
  try {
    if (e instanceof Error) {
      text = e.message ? `${e.name}: ${e.message}` : String(e.name);
    } else {
      text = `a thrown ${typeof e}: ${String(e)}`;
    }
  } catch {
    text = `a thrown ${typeof e}`;
  }
  return text.toWellFormed();
}

// ---------------------------------------------------------------- values

function keyPath(parent, key) {
  return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(key) ? `${parent}.${key}` : `${parent}[${JSON.stringify(key)}]`;
}

function kindOf(v) {
  if (v === null) return 'null';
  if (typeof v !== 'object') return typeof v;
  const proto = Object.getPrototypeOf(v);
  const name = proto && proto.constructor && proto.constructor.name;
  return name ? `a ${name}` : 'an object';
}

/**
 * A member name serde_json's reader takes as a marker when it is an object's
 * first member; refused here wherever it is, since the order of a JavaScript
 * object's keys is not the order the engine checks.
 */
const SERDE_MARKER = '$serde_json::private::RawValue';

/**
 * Why `v` cannot be stored as JSON and read back the same, with the path of
 * the part that cannot: `{path, reason}`, or null when it can.
 */
function problem(v, at = '$') {
  const seen = new Set();
  const walk = (v, at, depth) => {
    // The engine counts from the state, which holds the value one level down.
    if (depth >= MAX_DEPTH) return { path: at, reason: `nested ${MAX_DEPTH} levels deep or more (the engine keeps at most ${MAX_DEPTH - 1} below a value)` };
    switch (typeof v) {
      case 'string':
        return v.isWellFormed() ? null : { path: at, reason: 'the string holds a lone surrogate, which is not Unicode text' };
      case 'boolean':
        return null;
      case 'number':
        return Number.isFinite(v) ? null : { path: at, reason: `${v} is not a finite number; JSON has no NaN or Infinity` };
      case 'undefined':
        return { path: at, reason: 'undefined is not JSON: leave the key out, or use null' };
      case 'bigint':
        return { path: at, reason: `the BigInt ${v} is not JSON: pass a number or a string` };
      case 'function':
      case 'symbol':
        return { path: at, reason: `a ${typeof v} is not JSON` };
      default:
        break;
    }
    if (v === null) return null;
    if (seen.has(v)) return { path: at, reason: 'the value refers to itself (a cycle)' };
    if (Object.prototype.hasOwnProperty.call(v, 'toJSON')) {
      return { path: at, reason: 'a value with its own toJSON would be stored as something else: pass what toJSON gives' };
    }
    if (Array.isArray(v)) {
      if (Object.getPrototypeOf(v) !== Array.prototype) return { path: at, reason: `${kindOf(v)} is not a plain array` };
      seen.add(v);
      for (let i = 0; i < v.length; i++) {
        if (!(i in v)) return { path: `${at}[${i}]`, reason: 'an empty slot in a sparse array is not JSON' };
        const p = walk(v[i], `${at}[${i}]`, depth + 1);
        if (p) return p;
      }
      seen.delete(v);
      return null;
    }
    const proto = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) {
      return { path: at, reason: `${kindOf(v)} is not a plain object: convert it to one (a Date with toISOString(), a Map with Object.fromEntries())` };
    }
    if (Object.getOwnPropertySymbols(v).length > 0) {
      return { path: at, reason: 'an object with symbol keys is not JSON' };
    }
    seen.add(v);
    for (const k of Object.keys(v)) {
      if (!k.isWellFormed()) return { path: at, reason: 'a key holds a lone surrogate, which is not Unicode text' };
      if (k === SERDE_MARKER) return { path: keyPath(at, k), reason: `the engine's JSON reader takes the name ${SERDE_MARKER} as a marker (first in an object): it would not be stored as given` };
      const p = walk(v[k], keyPath(at, k), depth + 1);
      if (p) return p;
    }
    seen.delete(v);
    return null;
  };
  try {
    return walk(v, at, 0);
  } catch (e) {
    return { path: at, reason: `the value could not be read: ${describe(e)}` };
  }
}

/** `v` as JSON text, or InvalidInput naming `what` and the path of what is refused. */
function toJson(what, v) {
  const p = problem(v);
  if (p) throw new InvalidInput(`${what}: at ${p.path}: ${p.reason}; nothing was written`);
  return JSON.stringify(v);
}

function optJson(what, v) {
  return v === undefined || v === null ? null : toJson(what, v);
}

// The type of each option, wherever it is taken (a step's `limit` is a
// string and `runs`'s a number: each is checked where it is used).
const OPTION_KINDS = {
  retries: 'number', backoffMs: 'number', maxBackoffMs: 'number', timeoutMs: 'number', leaseMs: 'number',
  priority: 'number', onTimeout: 'string', version: 'string', by: 'string', reason: 'string',
  status: 'string', workflow: 'string', after: 'string', partition: 'string',
  acceptChanged: 'boolean', waitForTimers: 'boolean', durable: 'boolean',
};

function checkOption(what, k, v) {
  const kind = OPTION_KINDS[k];
  if (kind === 'number') {
    if (typeof v !== 'number' || !Number.isFinite(v)) {
      throw new InvalidInput(`${what}: ${k} ${typeof v === 'number' ? v : kindOf(v)}: expected a finite number`);
    }
  } else if (kind === 'string') {
    str(`${what}: ${k}`, v);
  } else if (kind === 'boolean') {
    if (typeof v !== 'boolean') throw new InvalidInput(`${what}: ${k} must be true or false, not ${kindOf(v)}`);
  } else if (k === 'budget') {
    if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new InvalidInput(`${what}: budget must be an object of amounts`);
    for (const [name, amount] of Object.entries(v)) {
      if (typeof amount !== 'number' || !Number.isFinite(amount)) {
        throw new InvalidInput(`${what}: budget ${JSON.stringify(name)}: ${String(amount)}: expected a finite number`);
      }
    }
  } else if (k === 'steps') {
    if (!Array.isArray(v)) throw new InvalidInput(`${what}: steps must be an array of step names`);
    v.forEach((n, i) => str(`${what}: steps[${i}]`, n));
  }
}

function options(what, o, allowed) {
  if (o === undefined || o === null) return {};
  if (typeof o !== 'object' || Array.isArray(o)) throw new InvalidInput(`${what}: the options must be an object`);
  for (const k of Object.keys(o)) {
    if (!allowed.includes(k)) {
      throw new InvalidInput(`${what}: unknown option ${JSON.stringify(k)} (expected ${allowed.join(', ')})`);
    }
  }
  const out = {};
  for (const k of allowed) {
    if (o[k] !== undefined) {
      checkOption(what, k, o[k]);
      out[k] = o[k];
    }
  }
  return out;
}

/** `v`, a string of well-formed Unicode text, or InvalidInput naming `what`. */
function str(what, v) {
  if (typeof v !== 'string') throw new InvalidInput(`${what} must be a string, not ${kindOf(v)}`);
  if (!v.isWellFormed()) throw new InvalidInput(`${what} holds a lone surrogate, which is not Unicode text`);
  return v;
}

function fn(what, f) {
  if (typeof f !== 'function') throw new InvalidInput(`${what} must be a function, not ${kindOf(f)}`);
  return f;
}

// ---------------------------------------------------------------- outcome

/** How a call to `run` ended. */
class Outcome {
  constructor(o) {
    /** `completed`, `waiting` (at a gate or a wait for a signal), `sleeping` (at a durable timer) or `rejected`. */
    this.status = o.status;
    /** The return value (durable function) or final state (listed workflow) when completed. */
    this.value = o.status === 'completed' ? o.value : null;
    /** The gate the run waits at, or that was rejected. */
    this.gate = o.gate ?? null;
    /** When a sleeping run's timer fires. */
    this.until = typeof o.until === 'number' ? new Date(o.until) : null;
    /** Why the gate was rejected, if the rejection said. */
    this.reason = o.reason ?? null;
  }
  get completed() { return this.status === 'completed'; }
  get waiting() { return this.status === 'waiting'; }
  get sleeping() { return this.status === 'sleeping'; }
  get rejected() { return this.status === 'rejected'; }
}

const RUN_OPTIONS = ['acceptChanged', 'waitForTimers', 'leaseMs', 'budget'];

function stepOptions(name, opts) {
  const o = options(`step ${JSON.stringify(name)}`, opts, STEP_OPTIONS);
  if (o.limit !== undefined) str(`step ${JSON.stringify(name)}: limit`, o.limit);
  return o;
}
const STEP_OPTIONS = ['retries', 'backoffMs', 'maxBackoffMs', 'timeoutMs', 'limit', 'version'];

// ---------------------------------------------------------------- steps

/**
 * The function the engine calls for a step: it runs `f` with the step's
 * information and replies with its value, its error or why its value cannot
 * be stored. It never throws (an async function returns a rejection, which
 * it catches).
 */
function stepCall(f, causes, nameOf) {
  return async (...args) => {
    const info = JSON.parse(args[args.length - 1]);
    try {
      let v = await f(...args.slice(0, -1), info);
      if (v === undefined) v = null;
      const p = problem(v);
      return JSON.stringify(p ? { invalid: p } : { ok: v });
    } catch (e) {
      causes.set(nameOf(args), e);
      const after = e !== null && typeof e === 'object' ? e.retryAfterMs : undefined;
      return JSON.stringify({
        err: {
          message: describe(e),
          terminal: e instanceof TerminalError,
          retryAfterMs: typeof after === 'number' && Number.isFinite(after) && after >= 0 ? after : null,
        },
      });
    }
  };
}

/** The context a durable function gets: every call is recorded, and replayed on a resume. */
class DurableContext {
  constructor(handle, causes) {
    Object.defineProperty(this, '_h', { value: handle });
    Object.defineProperty(this, '_causes', { value: causes });
    // Every call's promise: when the function returns, those it left
    // unawaited are stopped by the engine, and their rejection is handled
    // here rather than ending the process.
    Object.defineProperty(this, '_calls', { value: [] });
  }

  /** The function has returned: its unawaited calls reject quietly. */
  _ended() {
    for (const p of this._calls) p.catch(() => {});
  }

  /**
   * Runs `f` as step `name` (the first time: retried and timed out as
   * `options` say, its value saved) or returns its recorded value.
   * `f` gets the step's `{runId, step, index, attempt, idempotencyKey}`.
   */
  async step(name, f, opts) {
    str('a step name', name);
    fn(`step ${JSON.stringify(name)}: its function`, f);
    const o = stepOptions(name, opts);
    const out = await call(() => native.ctxStep(this._h, name, JSON.stringify(o), stepCall(f, this._causes, () => name)));
    return JSON.parse(out);
  }

  /**
   * Runs several steps at once: `branches` is an object `{name: f}` or an
   * array of `[name, f]`. Each value is saved as its step ends, so a crash
   * re-runs only the unfinished ones. The values in order.
   */
  async parallel(branches) {
    const list = Array.isArray(branches) ? branches : Object.entries(branches ?? {});
    const names = [];
    const fns = [];
    for (const b of list) {
      if (!Array.isArray(b) || b.length !== 2) throw new InvalidInput('parallel: each branch is [name, function]');
      names.push(str('a step name', b[0]));
      fns.push(fn(`step ${JSON.stringify(b[0])}: its function`, b[1]));
    }
    const f = (i, info) => fns[i](info);
    const out = await call(() => native.ctxParallel(this._h, names, stepCall(f, this._causes, (args) => names[args[0]])));
    return JSON.parse(out);
  }

  /**
   * Stops the run at gate `name` until it is approved or rejected (by the
   * CLI, Python or `Store.approve`); then returns the approval's data.
   * `{timeoutMs, onTimeout: 'reject' | 'approve'}` decide it by itself.
   */
  async gate(name, opts) {
    const o = options(`gate ${JSON.stringify(str('a gate name', name))}`, opts, ['timeoutMs', 'onTimeout']);
    return JSON.parse(await call(() => native.ctxGate(this._h, name, JSON.stringify(o))));
  }

  /** Waits for signal `name`: the delivery, or null when `timeoutMs` passed first. */
  async waitFor(name, opts) {
    const o = options(`wait ${JSON.stringify(str('a signal name', name))}`, opts, ['timeoutMs']);
    return JSON.parse(await call(() => native.ctxWaitFor(this._h, name, o.timeoutMs ?? null)));
  }

  /** A durable timer: the run stops (holding no process) for `ms` milliseconds. */
  async sleep(name, ms) {
    str('a timer name', name);
    if (typeof ms !== 'number') throw new InvalidInput(`sleep ${JSON.stringify(name)}: ms must be a number, not ${kindOf(ms)}`);
    await call(() => native.ctxSleep(this._h, name, ms));
  }

  /** The time of this point of the run, recorded the first time. */
  async now() {
    return new Date(await call(() => native.ctxNow(this._h)));
  }

  /** A number in [0, 1), recorded the first time. */
  async random() {
    return call(() => native.ctxRandom(this._h));
  }

  /** A random UUID, recorded the first time. */
  async uuid() {
    return call(() => native.ctxUuid(this._h));
  }

  /** `base`, then `base#2`, `base#3`... for a name used more than once in a run. */
  numbered(base) {
    try {
      return native.ctxNumbered(this._h, str('a name', base));
    } catch (e) {
      throw fromNative(e);
    }
  }
}

// Each context call's promise is kept (see DurableContext._ended).
for (const m of ['step', 'parallel', 'gate', 'waitFor', 'sleep', 'now', 'random', 'uuid']) {
  const impl = DurableContext.prototype[m];
  Object.defineProperty(DurableContext.prototype, m, {
    value: function tracked(...args) {
      const p = impl.apply(this, args);
      this._calls.push(p);
      return p;
    },
    writable: true,
    configurable: true,
  });
}

function runOptions(o) {
  const opts = options('run', o, RUN_OPTIONS);
  return JSON.stringify(opts);
}

function checkStore(store) {
  if (!(store instanceof Store)) throw new InvalidInput(`the store must be one openStore() gave, not ${kindOf(store)}`);
  return store._native;
}

/**
 * Ends a native run call: the function's own error when it threw one, else
 * the engine's, with the cause of a failed step attached.
 */
function ended(e, own, causes) {
  if (own.set) throw own.error;
  const err = fromNative(e);
  if (err instanceof StepFailed && causes.has(err.step)) err.cause = causes.get(err.step);
  throw err;
}

/** A durable function, made by `durable(name, fn)`. */
class Durable {
  constructor(name, f) {
    this.name = str('a durable function name', name);
    this.fn = fn(`durable function ${JSON.stringify(name)}`, f);
  }

  /**
   * Starts or resumes run `runId`. The input is recorded when the run
   * starts; a resume uses the recorded one. Options: `acceptChanged`,
   * `waitForTimers`, `leaseMs`, `budget`.
   */
  async run(runId, store, input, opts) {
    str('the run id', runId);
    const s = checkStore(store);
    const inputText = optJson("the run's input", input);
    const optsText = runOptions(opts);
    const own = { set: false, error: undefined };
    const causes = new Map();
    const body = async (handle) => {
      const ctx = new DurableContext(handle, causes);
      try {
        const given = JSON.parse(await call(() => native.ctxInput(handle)));
        let v;
        try {
          v = await this.fn(ctx, given);
        } finally {
          ctx._ended();
        }
        if (v === undefined) v = null;
        const p = problem(v);
        return JSON.stringify(p ? { invalid: p } : { ok: v });
      } catch (e) {
        const id = engineId(e);
        if (id !== null) return JSON.stringify({ engine: id });
        own.set = true;
        own.error = e;
        return JSON.stringify({ own: describe(e) });
      }
    };
    try {
      return new Outcome(JSON.parse(await s.runDurable(runId, this.name, inputText, optsText, body)));
    } catch (e) {
      return ended(e, own, causes);
    }
  }
}

/**
 * Makes `async (ctx, input) => ...` a durable function named `name`. Run it
 * with `.run(runId, store, input)`; a crash costs the step in flight only.
 */
function durable(name, f) {
  return new Durable(name, f);
}

/** A listed workflow: named steps run in order on a state, with gates, timers, waits and child runs. */
class Workflow {
  constructor(name, opts) {
    this.name = str('a workflow name', name);
    const o = options(`workflow ${JSON.stringify(name)}`, opts, ['version']);
    this.version = o.version ?? null;
    this._steps = [];
    this._fns = [];
  }

  _add(spec, f) {
    this._steps.push(spec);
    this._fns.push(f ?? null);
    return this;
  }

  /** A step: `f(state, info)` returns an object of updates to the state, or nothing. */
  step(name, f, opts) {
    str('a step name', name);
    fn(`step ${JSON.stringify(name)}: its function`, f);
    const o = stepOptions(name, opts);
    return this._add({ kind: 'step', name, ...o }, f);
  }

  /** A gate: the run waits until it is approved or rejected. */
  gate(name, opts) {
    const o = options(`gate ${JSON.stringify(str('a gate name', name))}`, opts, ['timeoutMs', 'onTimeout']);
    return this._add({ kind: 'gate', name, ...o });
  }

  /** A durable timer of `ms` milliseconds. */
  sleep(name, ms) {
    str('a timer name', name);
    if (typeof ms !== 'number' || !Number.isFinite(ms)) throw new InvalidInput(`sleep ${JSON.stringify(name)}: ms ${String(ms)}: expected a finite number of milliseconds`);
    return this._add({ kind: 'sleep', name, ms });
  }

  /** A wait for signal `signal`, recorded under `name`. */
  wait(name, signal, opts) {
    const o = options(`wait ${JSON.stringify(str('a wait name', name))}`, opts, ['timeoutMs']);
    return this._add({ kind: 'wait', name, signal: str('a signal name', signal), ...o });
  }

  /** A child run of workflow `workflow`, which a worker runs. */
  child(name, workflow, opts) {
    const o = options(`child ${JSON.stringify(str('a child name', name))}`, opts, ['retries']);
    return this._add({ kind: 'child', name, workflow: str('a workflow name', workflow), ...o });
  }

  /** The names of the steps, in order. */
  get stepNames() {
    return this._steps.map((s) => s.name);
  }

  /** Starts or resumes run `runId`; see `Durable.run`. The outcome's value is the final state. */
  async run(runId, store, input, opts) {
    str('the run id', runId);
    const s = checkStore(store);
    const inputText = optJson("the run's input", input);
    const optsText = runOptions(opts);
    const spec = JSON.stringify({ name: this.name, version: this.version ?? undefined, steps: this._steps });
    const causes = new Map();
    const fns = this._fns;
    const f = (i, state, info) => fns[i](JSON.parse(state), info);
    const reply = stepCall(f, causes, (args) => this._steps[args[0]].name);
    try {
      return new Outcome(JSON.parse(await s.runWorkflow(runId, spec, inputText, optsText, reply)));
    } catch (e) {
      return ended(e, { set: false }, causes);
    }
  }
}

// ---------------------------------------------------------------- stores

/** A store, opened by `openStore(url)`. */
class Store {
  constructor(n) {
    Object.defineProperty(this, '_native', { value: n });
  }

  /** The URL it was opened from, with any password hidden. */
  get url() {
    return this._native.url;
  }

  /** Approves gate `gate` of waiting run `runId` (`{data, by}`); the run's record after it. */
  async approve(runId, gate, opts) {
    const o = options('approve', opts, ['data', 'by']);
    const data = optJson(`the data approving gate ${JSON.stringify(gate)}`, o.data);
    return JSON.parse(await call(() => this._native.approve(str('the run id', runId), str('the gate', gate), data, o.by ?? null)));
  }

  /** Rejects gate `gate` of waiting run `runId` (`{reason, by}`): the run ends as rejected. */
  async reject(runId, gate, opts) {
    const o = options('reject', opts, ['reason', 'by']);
    return JSON.parse(await call(() => this._native.reject(str('the run id', runId), str('the gate', gate), o.reason ?? null, o.by ?? null)));
  }

  /** Sends signal `name` to run `runId` (`{data, by}`); its number in the run's event log. */
  async signal(runId, name, opts) {
    const o = options('signal', opts, ['data', 'by']);
    const data = optJson(`the data of signal ${JSON.stringify(name)}`, o.data);
    return call(() => this._native.signal(str('the run id', runId), str('the signal', name), data, o.by ?? null));
  }

  /** The run's record (as `steadfast show --json` prints it); NoSuchRun when missing. */
  async show(runId) {
    return JSON.parse(await call(() => this._native.show(str('the run id', runId))));
  }

  /** The run's step records, oldest first; NoSuchRun when missing. */
  async history(runId) {
    return JSON.parse(await call(() => this._native.history(str('the run id', runId))));
  }

  /** Runs in id order, filtered by `{status, workflow, after, limit}`. */
  async runs(filter) {
    const f = options('runs', filter, ['status', 'workflow', 'after', 'limit']);
    if (f.limit !== undefined && !(Number.isSafeInteger(f.limit) && f.limit >= 0)) {
      throw new InvalidInput(`runs: limit ${f.limit}: expected a whole number, 0 or more`);
    }
    return JSON.parse(await call(() => this._native.runs(JSON.stringify(f))));
  }

  /**
   * Records a new run of `workflow` for a worker or a later `run` to take;
   * false when it is there already, started the same way. Options:
   * `durable`, `steps`, `priority`, `partition`, `version`.
   */
  async start(workflow, runId, input, opts) {
    const o = options('start', opts, ['durable', 'steps', 'priority', 'partition', 'version']);
    if (o.version !== undefined && o.steps === undefined) {
      throw new InvalidInput('start: version is the version of a listed workflow, and needs its steps');
    }
    if (o.priority !== undefined && !Number.isInteger(o.priority)) {
      throw new InvalidInput(`start: priority ${o.priority}: expected a whole number`);
    }
    const text = optJson("the run's input", input);
    return call(() => this._native.start(str('the workflow', workflow), str('the run id', runId), text, JSON.stringify(o)));
  }
}

/** Opens (creating when missing) the store a URL names: `sqlite:PATH`, `file:PATH`, `postgres://...`, `cosmos://...`, `memory:`. */
async function openStore(url = DEFAULT_STORE_URL) {
  return new Store(await call(() => native.openStore(str('the store URL', url))));
}

/** The kinds of store this build opens: `[{name, schemes, url, summary}]`. */
function backends() {
  return JSON.parse(native.backends());
}

/** The id of the child run that step `step` of run `parent` starts. */
function childId(parent, step) {
  return native.childId(str('the parent run id', parent), str('the step', step));
}

module.exports = {
  DEFAULT_STORE_URL, MAX_DEPTH, VERSION,
  openStore, backends, childId, durable, Durable, DurableContext, Workflow, Outcome, Store,
  problem,
  TerminalError, ...CLASSES,
};
// For the package's own modules (langgraph.js), not part of the API.
Object.defineProperty(module.exports, '_internal', { value: { native, fromNative } });
