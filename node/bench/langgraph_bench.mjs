#!/usr/bin/env node
// LangGraph.js checkpointers on a real (model-free) StateGraph, side by side
// in one run: a ten-node line where each node appends a ~100-byte item to a
// list channel and bumps two counters; every invocation on a thread of its
// own (the Python package's python/bench/langgraph_bench.py, small workload).
//
// Savers (--only, comma separated; default all):
//   stock-memory        MemorySaver: no disk, the framework's own floor
//   stock-sqlite        @langchain/langgraph-checkpoint-sqlite (better-sqlite3)
//   stock-postgres      @langchain/langgraph-checkpoint-postgres (pg)
//   steadfast-sqlite    steadfast/langgraph SteadfastSaver on sqlite:PATH
//   steadfast-postgres  SteadfastSaver on postgres://...?schema=NAME
// Durability (--durability default|fsync|both; default both):
//   default  as each saver sets itself up: the stock SQLite saver turns WAL
//            on and leaves synchronous at the library's default (read back
//            and printed); the stock PostgreSQL saver uses the server's
//            synchronous_commit; SteadfastSaver always syncs each commit.
//   fsync    every commit durable before put returns: the stock SQLite
//            saver's connection gets PRAGMA synchronous=FULL.
// LangGraph's own durability mode is its default ("async": a checkpoint is
// written while the next step runs, and the invocation waits for all of
// them before it returns).
//
// Prints one JSON line per (saver, durability) and a table: ms per
// checkpoint (wall time of the invocations / checkpoints stored), the median
// invocation, and the database size after the run.
//
//   node bench/langgraph_bench.mjs --invocations 1000 --pg postgres://postgres@127.0.0.1:5432/test

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { createRequire } from 'node:module';
import { Annotation, StateGraph, START, END, MemorySaver } from '@langchain/langgraph';

const require = createRequire(import.meta.url);
const { SteadfastSaver } = require('../langgraph.js');

const { values } = parseArgs({
  options: {
    invocations: { type: 'string', default: '200' },
    pg: { type: 'string' },
    only: { type: 'string' },
    durability: { type: 'string', default: 'both' },
  },
});
const N = Number(values.invocations);
if (!Number.isSafeInteger(N) || N < 1 || N > 1_000_000) {
  console.error(`--invocations ${values.invocations}: expected a whole number from 1 to 1000000`);
  process.exit(2);
}
const SAVERS = ['stock-memory', 'stock-sqlite', 'stock-postgres', 'steadfast-sqlite', 'steadfast-postgres'];
const only = values.only ? values.only.split(',') : SAVERS;
for (const s of only) {
  if (!SAVERS.includes(s)) {
    console.error(`--only ${s}: expected some of ${SAVERS.join(', ')}`);
    process.exit(2);
  }
}
const durabilities = values.durability === 'both' ? ['default', 'fsync'] : [values.durability];
for (const d of durabilities) {
  if (!['default', 'fsync'].includes(d)) {
    console.error(`--durability ${d}: expected default, fsync or both`);
    process.exit(2);
  }
}

const State = Annotation.Root({
  items: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  visits: Annotation({ reducer: (a, b) => a + b, default: () => 0 }),
  chars: Annotation({ reducer: (a, b) => a + b, default: () => 0 }),
});

