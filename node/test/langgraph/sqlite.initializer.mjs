// LangGraph.js's checkpointer validation suite against SteadfastSaver on
// SQLite: each checkpointer gets a database file of its own.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { SteadfastSaver } = require('../../langgraph.js');

const dirs = new Map();

export default {
  checkpointerName: 'steadfast (sqlite)',
  async createCheckpointer() {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steadfast-lgjs-'));
    const saver = await SteadfastSaver.open(`sqlite:${path.join(dir, 'graph.db')}`);
    dirs.set(saver, dir);
    return saver;
  },
  async destroyCheckpointer(saver) {
    await saver.close();
    fs.rmSync(dirs.get(saver), { recursive: true, force: true });
    dirs.delete(saver);
  },
};
