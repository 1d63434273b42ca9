// LangGraph.js's checkpointer validation suite (its library entry point,
// run by vitest) against SteadfastSaver on PostgreSQL.
import { validate } from '@langchain/langgraph-checkpoint-validation';
import initializer from './postgres.initializer.mjs';

validate(initializer);
