// Types of steadfast/langgraph (langgraph.js).
import type { RunnableConfig } from '@langchain/core/runnables';
import {
  BaseCheckpointSaver,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
} from '@langchain/langgraph-checkpoint';

/** Options of `SteadfastSaver.open`. */
export interface SteadfastSaverOptions {
  /** How long a thread stays this saver's after its last write (default 60 000). */
  leaseMs?: number;
  /** Seal every value with the keys in STEADFAST_KEY or STEADFAST_KEY_FILE. */
  encrypt?: boolean;
  /** LangGraph's serializer (its default when absent). */
  serde?: SerializerProtocol;
}

/** LangGraph.js checkpoints in a Steadfast store (SQLite, PostgreSQL or memory), with one writer per thread. */
export class SteadfastSaver extends BaseCheckpointSaver {
  /** Opens the store a URL names: `sqlite:PATH`, `postgres://...` or `memory:`. */
  static open(url: string, options?: SteadfastSaverOptions): Promise<SteadfastSaver>;
  private constructor();
  getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined>;
  list(config: RunnableConfig, options?: CheckpointListOptions): AsyncGenerator<CheckpointTuple>;
  put(config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<RunnableConfig>;
  putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath?: string): Promise<void>;
  deleteThread(threadId: string): Promise<void>;
  /** Gives up this saver's lease on a thread, so another saver may write it. */
  release(threadId: string): Promise<void>;
  /** Releases every thread this saver holds; it stays usable. */
  close(): Promise<void>;
}
