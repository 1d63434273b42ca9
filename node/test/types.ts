// Checked by `tsc` (npm run typecheck): the types accept the documented
// uses and refuse what the runtime refuses.
import { durable, openStore, Workflow, StepFailed, TerminalError, type Json } from '../index.js';

async function main(): Promise<void> {
  const store = await openStore('memory:');
  const agent = durable('agent', async (ctx, input: { question: string }) => {
    const plan = await ctx.step('plan', (info) => ({ question: input.question, key: info.idempotencyKey }));
    const [a, b] = await ctx.parallel({ search: async () => 1, fetch: () => 2 });
    const approved = await ctx.gate('review', { timeoutMs: 60_000, onTimeout: 'reject' });
    await ctx.sleep('cool-down', 10);
    const when: Date = await ctx.now();
    const r: number = await ctx.random();
    const id: string = await ctx.uuid();
    return { plan, a, b, approved, when: when.toISOString(), r, id };
  });
  const out = await agent.run('run-1', store, { question: 'why' }, { leaseMs: 30_000 });
  if (out.completed) {
    const v: Json | null = out.value;
    void v;
  }
  // @ts-expect-error a Date is not JSON: the input type refuses it
  await agent.run('run-2', store, { question: new Date() });
  const wf = new Workflow('listed').step('a', (state) => ({ n: Number(state.n ?? 0) + 1 })).gate('g');
  await wf.run('run-3', store, { n: 1 });
  await store.approve('run-3', 'g', { data: { ok: true }, by: 'me' });
  try {
    await store.show('missing');
  } catch (e) {
    if (e instanceof StepFailed) console.log(e.step);
  }
  throw new TerminalError('done');
}
void main;

import { SteadfastSaver } from '../langgraph.js';

async function saver(): Promise<void> {
  const s = await SteadfastSaver.open('sqlite:graph.db', { leaseMs: 30_000 });
  const t = await s.getTuple({ configurable: { thread_id: 't' } });
  if (t) console.log(t.checkpoint.id);
  await s.release('t');
  await s.close();
}
void saver;
