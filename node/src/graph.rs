//! The LangGraph checkpoint store (the `steadfast-graph` crate) bound for
//! Node.js: the store's calls block, so each runs on a thread of Node's
//! pool, and its promise settles on the event loop with the rows as objects
//! and the bytes as `Buffer`s.

use std::sync::Arc;

use napi::bindgen_prelude::{AsyncTask, Buffer, Uint8Array};
use napi::{Env, Task};
use napi_derive::napi;
use serde_json::Value;
use steadfast_graph::{GraphError, GraphStore, Row};

fn graph_err(e: GraphError) -> napi::Error {
    match e {
        GraphError::Held(m) => crate::reject("Held", m, Value::Null),
        GraphError::InvalidInput(m) => crate::invalid(m),
        GraphError::Unsupported(m) => crate::reject("Unsupported", m, Value::Null),
        GraphError::Store { kind, message } => {
            crate::reject(crate::store_kind(kind), message, Value::Null)
        }
        other => crate::reject("SteadfastError", other.to_string(), Value::Null),
    }
}

/// What a finished call gives to JavaScript.
pub trait IntoJs: Send + 'static {
    /// Its JavaScript form.
    type Js: napi::bindgen_prelude::ToNapiValue + napi::bindgen_prelude::TypeName;
    /// Converts it, on the event loop.
    fn into_js(self) -> Self::Js;
}

impl IntoJs for () {
    type Js = ();
    fn into_js(self) {}
}

impl IntoJs for Option<Row> {
    type Js = Option<JsRow>;
    fn into_js(self) -> Option<JsRow> {
        self.map(JsRow::from)
    }
}

impl IntoJs for Vec<Row> {
    type Js = Vec<JsRow>;
    fn into_js(self) -> Vec<JsRow> {
        self.into_iter().map(JsRow::from).collect()
    }
}

type Job<T> = Box<dyn FnOnce(&GraphStore) -> steadfast_graph::Result<T> + Send>;

/// One blocking call of the store, run on Node's thread pool.
pub struct GraphCall<T> {
    store: Arc<GraphStore>,
    job: Option<Job<T>>,
}

impl<T: IntoJs> Task for GraphCall<T> {
    type Output = T;
    type JsValue = T::Js;

    fn compute(&mut self) -> napi::Result<T> {
        let job = self
            .job
            .take()
            .ok_or_else(|| napi::Error::from_reason("the call was already run"))?;
        job(&self.store).map_err(graph_err)
    }

    fn resolve(&mut self, _env: Env, out: T) -> napi::Result<T::Js> {
        Ok(out.into_js())
    }
}

/// Opens the store off the event loop (a PostgreSQL connection takes time).
pub struct OpenGraph {
    url: String,
    lease: std::time::Duration,
    encrypt: bool,
    opened: Option<GraphStore>,
}

impl Task for OpenGraph {
    type Output = ();
    type JsValue = NativeGraphStore;

    fn compute(&mut self) -> napi::Result<()> {
        self.opened =
            Some(GraphStore::open(&self.url, self.lease, self.encrypt).map_err(graph_err)?);
        Ok(())
    }

    fn resolve(&mut self, _env: Env, _: ()) -> napi::Result<NativeGraphStore> {
        let inner = self
            .opened
            .take()
            .ok_or_else(|| napi::Error::from_reason("the store was not opened"))?;
        Ok(NativeGraphStore {
            inner: Arc::new(inner),
        })
    }
}

/// Opens (creating the tables when missing) the graph store a URL names:
/// `sqlite:PATH`, `postgres://...` or `memory:`. A thread stays this
/// saver's for `leaseMs` after its last write.
#[napi]
pub fn open_graph_store(
    url: String,
    lease_ms: f64,
    encrypt: bool,
) -> napi::Result<AsyncTask<OpenGraph>> {
    let lease = crate::millis("leaseMs", lease_ms, None)?;
    Ok(AsyncTask::new(OpenGraph {
        url,
        lease,
        encrypt,
        opened: None,
    }))
}

/// A pending write as it is read back.
#[napi(object)]
pub struct JsWrite {
    pub task_id: String,
    pub channel: String,
    #[napi(js_name = "type")]
    pub kind: String,
    pub blob: Buffer,
    pub task_path: String,
    pub idx: i64,
}

/// A large channel value kept apart from its checkpoint.
#[napi(object)]
pub struct JsChannel {
    pub channel: String,
    #[napi(js_name = "type")]
    pub kind: String,
    pub blob: Buffer,
}

/// A checkpoint as it is read back, with its pending writes in
/// `(taskPath, taskId, idx)` order.
#[napi(object)]
pub struct JsRow {
    pub thread_id: String,
    pub ns: String,
    pub checkpoint_id: String,
    pub parent_id: Option<String>,
    #[napi(js_name = "type")]
    pub kind: String,
    pub blob: Buffer,
    pub metadata: String,
    pub writes: Vec<JsWrite>,
    pub channels: Vec<JsChannel>,
}

