'use strict';
// Durable functions and listed workflows from Node.js, on the SQLite store.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const sf = require('..');

function tempStore() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-node-'));
  return { dir, url: `sqlite:${path.join(dir, 'runs.db')}` };
}

test('a resumed run skips the steps it has done, and records now, random and uuid once', async () => {
  const store = await sf.openStore(tempStore().url);
  const calls = [];
  const agent = sf.durable('agent', async (ctx, input) => {
    const plan = await ctx.step('plan', (info) => {
      calls.push(`plan:${info.attempt}:${info.idempotencyKey}`);
      return { question: input.question };
    });
    const [a, b] = await ctx.parallel({
      search: async () => { calls.push('search'); return 1; },
      fetch: () => { calls.push('fetch'); return 2; },
    });
    const when = await ctx.now();
    const r = await ctx.random();
    const id = await ctx.uuid();
    const data = await ctx.gate('review');
    return { plan, a, b, when: when.getTime(), r, id, data };
  });
  const first = await agent.run('run-1', store, { question: 'why?' });
  assert.equal(first.status, 'waiting');
  assert.equal(first.gate, 'review');
  assert.deepEqual(calls.sort(), ['fetch', 'plan:1:run-1/plan', 'search']);
  await store.approve('run-1', 'review', { data: { ok: true }, by: 'tester' });
  const done = await agent.run('run-1', store);
  assert.equal(done.status, 'completed');
  assert.equal(calls.length, 3, 'no step ran twice');
  assert.deepEqual(done.value.plan, { question: 'why?' });
  assert.deepEqual([done.value.a, done.value.b], [1, 2]);
  assert.deepEqual(done.value.data, { ok: true });
  assert.ok(done.value.r >= 0 && done.value.r < 1);
  assert.match(done.value.id, /^[0-9a-f-]{36}$/);
  // A completed run returns its saved value without calling the function.
  const again = await sf.durable('agent', async () => { throw new Error('must not run'); }).run('run-1', store);
  assert.deepEqual(again.value, done.value);
  const shown = await store.show('run-1');
  assert.equal(shown.status, 'completed');
  const history = await store.history('run-1');
  assert.deepEqual(history.map((h) => h.name).slice(0, 3), ['plan', 'search', 'fetch']);
});

test('a rejected gate ends the run as rejected, with the reason', async () => {
  const store = await sf.openStore('memory:');
  const f = sf.durable('gated', async (ctx) => ctx.gate('go'));
  assert.equal((await f.run('g1', store)).status, 'waiting');
  await store.reject('g1', 'go', { reason: 'not today' });
  const out = await f.run('g1', store);
  assert.equal(out.status, 'rejected');
  assert.equal(out.gate, 'go');
  assert.equal(out.reason, 'not today');
  await assert.rejects(store.approve('g1', 'go'), sf.NotWaiting);
});

test('a durable timer stops the run until its time', async () => {
  const store = await sf.openStore('memory:');
  const f = sf.durable('sleepy', async (ctx) => { await ctx.sleep('nap', 60_000); return 1; });
  const before = Date.now();
  const out = await f.run('s1', store);
  assert.equal(out.status, 'sleeping');
  assert.ok(out.until instanceof Date);
  assert.ok(out.until.getTime() >= before + 59_000);
});

test('a signal reaches the run that waits for it', async () => {
  const store = await sf.openStore('memory:');
  const f = sf.durable('waiter', async (ctx) => (await ctx.waitFor('go')).data);
  assert.equal((await f.run('w1', store)).status, 'waiting');
  assert.equal(await store.signal('w1', 'go', { data: { n: 7 } }), 1);
  assert.deepEqual((await f.run('w1', store)).value, { n: 7 });
});

test('a terminal error fails the step at once; a retryable one is tried again', async () => {
  const store = await sf.openStore('memory:');
  let attempts = 0;
  const terminal = sf.durable('t', async (ctx) => ctx.step('x', () => {
    attempts++;
    throw new sf.TerminalError('bad request');
  }, { retries: 3, backoffMs: 1 }));
  const err = await terminal.run('t1', store).catch((e) => e);
  assert.ok(err instanceof sf.StepFailed, String(err));
  assert.ok(err instanceof sf.SteadfastError);
  assert.equal(err.step, 'x');
  assert.equal(attempts, 1);
  assert.ok(err.cause instanceof sf.TerminalError);
  assert.match(err.message, /bad request/);

  let tries = 0;
  const flaky = sf.durable('f', async (ctx) => ctx.step('y', (info) => {
    tries++;
    if (info.attempt < 3) throw new Error(`try ${info.attempt}`);
    return info.attempt;
  }, { retries: 2, backoffMs: 1 }));
  assert.equal((await flaky.run('f1', store)).value, 3);
  assert.equal(tries, 3);
});

