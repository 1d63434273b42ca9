// Types of the steadfast package (index.js).

/** A value that can be stored and read back the same: JSON, with finite numbers and plain objects. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** How deep a value may nest. */
export const MAX_DEPTH: number;
/** The store used when none is named: SQLite in `.steadfast/runs.db`. */
export const DEFAULT_STORE_URL: string;
/** The package's version, the same as the engine's. */
export const VERSION: string;

/** Base class of every error Steadfast throws. */
export class SteadfastError extends Error {}
/** A run id that is empty, too long or holds characters a store cannot keep. */
export class InvalidRunId extends SteadfastError {}
/** A workflow that cannot run: a duplicate or reserved step name, a duration out of range. */
export class InvalidWorkflow extends SteadfastError {}
/** The run was recorded by a different workflow or different code; nothing new ran. */
export class WorkflowChanged extends SteadfastError {}
/** A step failed for good; `cause` is the last error its function threw. */
export class StepFailed extends SteadfastError {
  /** The step that failed. */
  step: string;
}
/** A value that cannot be stored and read back. */
export class InvalidValue extends SteadfastError {}
/** Another live process holds the run and its lease has not run out. */
export class Held extends SteadfastError {}
/** An argument out of its range or shape; nothing was written. */
export class InvalidInput extends SteadfastError {}
/** No run with that id in the store. */
export class NoSuchRun extends SteadfastError {}
/** The run is not waiting at that gate. */
export class NotWaiting extends SteadfastError {}
/** The run was cancelled. */
export class Cancelled extends SteadfastError {}
/** Thrown inside a durable function when the run stops at a gate or timer: let it propagate. */
export class Suspended extends SteadfastError {}
/** The store failed; the message names the store and what it was doing. */
export class StoreFailure extends SteadfastError {}
/** Another writer saved the run first. */
export class Conflict extends StoreFailure {}
/** A record or file that cannot be read: the store is never treated as empty. */
export class Corrupt extends StoreFailure {}
/** A state or value over the store's size limit. */
export class TooLarge extends StoreFailure {}
/** A save whose outcome is unknown (the connection dropped during the commit). */
export class OutcomeUnknown extends StoreFailure {}
/** The store cannot be reached or is locked by another process. */
export class Unavailable extends StoreFailure {}
/** The store or URL does not support what was asked. */
export class Unsupported extends StoreFailure {}
/** The store (a file, a schema) does not exist. */
export class NotFound extends StoreFailure {}
/** Throw from a step to fail it for good, without further attempts. */
export class TerminalError extends Error {}

/** What a step's function is told about its step. */
export interface StepInfo {
  runId: string;
  step: string;
  index: number;
  /** This attempt's number, from 1. */
  attempt: number;
  /** `runId/step`: the same on every attempt and resume; pass it to services so a repeat is a no-op. */
  idempotencyKey: string;
}

/** Options of a step. Durations are in milliseconds. */
export interface StepOptions {
  /** Extra attempts after the first. */
  retries?: number;
  backoffMs?: number;
  maxBackoffMs?: number;
  /** How long one attempt may take before the engine gives up on it. */
  timeoutMs?: number;
  /** A shared limit, `"KEY"` or `"KEY:N"`. */
  limit?: string;
  /** The step's version: a changed version re-runs it on a resume. */
  version?: string;
}

/** Options of a gate. */
export interface GateOptions {
  timeoutMs?: number;
  /** What the gate decides by itself when `timeoutMs` passes. */
  onTimeout?: 'reject' | 'approve';
}

/** Options of a run. */
export interface RunOptions {
  /** Cut the record at the first step the code no longer asks for, instead of failing with WorkflowChanged. */
  acceptChanged?: boolean;
  /** Wait for durable timers in this call instead of returning a sleeping outcome. */
  waitForTimers?: boolean;
  /** Hold the run for this long (renewed while it runs): another process gets Held meanwhile. */
  leaseMs?: number;
  /** Spending budgets of a run that has none yet. */
  budget?: Record<string, number>;
}

