'use strict';
// Runs are the same whichever language made them: a run started from Node is
// shown and approved by the CLI and by Python and resumed by Python; a run
// Python started at a gate is approved from Node and resumed by Node.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const sf = require('..');

/** The CLI, from STEADFAST_BIN or the workspace's debug build; under CI it must be there. */
function cli() {
  const bin = process.env.STEADFAST_BIN || path.join(__dirname, '..', '..', 'target', 'debug', 'steadfast');
  if (fs.existsSync(bin)) return bin;
  if (process.env.CI) throw new Error(`the steadfast command is not at ${bin}: CI builds it before the Node tests`);
  return null;
}

function python() {
  const py = process.env.STEADFAST_PYTHON;
  if (py) return py;
  if (process.env.CI) throw new Error('STEADFAST_PYTHON is not set: CI runs the cross-language tests with the Python package');
  return null;
}

function run(cmd, args, input) {
  const p = spawnSync(cmd, args, { encoding: 'utf8', timeout: 60_000, input });
  assert.equal(p.status, 0, `${cmd} ${args.join(' ')}: ${p.stderr}`);
  return p.stdout;
}

function tempUrl() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-interop-'));
  return `sqlite:${path.join(dir, 'runs.db')}`;
}

// The same function in both languages: a step, a gate, a step.
const calls = [];
const review = sf.durable('review', async (ctx, input) => {
  const draft = await ctx.step('draft', () => { calls.push('draft'); return `draft of ${input.topic}`; });
  const decision = await ctx.gate('approve');
  const final = await ctx.step('publish', () => { calls.push('publish'); return `${draft}, ${decision.note}`; });
  return { final };
});

const PY_REVIEW = `
import json, sys, steadfast
store = steadfast.open_store(sys.argv[1])
calls = []
@steadfast.durable("review")
def review(ctx, input):
    def draft():
        calls.append("draft")
        return f"draft of {input['topic']}"
    d = ctx.step("draft", draft)
    decision = ctx.gate("approve")
    def publish():
        calls.append("publish")
        return f"{d}, {decision['note']}"
    return {"final": ctx.step("publish", publish)}
cmd = sys.argv[2]
if cmd == "run":
    out = review.run(sys.argv[3], store, json.loads(sys.argv[4]) if len(sys.argv) > 4 else None)
    print(json.dumps({"status": out.status, "value": out.value, "calls": calls}))
elif cmd == "approve":
    steadfast.approve(store, sys.argv[3], "approve", data={"note": sys.argv[4]}, by="python")
    print(json.dumps(steadfast.show(store, sys.argv[3])["status"]))
`;

test('a run started from Node is shown and approved by the CLI, then resumed by Node', async (t) => {
  const bin = cli();
  if (!bin) {
    t.skip('the steadfast command is not built (cargo build -p steadfast-cli)');
    return;
  }
  const url = tempUrl();
  const store = await sf.openStore(url);
  calls.length = 0;
  assert.equal((await review.run('n1', store, { topic: 'tides' })).status, 'waiting');
  const shown = JSON.parse(run(bin, ['show', 'n1', '--store', url, '--json']));
  assert.equal(shown.status, 'waiting');
  assert.equal(shown.workflow, 'review');
  run(bin, ['approve', 'n1', 'approve', '--store', url, '--data', '{"note": "from the CLI"}', '--by', 'cli']);
  const out = await review.run('n1', store);
  assert.deepEqual(out.value, { final: 'draft of tides, from the CLI' });
  assert.deepEqual(calls, ['draft', 'publish']);
  const after = JSON.parse(run(bin, ['show', 'n1', '--store', url, '--json']));
  assert.equal(after.status, 'completed');
});

test('a run the CLI started from a flow file is shown and approved from Node, and the CLI finishes it', async (t) => {
  const bin = cli();
  if (!bin) {
    t.skip('the steadfast command is not built (cargo build -p steadfast-cli)');
    return;
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-interop-flow-'));
  const flow = path.join(dir, 'flow.toml');
  fs.writeFileSync(flow, [
    'name = "cli-flow"',
    '[[step]]', 'name = "collect"', `run = "echo '{\\"docs\\": 3}'"`,
    '[[step]]', 'name = "review"', 'gate = true',
    '[[step]]', 'name = "write"', `run = "echo '{\\"written\\": true}'"`,
  ].join('\n'));
  const url = `sqlite:${path.join(dir, 'runs.db')}`;
  const first = spawnSync(bin, ['run', flow, '--run-id', 'c1', '--store', url], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(first.status, 4, first.stderr);
  const store = await sf.openStore(url);
  const shown = await store.show('c1');
  assert.equal(shown.status, 'waiting');
  assert.deepEqual(shown.completed, ['collect']);
  await store.approve('c1', 'review', { data: { note: 'from Node' }, by: 'node' });
  // A listed workflow of the same names is not the flow file: its record
  // carries the flow's version, and Node's run is refused, not run.
  let ran = false;
  const imitation = new sf.Workflow('cli-flow').step('collect', () => { ran = true; }).gate('review').step('write', () => ({}));
  await assert.rejects(imitation.run('c1', store), sf.WorkflowChanged);
  assert.equal(ran, false);
  run(bin, ['run', flow, '--run-id', 'c1', '--store', url]);
  const done = await store.show('c1');
  assert.equal(done.status, 'completed');
  assert.equal(done.state.written, true);
  assert.deepEqual(done.state.review, { note: 'from Node' });
});

test('a run started from Node is approved and resumed by Python; one started by Python, by Node', async (t) => {
  const py = python();
  if (!py) {
    t.skip('STEADFAST_PYTHON is not set (the Python package is not installed here)');
    return;
  }
  const url = tempUrl();
  const store = await sf.openStore(url);
  calls.length = 0;
  // Node starts, Python approves and finishes: Node's draft is not redone.
  assert.equal((await review.run('n2', store, { topic: 'moths' })).status, 'waiting');
  assert.equal(JSON.parse(run(py, ['-c', PY_REVIEW, url, 'approve', 'n2', 'from Python'])), 'waiting');
  const pyOut = JSON.parse(run(py, ['-c', PY_REVIEW, url, 'run', 'n2']));
  assert.equal(pyOut.status, 'completed');
  assert.deepEqual(pyOut.value, { final: 'draft of moths, from Python' });
  assert.deepEqual(pyOut.calls, ['publish'], 'Python ran only what Node had not');
  assert.deepEqual(calls, ['draft']);

  // Python starts, Node approves and finishes: Python's draft is not redone.
  calls.length = 0;
  const started = JSON.parse(run(py, ['-c', PY_REVIEW, url, 'run', 'p1', '{"topic": "kelp"}']));
  assert.equal(started.status, 'waiting');
  await store.approve('p1', 'approve', { data: { note: 'from Node' }, by: 'node' });
  const out = await review.run('p1', store);
  assert.deepEqual(out.value, { final: 'draft of kelp, from Node' });
  assert.deepEqual(calls, ['publish']);
  const record = await store.show('p1');
  assert.equal(record.status, 'completed');
});
