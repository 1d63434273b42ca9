// LangGraph.js's checkpointer validation suite against SteadfastSaver on
// PostgreSQL (STEADFAST_TEST_PG): each checkpointer gets a schema of its own,
// dropped afterwards.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { SteadfastSaver } = require('../../langgraph.js');
const pg = require('pg');

const base = process.env.STEADFAST_TEST_PG;
if (!base) throw new Error('STEADFAST_TEST_PG is not set: the PostgreSQL validation needs a server');
const schemas = new Map();

export default {
  checkpointerName: 'steadfast (postgres)',
  async createCheckpointer() {
    const schema = `lgjs_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
    const saver = await SteadfastSaver.open(`${base}${base.includes('?') ? '&' : '?'}schema=${schema}`);
    schemas.set(saver, schema);
    return saver;
  },
  async destroyCheckpointer(saver) {
    await saver.close();
    const client = new pg.Client({ connectionString: base });
    await client.connect();
    try {
      await client.query(`DROP SCHEMA IF EXISTS "${schemas.get(saver)}" CASCADE`);
    } finally {
      await client.end();
    }
    schemas.delete(saver);
  },
};