impl From<Row> for JsRow {
    fn from(r: Row) -> Self {
        JsRow {
            thread_id: r.0,
            ns: r.1,
            checkpoint_id: r.2,
            parent_id: r.3,
            kind: r.4,
            blob: r.5.into(),
            metadata: r.6,
            writes: r
                .7
                .into_iter()
                .map(|w| JsWrite {
                    task_id: w.0,
                    channel: w.1,
                    kind: w.2,
                    blob: w.3.into(),
                    task_path: w.4,
                    idx: w.5,
                })
                .collect(),
            channels: r
                .8
                .into_iter()
                .map(|c| JsChannel {
                    channel: c.0,
                    kind: c.1,
                    blob: c.2.into(),
                })
                .collect(),
        }
    }
}

/// A pending write on its way in.
#[napi(object)]
pub struct JsPutWrite {
    pub idx: i64,
    pub channel: String,
    #[napi(js_name = "type")]
    pub kind: String,
    pub blob: Uint8Array,
}

/// A large channel value on its way in, stored apart from its checkpoint.
#[napi(object)]
pub struct JsPutChannel {
    pub channel: String,
    #[napi(js_name = "type")]
    pub kind: String,
    pub blob: Uint8Array,
}

/// A checkpoint on its way in.
#[napi(object)]
pub struct JsPut {
    pub thread_id: String,
    pub ns: String,
    pub checkpoint_id: String,
    pub parent_id: Option<String>,
    #[napi(js_name = "type")]
    pub kind: String,
    pub blob: Uint8Array,
    pub metadata: String,
    pub run_id: Option<String>,
}

/// LangGraph checkpoints in a store, with one writer per thread.
#[napi]
pub struct NativeGraphStore {
    inner: Arc<GraphStore>,
}

impl NativeGraphStore {
    fn call<T: IntoJs>(
        &self,
        job: impl FnOnce(&GraphStore) -> steadfast_graph::Result<T> + Send + 'static,
    ) -> AsyncTask<GraphCall<T>> {
        AsyncTask::new(GraphCall {
            store: Arc::clone(&self.inner),
            job: Some(Box::new(job)),
        })
    }
}

#[napi]
impl NativeGraphStore {
    /// The size in bytes above which a value is kept as a blob.
    #[napi(getter)]
    pub fn blob_threshold(&self) -> f64 {
        self.inner.blob_threshold() as f64
    }

    /// Saves a checkpoint (replacing one with the same id), taking or
    /// renewing the thread's lease in the same transaction; `channels` are
    /// its large channel values, left out of its blob and stored once per
    /// thread.
    #[napi]
    pub fn put(&self, p: JsPut, channels: Vec<JsPutChannel>) -> AsyncTask<GraphCall<()>> {
        let blob = p.blob.to_vec();
        let channels: Vec<(String, String, Vec<u8>)> = channels
            .into_iter()
            .map(|c| (c.channel, c.kind, c.blob.to_vec()))
            .collect();
        self.call(move |s| {
            s.put(
                p.thread_id,
                p.ns,
                p.checkpoint_id,
                p.parent_id,
                p.kind,
                blob,
                p.metadata,
                p.run_id,
                channels,
            )
        })
    }

    /// Saves a task's pending writes.
    #[napi]
    pub fn put_writes(
        &self,
        thread_id: String,
        ns: String,
        checkpoint_id: String,
        task_id: String,
        task_path: String,
        writes: Vec<JsPutWrite>,
    ) -> AsyncTask<GraphCall<()>> {
        let writes: Vec<(i64, String, String, Vec<u8>)> = writes
            .into_iter()
            .map(|w| (w.idx, w.channel, w.kind, w.blob.to_vec()))
            .collect();
        self.call(move |s| s.put_writes(thread_id, ns, checkpoint_id, task_id, task_path, writes))
    }

    /// The checkpoint `checkpointId` of a thread's namespace, or its latest
    /// when null; null when there is none.
    #[napi]
    pub fn get(
        &self,
        thread_id: String,
        ns: String,
        checkpoint_id: Option<String>,
    ) -> AsyncTask<GraphCall<Option<Row>>> {
        self.call(move |s| s.get(thread_id, ns, checkpoint_id))
    }

    /// Checkpoints newest first, each with its pending writes; `filter` is
    /// a JSON object whose keys must each equal the metadata's.
    #[napi]
    pub fn list(
        &self,
        thread_id: Option<String>,
        ns: Option<String>,
        checkpoint_id: Option<String>,
        before: Option<String>,
        limit: Option<i64>,
        filter: Option<String>,
    ) -> AsyncTask<GraphCall<Vec<Row>>> {
        self.call(move |s| {
            s.list(
                thread_id,
                ns,
                checkpoint_id,
                before,
                limit.map(i128::from),
                filter,
            )
        })
    }

    /// Deletes a thread: its checkpoints and writes in every namespace.
    #[napi]
    pub fn delete_thread(&self, thread_id: String) -> AsyncTask<GraphCall<()>> {
        self.call(move |s| s.delete_thread(thread_id))
    }

    /// Gives up this saver's lease on a thread.
    #[napi]
    pub fn release(&self, thread_id: String) -> AsyncTask<GraphCall<()>> {
        self.call(move |s| s.release(thread_id))
    }

    /// Gives up every lease this saver holds.
    #[napi]
    pub fn close(&self) -> AsyncTask<GraphCall<()>> {
        self.call(|s| s.close())
    }
}