/** How a call to `run` ended. */
export class Outcome<T = Json> {
  status: 'completed' | 'waiting' | 'sleeping' | 'rejected';
  /** The return value (or final state) when completed, else null. */
  value: T | null;
  /** The gate the run waits at, or that was rejected. */
  gate: string | null;
  /** When a sleeping run's timer fires. */
  until: Date | null;
  /** Why the gate was rejected, if the rejection said. */
  reason: string | null;
  readonly completed: boolean;
  readonly waiting: boolean;
  readonly sleeping: boolean;
  readonly rejected: boolean;
}

/** A signal as a wait receives it. */
export interface Delivery {
  signal: string;
  data: Json;
  by: string;
  /** When it was sent (ISO 8601). */
  at: string;
  id: string;
  /** Its number in the run's event log. */
  seq: number;
}

/** The context a durable function gets: every call is recorded, and replayed on a resume. */
export class DurableContext {
  step<T extends Json | void>(name: string, f: (info: StepInfo) => T | Promise<T>, options?: StepOptions): Promise<T>;
  parallel<T extends Json | void>(
    branches: Record<string, (info: StepInfo) => T | Promise<T>> | Array<[string, (info: StepInfo) => T | Promise<T>]>,
  ): Promise<T[]>;
  gate(name: string, options?: GateOptions): Promise<Json>;
  waitFor(name: string, options?: { timeoutMs?: number }): Promise<Delivery | null>;
  sleep(name: string, ms: number): Promise<void>;
  now(): Promise<Date>;
  random(): Promise<number>;
  uuid(): Promise<string>;
  numbered(base: string): string;
}

/** A durable function, made by `durable(name, fn)`. */
export class Durable<I extends Json = Json, R extends Json | void = Json> {
  readonly name: string;
  run(runId: string, store: Store, input?: I, options?: RunOptions): Promise<Outcome<R>>;
}

/** Makes `async (ctx, input) => ...` a durable function named `name`. */
export function durable<I extends Json = Json, R extends Json | void = Json>(
  name: string,
  fn: (ctx: DurableContext, input: I) => Promise<R>,
): Durable<I, R>;

/** The state of a listed workflow. */
export type State = { [key: string]: Json };

/** A listed workflow: named steps run in order on a state. */
export class Workflow {
  constructor(name: string, options?: { version?: string });
  readonly name: string;
  readonly stepNames: string[];
  step(name: string, f: (state: State, info: StepInfo) => State | void | Promise<State | void>, options?: StepOptions): this;
  gate(name: string, options?: GateOptions): this;
  sleep(name: string, ms: number): this;
  wait(name: string, signal: string, options?: { timeoutMs?: number }): this;
  child(name: string, workflow: string, options?: { retries?: number }): this;
  run(runId: string, store: Store, input?: State, options?: RunOptions): Promise<Outcome<State>>;
}

/** A run as `runs` lists it. */
export interface RunSummary {
  run_id: string;
  workflow: string;
  status: 'pending' | 'running' | 'waiting' | 'sleeping' | 'completed' | 'failed' | 'rejected' | 'cancelled';
  /** The number of the next step. */
  next: number;
  version: number;
  created_at: string;
  updated_at: string;
  [key: string]: Json | undefined;
}

/** A store, opened by `openStore(url)`. */
export class Store {
  readonly url: string;
  approve(runId: string, gate: string, options?: { data?: Json; by?: string }): Promise<Json>;
  reject(runId: string, gate: string, options?: { reason?: string; by?: string }): Promise<Json>;
  signal(runId: string, name: string, options?: { data?: Json; by?: string }): Promise<number>;
  show(runId: string): Promise<{ [key: string]: Json }>;
  history(runId: string): Promise<Array<{ [key: string]: Json }>>;
  runs(filter?: { status?: string; workflow?: string; after?: string; limit?: number }): Promise<RunSummary[]>;
  start(
    workflow: string,
    runId: string,
    input?: Json,
    options?: { durable?: boolean; steps?: string[]; priority?: number; partition?: string; version?: string },
  ): Promise<boolean>;
}

/** Opens (creating when missing) the store a URL names. */
export function openStore(url?: string): Promise<Store>;
/** The kinds of store this build opens. */
export function backends(): Array<{ name: string; schemes: string[]; url: string; summary: string }>;
/** The id of the child run that step `step` of run `parent` starts. */
export function childId(parent: string, step: string): string;
/** Why a value cannot be stored, with the path of the part that cannot; null when it can. */
export function problem(value: unknown, path?: string): { path: string; reason: string } | null;
