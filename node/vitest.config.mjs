// The LangGraph.js checkpointer validation suite (test/langgraph/); the
// package's own tests run with `node --test`.
export default {
  test: {
    include: ['test/langgraph/*.validate.test.mjs'],
    globals: true,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
};