function buildGraph() {
  const g = new StateGraph(State);
  const names = Array.from({ length: 10 }, (_, i) => `node_${i}`);
  names.forEach((name, i) => {
    g.addNode(name, () => {
      const text = `${name}: ${'x'.repeat(80)}`;
      return { items: [{ node: i, text }], visits: 1, chars: text.length };
    });
  });
  g.addEdge(START, names[0]);
  for (let i = 1; i < names.length; i++) g.addEdge(names[i - 1], names[i]);
  g.addEdge(names[names.length - 1], END);
  return g;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-lgjs-bench-'));
const fileSize = (p) => [p, `${p}-wal`].reduce((n, f) => n + (fs.existsSync(f) ? fs.statSync(f).size : 0), 0);

async function pgQuery(sql, params) {
  const pg = require('pg');
  const c = new pg.Client({ connectionString: values.pg });
  await c.connect();
  try {
    return (await c.query(sql, params)).rows;
  } finally {
    await c.end();
  }
}

const schemaSize = async (schema) => Number((await pgQuery(
  `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) AS n FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')`, [schema]))[0].n);

async function open(name, durability) {
  if (name === 'stock-memory') {
    return { saver: new MemorySaver(), settings: 'nothing durable', size: async () => null, close: async () => {} };
  }
  if (name === 'stock-sqlite') {
    const { SqliteSaver } = require('@langchain/langgraph-checkpoint-sqlite');
    const file = path.join(tmp, `stock-${durability}.sqlite`);
    const saver = SqliteSaver.fromConnString(file);
    saver.setup();
    if (durability === 'fsync') saver.db.pragma('synchronous=FULL');
    const sync = ['OFF', 'NORMAL', 'FULL', 'EXTRA'][saver.db.pragma('synchronous', { simple: true })];
    const journal = saver.db.pragma('journal_mode', { simple: true });
    return { saver, settings: `journal_mode=${journal}, synchronous=${sync}`, size: async () => fileSize(file), close: async () => saver.db.close() };
  }
  if (name === 'stock-postgres') {
    const { PostgresSaver } = require('@langchain/langgraph-checkpoint-postgres');
    const schema = `lgjsbench_stock_${durability}`;
    await pgQuery(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    const saver = PostgresSaver.fromConnString(values.pg, { schema });
    await saver.setup();
    const sc = (await pgQuery("SELECT current_setting('synchronous_commit') AS s"))[0].s;
    return { saver, settings: `synchronous_commit=${sc}`, size: () => schemaSize(schema), close: async () => { await saver.end(); await pgQuery(`DROP SCHEMA IF EXISTS ${schema} CASCADE`); } };
  }
  if (name === 'steadfast-sqlite') {
    const file = path.join(tmp, `steadfast-${durability}.sqlite`);
    const saver = await SteadfastSaver.open(`sqlite:${file}`);
    return { saver, settings: 'WAL, synchronous=FULL', size: async () => fileSize(file), close: () => saver.close() };
  }
  const schema = `lgjsbench_steadfast_${durability}`;
  await pgQuery(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  const saver = await SteadfastSaver.open(`${values.pg}${values.pg.includes('?') ? '&' : '?'}schema=${schema}`);
  const sc = (await pgQuery("SELECT current_setting('synchronous_commit') AS s"))[0].s;
  return { saver, settings: `synchronous_commit=${sc}`, size: () => schemaSize(schema), close: async () => { await saver.close(); await pgQuery(`DROP SCHEMA IF EXISTS ${schema} CASCADE`); } };
}

// Warm the JIT and the graph code up first, on no saver's time.
{
  const warm = buildGraph().compile({ checkpointer: new MemorySaver() });
  for (let i = 0; i < 50; i++) await warm.invoke({ items: [], visits: 0, chars: 0 }, { configurable: { thread_id: `w-${i}` } });
}

const rows = [];
for (const durability of durabilities) {
  for (const name of only) {
    if (name.endsWith('postgres') && !values.pg) {
      console.error(`${name}: skipped, no --pg URL`);
      continue;
    }
    if (name === 'stock-memory' && durability === 'fsync') continue;
    const o = await open(name, durability);
    const graph = buildGraph().compile({ checkpointer: o.saver });
    const times = [];
    const began = process.hrtime.bigint();
    for (let i = 0; i < N; i++) {
      const t0 = process.hrtime.bigint();
      const out = await graph.invoke({ items: [], visits: 0, chars: 0 }, { configurable: { thread_id: `t-${i}` } });
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
      if (out.visits !== 10) throw new Error(`${name}: invocation ${i} visited ${out.visits} nodes`);
    }
    const wallMs = Number(process.hrtime.bigint() - began) / 1e6;
    let checkpoints = 0;
    for (let i = 0; i < N; i++) {
      for await (const _ of o.saver.list({ configurable: { thread_id: `t-${i}` } })) checkpoints++;
    }
    times.sort((a, b) => a - b);
    const size = await o.size();
    await o.close();
    const row = {
      saver: name, durability, settings: o.settings, invocations: N, checkpoints,
      ms_per_checkpoint: +(wallMs / checkpoints).toFixed(3),
      median_invocation_ms: +times[Math.floor(times.length / 2)].toFixed(3),
      db_bytes: size,
    };
    rows.push(row);
    console.log(JSON.stringify(row));
  }
}
console.log('\n| saver | durability | settings | ms per checkpoint | median invocation (ms) | database after the run |');
console.log('| --- | --- | --- | --- | --- | --- |');
for (const r of rows) {
  const mib = r.db_bytes == null ? '' : `${(r.db_bytes / (1 << 20)).toFixed(1)} MiB`;
  console.log(`| ${r.saver} | ${r.durability} | ${r.settings} | ${r.ms_per_checkpoint} | ${r.median_invocation_ms} | ${mib} |`);
}
fs.rmSync(tmp, { recursive: true, force: true });
