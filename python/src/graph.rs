//! The LangGraph checkpoint store (the `steadfast-graph` crate) bound for
//! Python: arguments and rows converted, errors mapped to the package's
//! exception classes, the GIL released while a call works.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use steadfast_graph::Row;

use crate::errors::graph_err;

/// LangGraph checkpoints in a store, with one writer per thread.
#[pyclass(frozen, module = "steadfast._native")]
pub struct GraphStore {
    inner: steadfast_graph::GraphStore,
}

/// A checkpoint row as the Python layer takes it: bytes as `bytes`.
fn row_to_py(py: Python<'_>, r: Row) -> PyResult<Py<PyAny>> {
    let writes: Vec<Py<PyAny>> =
        r.7.into_iter()
            .map(|w| {
                (w.0, w.1, w.2, PyBytes::new(py, &w.3))
                    .into_pyobject(py)
                    .map(|t| t.into_any().unbind())
            })
            .collect::<PyResult<_>>()?;
    let channels: Vec<Py<PyAny>> =
        r.8.into_iter()
            .map(|c| {
                (c.0, c.1, PyBytes::new(py, &c.2))
                    .into_pyobject(py)
                    .map(|t| t.into_any().unbind())
            })
            .collect::<PyResult<_>>()?;
    let t = (
        r.0,
        r.1,
        r.2,
        r.3,
        r.4,
        PyBytes::new(py, &r.5),
        r.6,
        writes,
        channels,
    );
    Ok(t.into_pyobject(py)?.into_any().unbind())
}

#[pymethods]
impl GraphStore {
    /// Opens (creating the tables when missing) the graph store a URL names:
    /// `sqlite:PATH`, `postgres://…` (with `?schema=NAME`) or `memory:`.
    /// `lease_seconds` is how long a thread stays this saver's after its
    /// last write.
    #[new]
    #[pyo3(signature = (url, lease_seconds=60.0, encrypt=false))]
    fn new(py: Python<'_>, url: &str, lease_seconds: f64, encrypt: bool) -> PyResult<Self> {
        let lease = crate::run::secs("lease_seconds", lease_seconds)?;
        let inner = py
            .detach(|| steadfast_graph::GraphStore::open(url, lease, encrypt))
            .map_err(graph_err)?;
        Ok(GraphStore { inner })
    }

    /// The size in bytes above which a value is kept as a blob, once per
    /// thread (`?blob_threshold=SIZE` in the URL; 64 KiB by default).
    #[getter]
    fn blob_threshold(&self) -> u64 {
        self.inner.blob_threshold()
    }

    /// Saves a checkpoint (replacing one with the same id), taking or
    /// renewing the thread's lease in the same transaction. `channels` are
    /// its large channel values `(channel, type, bytes)`, left out of
    /// `blob` and stored once per thread.
    #[pyo3(signature = (thread_id, ns, checkpoint_id, parent_id, r#type, blob, metadata, run_id, channels=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        thread_id: String,
        ns: String,
        checkpoint_id: String,
        parent_id: Option<String>,
        r#type: String,
        blob: Vec<u8>,
        metadata: String,
        run_id: Option<String>,
        channels: Vec<(String, String, Vec<u8>)>,
    ) -> PyResult<()> {
        py.detach(|| {
            self.inner.put(
                thread_id,
                ns,
                checkpoint_id,
                parent_id,
                r#type,
                blob,
                metadata,
                run_id,
                channels,
            )
        })
        .map_err(graph_err)
    }

    /// Saves a task's pending writes `(idx, channel, type, blob)`.
    #[allow(clippy::too_many_arguments)]
    fn put_writes(
        &self,
        py: Python<'_>,
        thread_id: String,
        ns: String,
        checkpoint_id: String,
        task_id: String,
        task_path: String,
        writes: Vec<(i64, String, String, Vec<u8>)>,
    ) -> PyResult<()> {
        py.detach(|| {
            self.inner
                .put_writes(thread_id, ns, checkpoint_id, task_id, task_path, writes)
        })
        .map_err(graph_err)
    }

    /// The checkpoint `checkpoint_id` of a thread's namespace, or its latest
    /// when None, with its pending writes; None when there is none.
    #[pyo3(signature = (thread_id, ns, checkpoint_id=None))]
    fn get(
        &self,
        py: Python<'_>,
        thread_id: String,
        ns: String,
        checkpoint_id: Option<String>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let row = py
            .detach(|| self.inner.get(thread_id, ns, checkpoint_id))
            .map_err(graph_err)?;
        row.map(|r| row_to_py(py, r)).transpose()
    }

    /// Checkpoints newest first (by id), each with its pending writes.
    #[pyo3(signature = (thread_id=None, ns=None, checkpoint_id=None, before=None, limit=None, filter=None))]
    #[allow(clippy::too_many_arguments)]
    fn list(
        &self,
        py: Python<'_>,
        thread_id: Option<String>,
        ns: Option<String>,
        checkpoint_id: Option<String>,
        before: Option<String>,
        limit: Option<i128>,
        filter: Option<String>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let rows = py
            .detach(|| {
                self.inner
                    .list(thread_id, ns, checkpoint_id, before, limit, filter)
            })
            .map_err(graph_err)?;
        rows.into_iter().map(|r| row_to_py(py, r)).collect()
    }

    /// Deletes a thread: its checkpoints and writes in every namespace.
    fn delete_thread(&self, py: Python<'_>, thread_id: String) -> PyResult<()> {
        py.detach(|| self.inner.delete_thread(thread_id))
            .map_err(graph_err)
    }

    /// Deletes every checkpoint whose metadata's run id is one of `run_ids`.
    fn delete_for_runs(&self, py: Python<'_>, run_ids: Vec<String>) -> PyResult<()> {
        py.detach(|| self.inner.delete_for_runs(run_ids))
            .map_err(graph_err)
    }

    /// Copies a thread's checkpoints and writes to a new thread.
    fn copy_thread(&self, py: Python<'_>, source: String, target: String) -> PyResult<()> {
        py.detach(|| self.inner.copy_thread(source, target))
            .map_err(graph_err)
    }

    /// Prunes threads to their latest checkpoint, or deletes them.
    fn prune(&self, py: Python<'_>, thread_ids: Vec<String>, keep_latest: bool) -> PyResult<()> {
        py.detach(|| self.inner.prune(thread_ids, keep_latest))
            .map_err(graph_err)
    }

    /// Gives up this saver's lease on a thread.
    fn release(&self, py: Python<'_>, thread_id: String) -> PyResult<()> {
        py.detach(|| self.inner.release(thread_id))
            .map_err(graph_err)
    }

    /// Gives up every lease this saver holds.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.close()).map_err(graph_err)
    }
}