test("the function's own error comes back unchanged, and nothing after it is recorded", async () => {
  const store = await sf.openStore('memory:');
  const mine = new RangeError('out of range');
  const f = sf.durable('own', async (ctx) => {
    await ctx.step('a', () => 1);
    throw mine;
  });
  const err = await f.run('o1', store).catch((e) => e);
  assert.equal(err, mine);
  const history = await store.history('o1');
  assert.deepEqual(history.map((h) => h.name), ['a']);
});

test('a suspension caught by the function still stops the run', async () => {
  const store = await sf.openStore('memory:');
  const f = sf.durable('catcher', async (ctx) => {
    try {
      await ctx.gate('g');
    } catch (e) {
      assert.ok(e instanceof sf.Suspended);
    }
    return 'went on';
  });
  const out = await f.run('c1', store);
  assert.equal(out.status, 'waiting');
});

test('a function that returns before its context calls end is refused, and the process goes on', async () => {
  const store = await sf.openStore('memory:');
  let release;
  const hold = new Promise((r) => { release = r; });
  const f = sf.durable('hasty', async (ctx) => {
    // Left unawaited and without a handler: its rejection must not end
    // the process (node:test fails the run on an unhandled rejection).
    ctx.step('slow', () => hold);
    await new Promise((r) => setTimeout(r, 20));
    return 1;
  });
  await assert.rejects(f.run('h1', store), (e) => e instanceof sf.InvalidWorkflow && /still running/.test(e.message));
  release(5);
  const history = await store.history('h1').catch((e) => (e instanceof sf.NoSuchRun ? [] : Promise.reject(e)));
  assert.equal(history.length, 0, 'the unawaited step was not recorded');
});

test('changed code is refused with WorkflowChanged before anything runs', async () => {
  const store = await sf.openStore('memory:');
  await sf.durable('v', async (ctx) => { await ctx.step('a', () => 1); return ctx.gate('g'); }).run('v1', store);
  let ran = false;
  const changed = sf.durable('v', async (ctx) => { await ctx.step('b', () => { ran = true; return 2; }); return 0; });
  await assert.rejects(changed.run('v1', store), sf.WorkflowChanged);
  assert.equal(ran, false);
});

