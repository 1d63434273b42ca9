#!/usr/bin/env node
'use strict';
// A tool-calling agent loop as a durable function, with a scripted model.
//
// The loop asks the "model" what to do, runs the tools it picked in
// parallel, hands the results back, and stops when the model answers. Every
// model call and every tool call is a step: kill the process at any moment
// (Ctrl-C, SIGKILL, an OOM kill) and run the same command again; finished
// calls are not repeated and the loop goes on where it stopped.
//
//     node examples/agent.js --run-id demo "How many tools does it take?"
//
// The model is a script (no network, no key), so the run is the same every
// time; each call waits --delay seconds to stand for the latency of a real
// one (the second tool of a turn twice as long, the third three times). The
// workflow and its steps are named as in the Python package's
// examples/agent.py, so a run either one started, the other resumes.

const fs = require('node:fs');
const { parseArgs } = require('node:util');
const steadfast = require('..');

// What the scripted model answers, turn by turn: tool calls, then an answer.
const SCRIPT = [
  { tool_calls: [
    { name: 'search', args: { query: 'durable execution' } },
    { name: 'search', args: { query: 'checkpoint after every step' } },
  ] },
  { tool_calls: [
    { name: 'calculator', args: { a: 6, b: 7 } },
    { name: 'fetch', args: { doc: 'doc-2' } },
  ] },
  { tool_calls: [{ name: 'fetch', args: { doc: 'doc-4' } }] },
  { answer: null },
];

let delayMs = 300;
let logFile = null;

/** One line per step start and end, for the kill test to count. */
function log(event, step) {
  if (logFile) fs.appendFileSync(logFile, `${JSON.stringify({ event, step, pid: process.pid })}\n`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The scripted model: the reply for this turn, the answer built from what the tools said. */
async function callModel(name, messages) {
  log('start', name);
  await sleep(delayMs);
  const turn = messages.filter((m) => m.role === 'assistant').length;
  const reply = { ...SCRIPT[Math.min(turn, SCRIPT.length - 1)] };
  if ('answer' in reply) {
    const seen = messages.filter((m) => m.role === 'tool').flatMap((m) => m.results);
    reply.answer = `${seen.length} tool results; 6*7 = ${seen[2].result}`;
  }
  log('end', name);
  return reply;
}

/** The tools, async as network calls are. */
async function runTool(name, call, slower) {
  log('start', name);
  await sleep(delayMs * slower);
  const a = call.args;
  let result;
  if (call.name === 'search') {
    result = [`doc-${a.query.length % 5}`, `doc-${a.query.length % 3}`];
  } else if (call.name === 'calculator') {
    result = a.a * a.b;
  } else {
    result = `contents of ${a.doc}`;
  }
  log('end', name);
  return { tool: call.name, result };
}

/** Model, tools, model, ..., answer: each call a recorded step. */
const agent = steadfast.durable('tool-agent', async (ctx, task) => {
  const messages = [{ role: 'user', content: task.question }];
  for (let turn = 0; turn < 8; turn++) {
    const name = `model-${turn}`;
    const reply = await ctx.step(name, () => callModel(name, messages), { retries: 2, backoffMs: 200 });
    messages.push({ role: 'assistant', ...reply });
    if (reply.answer) return { answer: reply.answer, turns: turn + 1 };
    const branches = reply.tool_calls.map((c, i) => {
      const step = `tool-${turn}-${i}-${c.name}`;
      return [step, () => runTool(step, c, i + 1)];
    });
    messages.push({ role: 'tool', results: await ctx.parallel(branches) });
  }
  throw new steadfast.TerminalError('the model did not answer within 8 turns');
});

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      store: { type: 'string', default: steadfast.DEFAULT_STORE_URL },
      'run-id': { type: 'string', default: 'agent-demo' },
      delay: { type: 'string', default: '0.3' },
      log: { type: 'string' },
      lease: { type: 'string', default: '30' },
    },
  });
  const delay = Number(values.delay);
  const lease = Number(values.lease);
  if (!Number.isFinite(delay) || delay < 0) throw new Error(`--delay ${values.delay}: expected seconds, 0 or more`);
  if (!Number.isFinite(lease) || lease < 0) throw new Error(`--lease ${values.lease}: expected seconds, 0 or more`);
  delayMs = delay * 1000;
  logFile = values.log ?? null;
  const store = await steadfast.openStore(values.store);
  const question = positionals[0] ?? 'What does a checkpoint cost?';
  const outcome = await agent.run(values['run-id'], store, { question }, lease > 0 ? { leaseMs: lease * 1000 } : {});
  console.log(JSON.stringify({ status: outcome.status, value: outcome.value }));
  return outcome.completed ? 0 : 4;
}

main().then((code) => { process.exitCode = code; }, (e) => {
  console.error(`agent: ${e.name}: ${e.message}`);
  process.exitCode = 1;
});