/// Chains of checkpoints in any store's shared documents, one writer per
/// chain (the Agent Framework storage's layer).
#[pyclass(frozen, module = "steadfast._native")]
pub struct ChainStore {
    inner: steadfast_graph::chains::ChainStore,
}

/// A stored checkpoint as the Python layer takes it: `(id, chain, workflow,
/// previous, timestamp, body)`.
type StoredTuple = (String, String, String, Option<String>, String, String);

fn stored_tuple(s: steadfast_graph::chains::Stored) -> StoredTuple {
    (s.id, s.chain, s.workflow, s.previous, s.timestamp, s.body)
}

#[pymethods]
impl ChainStore {
    /// Opens (creating it when missing) the store a URL names, for the
    /// chains of namespace `ns`; `lease_seconds` is how long a chain stays
    /// this store's after its last save.
    #[new]
    #[pyo3(signature = (url, ns, lease_seconds=60.0, encrypt=false))]
    fn new(
        py: Python<'_>,
        url: &str,
        ns: &str,
        lease_seconds: f64,
        encrypt: bool,
    ) -> PyResult<Self> {
        let lease = crate::run::secs("lease_seconds", lease_seconds)?;
        let inner = py
            .detach(|| steadfast_graph::chains::ChainStore::open(url, ns, lease, encrypt))
            .map_err(graph_err)?;
        Ok(ChainStore { inner })
    }

    /// Saves checkpoint `id` of `workflow` after `previous`; its chain.
    fn put(
        &self,
        py: Python<'_>,
        id: String,
        workflow: String,
        previous: Option<String>,
        timestamp: String,
        body: String,
    ) -> PyResult<String> {
        py.detach(|| {
            self.inner
                .put(&id, &workflow, previous.as_deref(), &timestamp, &body)
        })
        .map_err(graph_err)
    }

    /// Checkpoint `id` as `(id, chain, workflow, previous, timestamp, body)`,
    /// or None.
    fn get(&self, py: Python<'_>, id: String) -> PyResult<Option<StoredTuple>> {
        py.detach(|| self.inner.get(&id))
            .map(|s| s.map(stored_tuple))
            .map_err(graph_err)
    }

    /// Takes the lease on the chain of checkpoint `id`; False when there is
    /// no such checkpoint.
    fn claim(&self, py: Python<'_>, id: String) -> PyResult<bool> {
        py.detach(|| self.inner.claim(&id)).map_err(graph_err)
    }

    /// Every checkpoint of `workflow`: a tuple as `get` gives, or the text
    /// of why it cannot be read.
    fn list(&self, py: Python<'_>, workflow: String) -> PyResult<Vec<Py<PyAny>>> {
        let found = py
            .detach(|| self.inner.list(&workflow))
            .map_err(graph_err)?;
        found
            .into_iter()
            .map(|r| match r {
                Ok(s) => Ok(stored_tuple(s).into_pyobject(py)?.into_any().unbind()),
                Err(e) => Ok(e.to_string().into_pyobject(py)?.into_any().unbind()),
            })
            .collect()
    }

    /// Deletes checkpoint `id`; False when there is none.
    fn delete(&self, py: Python<'_>, id: String) -> PyResult<bool> {
        py.detach(|| self.inner.delete(&id)).map_err(graph_err)
    }

    /// Gives up this store's lease on the chain of checkpoint `id`.
    fn release(&self, py: Python<'_>, id: String) -> PyResult<()> {
        py.detach(|| self.inner.release(&id)).map_err(graph_err)
    }

    /// Gives up every chain this store holds.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.close()).map_err(graph_err)
    }
}
