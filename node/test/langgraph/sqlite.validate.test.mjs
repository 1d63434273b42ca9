// LangGraph.js's checkpointer validation suite (its library entry point,
// run by vitest) against SteadfastSaver on SQLite.
import { validate } from '@langchain/langgraph-checkpoint-validation';
import initializer from './sqlite.initializer.mjs';

validate(initializer);
