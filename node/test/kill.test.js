'use strict';
// A Node.js agent SIGKILLed while a parallel tool call is in flight resumes
// re-running that tool only: every step that was recorded before the kill is
// not run again, and the answer is the one a run nobody killed gives. The
// same killed run is resumed by the Python package's copy of the agent, and a
// Python run killed the same way is resumed from Node.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const sf = require('..');

const AGENT = path.join(__dirname, '..', 'examples', 'agent.js');
const PY_AGENT = path.join(__dirname, '..', '..', 'python', 'examples', 'agent.py');

function events(log) {
  if (!fs.existsSync(log)) return [];
  return fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

/** The Python interpreter with the steadfast package, from STEADFAST_PYTHON; under CI it must be there. */
function python() {
  const py = process.env.STEADFAST_PYTHON;
  if (py) return py;
  if (process.env.CI) throw new Error('STEADFAST_PYTHON is not set: CI runs the cross-language kill tests with the Python package');
  return null;
}

function agentArgs(lang, url, runId, delay, log) {
  const args = ['--store', url, '--run-id', runId, '--delay', String(delay), '--log', log, '--lease', '30'];
  return lang === 'node' ? [process.execPath, [AGENT, ...args]] : [python(), [PY_AGENT, ...args]];
}

function runToEnd(lang, url, runId, log) {
  const [cmd, args] = agentArgs(lang, url, runId, 0, log);
  const p = spawnSync(cmd, args, { encoding: 'utf8', timeout: 60_000 });
  assert.equal(p.status, 0, `${lang} agent: ${p.stderr}`);
  return JSON.parse(p.stdout);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Starts `lang`'s agent and SIGKILLs it once `ready(record, log events)`
 * holds; the record the kill left.
 */
async function killWhen(lang, url, runId, log, ready) {
  const [cmd, args] = agentArgs(lang, url, runId, 0.25, log);
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })));
  const store = await sf.openStore(url);
  const deadline = Date.now() + 30_000;
  for (;;) {
    assert.equal(child.exitCode, null, `the agent ended before it was killed: ${stderr}`);
    assert.ok(Date.now() < deadline, 'the agent did not reach the point to kill it at');
    const record = await store.show(runId).catch((e) => (e instanceof sf.NoSuchRun ? null : Promise.reject(e)));
    if (record && ready(record, events(log))) break;
    await sleep(5);
  }
  child.kill('SIGKILL');
  const { signal } = await exited;
  assert.equal(signal, 'SIGKILL');
  return store.show(runId);
}

/** Killed while tool-1-1-fetch runs and its sibling tool-1-0-calculator is recorded. */
function midParallel(record, evs) {
  const started = new Set(evs.filter((e) => e.event === 'start').map((e) => e.step));
  const ended = new Set(evs.filter((e) => e.event === 'end').map((e) => e.step));
  return record.completed.includes('tool-1-0-calculator') && started.has('tool-1-1-fetch') && !ended.has('tool-1-1-fetch');
}

/** Killed while the tools of turn 1 run (Python's agent gives each tool the same time). */
function duringTurn1(record) {
  return record.completed.includes('model-1');
}

async function killAndResume(killer, resumer, ready) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-kill-'));
  const reference = runToEnd('node', `sqlite:${path.join(dir, 'reference.db')}`, 'ref', path.join(dir, 'reference.log'));
  const allSteps = new Set(events(path.join(dir, 'reference.log')).filter((e) => e.event === 'start').map((e) => e.step));
  assert.equal(allSteps.size, 9, 'four model calls and five tool calls');

  const url = `sqlite:${path.join(dir, 'runs.db')}`;
  const first = path.join(dir, 'first.log');
  const second = path.join(dir, 'second.log');
  const record = await killWhen(killer, url, 'killed', first, ready);
  assert.notEqual(record.status, 'completed');
  const done = new Set(record.completed);
  assert.ok(!done.has('tool-1-1-fetch'), `the kill landed while tool-1-1-fetch ran: ${[...done].join()}`);

  const answer = runToEnd(resumer, url, 'killed', second);
  assert.deepEqual(answer, reference);
  const rerun = events(second).filter((e) => e.event === 'start').map((e) => e.step);
  // Exactly the steps not recorded before the kill ran again: the tool in
  // flight and what came after it; nothing recorded ran twice.
  assert.deepEqual(new Set(rerun), new Set([...allSteps].filter((s) => !done.has(s))));
  assert.equal(rerun.length, new Set(rerun).size);
  assert.ok(rerun.includes('tool-1-1-fetch'));
  return done;
}

test('a Node agent killed during a parallel tool call resumes re-running only that tool', async (t) => {
  const done = await killAndResume('node', 'node', midParallel);
  assert.ok(done.has('tool-1-0-calculator'), 'the finished sibling was recorded, and not run again');
});

test('a Node agent killed mid-run is resumed by the Python agent, and the other way round', async (t) => {
  if (!python()) {
    t.skip('STEADFAST_PYTHON is not set (the Python package is not installed here)');
    return;
  }
  await killAndResume('node', 'python', midParallel);
  await killAndResume('python', 'node', duringTurn1);
});
