'use strict';
// SteadfastSaver under LangGraph.js: a graph killed mid-node resumes from
// its last checkpoint, and a second saver on a live thread is refused.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const sf = require('..');
const { SteadfastSaver } = require('../langgraph.js');

const GRAPH = path.join(__dirname, 'fixtures', 'graph.mjs');

function events(log) {
  if (!fs.existsSync(log)) return [];
  return fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('a LangGraph.js graph killed mid-node resumes from the last checkpoint', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-lgjs-kill-'));
  const url = `sqlite:${path.join(dir, 'graph.db')}`;
  const first = path.join(dir, 'first.log');
  const args = ['--store', url, '--thread', 't1'];
  const child = spawn(process.execPath, [GRAPH, ...args, '--delay', '0.3', '--log', first], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })));
  const deadline = Date.now() + 30_000;
  while (!events(first).some((e) => e.event === 'start' && e.node === 'n2')) {
    assert.equal(child.exitCode, null, `the graph ended before it was killed: ${stderr}`);
    assert.ok(Date.now() < deadline, 'the graph did not reach n2');
    await sleep(5);
  }
  child.kill('SIGKILL');
  assert.equal((await exited).signal, 'SIGKILL');
  assert.ok(!events(first).some((e) => e.event === 'end' && e.node === 'n2'), 'killed while n2 ran');

  const second = path.join(dir, 'second.log');
  const p = spawnSync(process.execPath, [GRAPH, ...args, '--resume', '--log', second], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(p.status, 0, p.stderr);
  const out = JSON.parse(p.stdout);
  assert.deepEqual(out.visited, ['n0', 'n1', 'n2', 'n3', 'n4']);
  assert.equal(out.total, 15);
  const rerun = events(second).filter((e) => e.event === 'start').map((e) => e.node);
  assert.deepEqual(rerun, ['n2', 'n3', 'n4'], 'only the node in flight and those after it ran again');
});

test('a second saver on a thread another live saver holds is refused with Held, and gets it once released', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-lgjs-held-'));
  const url = `sqlite:${path.join(dir, 'graph.db')}`;
  const a = await SteadfastSaver.open(url);
  const b = await SteadfastSaver.open(url);
  const { emptyCheckpoint } = require('@langchain/langgraph-checkpoint');
  const cp = { ...emptyCheckpoint(), id: '1' };
  const config = { configurable: { thread_id: 'shared', checkpoint_ns: '' } };
  await a.put(config, cp, { source: 'input', step: -1, parents: {} });
  await assert.rejects(b.put(config, { ...cp, id: '2' }, { source: 'loop', step: 0, parents: {} }), sf.Held);
  assert.equal((await b.getTuple(config)).checkpoint.id, '1', 'the refused write left nothing');
  await a.release('shared');
  await b.put(config, { ...cp, id: '2' }, { source: 'loop', step: 0, parents: {} });
  assert.equal((await a.getTuple(config)).checkpoint.id, '2');
  await assert.rejects(SteadfastSaver.open(url, { leaseMs: -5 }), sf.InvalidInput);
  await assert.rejects(SteadfastSaver.open('ftp://x'), sf.Unsupported);
  assert.equal(await a.getTuple({ configurable: {} }), undefined);
  await assert.rejects(a.put({ configurable: {} }, cp, {}, {}), /put: the config's "configurable" has no thread_id/);
});

test('a copy of a checkpoint (updateState as __copy__) keeps every channel value', async () => {
  const { Annotation, StateGraph, START, END, MemorySaver } = await import('@langchain/langgraph');
  const State = Annotation.Root({ a: Annotation(), b: Annotation() });
  const build = (checkpointer) => new StateGraph(State)
    .addNode('one', () => ({ a: 'A1' }))
    .addNode('two', () => ({ b: 'B2' }))
    .addEdge(START, 'one').addEdge('one', 'two').addEdge('two', END)
    .compile({ checkpointer });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-lgjs-copy-'));
  const saver = await SteadfastSaver.open(`sqlite:${path.join(dir, 'graph.db')}`);
  const results = [];
  for (const checkpointer of [new MemorySaver(), saver]) {
    const graph = build(checkpointer);
    const config = { configurable: { thread_id: 'copy' } };
    await graph.invoke({}, config);
    const before = (await graph.getState(config)).values;
    const forked = await graph.updateState(config, null, '__copy__');
    results.push([before, (await graph.getState(forked)).values]);
  }
  assert.deepEqual(results[0], [{ a: 'A1', b: 'B2' }, { a: 'A1', b: 'B2' }], 'LangGraph keeps both');
  assert.deepEqual(results[1], results[0], 'SteadfastSaver keeps what MemorySaver keeps');
  await saver.close();
});