test('values that cannot be stored are refused with the path of the part that cannot', async () => {
  const store = await sf.openStore('memory:');
  const f = sf.durable('vals', async (ctx) => 1);
  const cases = [
    [{ a: [1, NaN] }, /at \$\.a\[1\]: NaN is not a finite number/],
    [{ when: new Date(0) }, /at \$\.when: a Date is not a plain object/],
    [{ 'odd key': undefined }, /at \$\["odd key"\]: undefined is not JSON/],
    [{ big: 10n }, /at \$\.big: the BigInt 10 is not JSON/],
    [{ m: new Map() }, /at \$\.m: a Map is not a plain object/],
    [{ s: 'a\ud800' }, /at \$\.s: the string holds a lone surrogate/],
    [{ x: { '$serde_json::private::RawValue': '{"n": 1}' } }, /at \$\.x\["\$serde_json::private::RawValue"\]: the engine's JSON reader takes the name/],
    [[1, , 3], /at \$\[1\]: an empty slot/], // eslint-disable-line no-sparse-arrays
  ];
  for (const [input, re] of cases) {
    await assert.rejects(f.run('bad-input', store, input), (e) => e instanceof sf.InvalidInput && re.test(e.message), String(re));
  }
  const cyclic = { a: {} };
  cyclic.a.b = cyclic;
  await assert.rejects(f.run('bad-input', store, cyclic), /at \$\.a\.b: the value refers to itself/);
  let deep = 0;
  for (let i = 0; i < 150; i++) deep = [deep];
  await assert.rejects(f.run('bad-input', store, deep), /nested 100 levels deep or more/);
  let ok = 0;
  for (let i = 0; i < 99; i++) ok = [ok];
  await f.run('deep-enough', store, ok);
  assert.equal((await store.show('deep-enough')).status, 'completed', 'the engine keeps 99 levels below a value');
  let hundred = 0;
  for (let i = 0; i < 100; i++) hundred = [hundred];
  await assert.rejects(f.run('bad-input', store, hundred), /at \$(\[0\]){100}: nested 100 levels/);
  await assert.rejects(f.run('bad-input', store, { d: { toJSON: () => 'x' } }), /at \$\.d: a value with its own toJSON/);
  class List extends Array {}
  await assert.rejects(f.run('bad-input', store, { l: List.from([1]) }), /at \$\.l: a List is not a plain array/);
  const trap = { get boom() { throw new Error('getter'); } };
  await assert.rejects(f.run('bad-input', store, trap), /could not be read: Error: getter/);
  await assert.rejects(store.show('bad-input'), sf.NoSuchRun, 'nothing was written');

  // A step's value and the function's return value are checked too.
  const step = sf.durable('vals2', async (ctx) => ctx.step('x', () => ({ n: Infinity })));
  await assert.rejects(step.run('bad-step', store), (e) => e instanceof sf.SteadfastError && /\$\.n/.test(e.message) && /finite/.test(e.message));
  assert.equal((await store.history('bad-step')).length, 0);
  const ret = sf.durable('vals3', async () => new Set([1]));
  await assert.rejects(ret.run('bad-ret', store), (e) => e instanceof sf.InvalidValue && /a Set is not a plain object/.test(e.message));
  // Approval data too, and nothing of it is recorded.
  await sf.durable('vals4', async (ctx) => ctx.gate('g')).run('gated', store);
  await assert.rejects(store.approve('gated', 'g', { data: { f: () => 1 } }), /at \$\.f: a function is not JSON/);
  assert.equal((await store.show('gated')).status, 'waiting');
});

test('arguments out of range are refused with what and where', async () => {
  const store = await sf.openStore('memory:');
  const run = (body) => sf.durable('args', body).run(`a${Math.random()}`, store);
  await assert.rejects(run((ctx) => ctx.step('x', () => 1, { timeoutMs: -1 })), /step "x": timeoutMs: -1 is not a duration/);
  await assert.rejects(run((ctx) => ctx.step('x', () => 1, { retry: 3 })), /unknown option "retry"/);
  await assert.rejects(run((ctx) => ctx.step('x', () => 1, { retries: -1 })), sf.InvalidInput);
  await assert.rejects(run((ctx) => ctx.sleep('nap', NaN)), /sleep "nap": NaN is not a duration/);
  await assert.rejects(run((ctx) => ctx.step('', () => 1)), sf.InvalidWorkflow);
  await assert.rejects(run((ctx) => ctx.step('x', 'not a function')), /must be a function/);
  await assert.rejects(run((ctx) => ctx.gate('g', { onTimeout: 'maybe' })), /gate "g"/);
  await assert.rejects(sf.durable('x', async () => 1).run('', store), sf.InvalidRunId);
  await assert.rejects(sf.durable('x', async () => 1).run('a\u0000b', store), sf.InvalidRunId);
  await assert.rejects(sf.durable('x', async () => 1).run('ok', {}), /the store must be one openStore\(\) gave/);
  await assert.rejects(sf.durable('x', async () => 1).run('ok', store, undefined, { leaseMs: 1e300 }), sf.InvalidInput);
  // Numbers that JSON would turn into null are refused, not dropped.
  await assert.rejects(run((ctx) => ctx.step('x', () => 1, { timeoutMs: NaN })), /timeoutMs NaN: expected a finite number/);
  await assert.rejects(run((ctx) => ctx.step('x', () => 1, { retries: Infinity })), /retries Infinity/);
  await assert.rejects(run((ctx) => ctx.gate('g', { timeoutMs: NaN })), /gate "g": timeoutMs NaN/);
  await assert.rejects(sf.durable('x', async () => 1).run('ok', store, undefined, { leaseMs: NaN }), /run: leaseMs NaN/);
  await assert.rejects(sf.durable('x', async () => 1).run('ok', store, undefined, { acceptChanged: 'yes' }), /acceptChanged must be true or false/);
  assert.throws(() => new sf.Workflow('w').sleep('nap', NaN), /sleep "nap": ms NaN/);
  assert.throws(() => new sf.Workflow('w').step('s', () => ({}), { timeoutMs: Infinity }), /timeoutMs Infinity/);
  await assert.rejects(store.approve('x', 'g', { by: 5 }), /approve: by must be a string/);
  await assert.rejects(store.start('w', 'x', {}, { version: 'v1' }), /needs its steps/);
  // Text that is not Unicode would become another id.
  await assert.rejects(sf.durable('x', async () => 1).run('r\ud800', store), /lone surrogate/);
  await assert.rejects(store.approve('x', '\udc00'), /the gate holds a lone surrogate/);
  await assert.rejects(run((ctx) => ctx.step('a\ud800', () => 1)), /lone surrogate/);
  await assert.rejects(store.show('missing'), sf.NoSuchRun);
  await assert.rejects(store.runs({ status: 'sideways' }), /status "sideways"/);
  await assert.rejects(store.runs({ limit: -1 }), /limit -1/);
  await assert.rejects(sf.openStore('ftp://example'), sf.Unsupported);
  assert.throws(() => sf.durable('x', 5), /must be a function/);
});

test('a listed workflow runs its steps on a state, stopping at its gate', async () => {
  const { url } = tempStore();
  const store = await sf.openStore(url);
  const seen = [];
  const wf = new sf.Workflow('listed')
    .step('double', (state, info) => { seen.push(info.step); return { n: state.n * 2 }; })
    .gate('check')
    .step('done', (state) => { seen.push('done'); return { total: state.n + 1 }; });
  assert.deepEqual(wf.stepNames, ['double', 'check', 'done']);
  const first = await wf.run('l1', store, { n: 4 });
  assert.equal(first.status, 'waiting');
  await store.approve('l1', 'check');
  const out = await wf.run('l1', store);
  assert.equal(out.value.total, 9);
  assert.deepEqual(seen, ['double', 'done']);
  const bad = new sf.Workflow('bad').step('x', () => [1, 2]);
  await assert.rejects(bad.run('l2', store), /an object of updates/);
  const started = await store.start('listed', 'l3', { n: 1 }, { steps: wf.stepNames });
  assert.equal(started, true);
  assert.equal((await store.runs({ workflow: 'listed', status: 'pending' })).map((r) => r.run_id).join(), 'l3');
});

test('context calls made at once are refused, so that a resume can replay them', async () => {
  const store = await sf.openStore('memory:');
  const together = sf.durable('together', async (ctx) => {
    const slow = () => new Promise((r) => setTimeout(() => r('a'), 20));
    return Promise.all([ctx.step('a', slow), ctx.step('b', () => 'b')]);
  });
  await assert.rejects(together.run('t1', store), (e) => e instanceof sf.InvalidWorkflow, 'refused');
  const nested = sf.durable('nested', async (ctx) => ctx.step('outer', () => ctx.step('inner', () => 1), { retries: 0 }));
  const err = await nested.run('t2', store).catch((e) => e);
  assert.ok(err instanceof sf.StepFailed, String(err));
  assert.match(err.message, /another context call of this run is still running/);
  // Made one after the other, the same steps run and resume.
  const inTurn = sf.durable('together', async (ctx) => [await ctx.step('a', () => 'a'), await ctx.step('b', () => 'b'), await ctx.gate('g')]);
  assert.equal((await inTurn.run('t3', store)).status, 'waiting');
  await store.approve('t3', 'g', { data: 1 });
  assert.deepEqual((await inTurn.run('t3', store)).value, ['a', 'b', 1]);
});

test('a terminal error whose message is not well-formed text still fails the step at once', async () => {
  const store = await sf.openStore('memory:');
  let calls = 0;
  const f = sf.durable('cut', async (ctx) => ctx.step('x', () => {
    calls++;
    throw new sf.TerminalError('half an emoji: \u{1F600}'.slice(0, -1));
  }, { retries: 4, backoffMs: 1 }));
  const err = await f.run('c1', store).catch((e) => e);
  assert.ok(err instanceof sf.StepFailed, String(err));
  assert.equal(calls, 1);
  assert.match(err.message, /TerminalError: half an emoji: \uFFFD/);
});

test('whatever the function throws comes back unchanged, a Proxy too', async () => {
  const store = await sf.openStore('memory:');
  const thrown = new Proxy({}, { get() { throw new Error('trap'); } });
  const f = sf.durable('proxy', async () => { throw thrown; });
  // Caught with try: resolving a promise with the Proxy would read its
  // `then`, which throws.
  let err;
  try {
    await f.run('p1', store);
  } catch (e) {
    err = e;
  }
  assert.ok(err === thrown);
});
