//! What the graph store's calls fail with (shared by the store and its
//! blob layer, so that neither imports the other for it).

use steadfast::{StoreError, StoreErrorKind};

/// What a graph store call can fail with; each names what and where.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// Another live saver holds the thread (or wrote it after this saver's
    /// lease ran out): nothing was written.
    #[error("{0}")]
    Held(String),
    /// An argument that cannot be used: nothing was written.
    #[error("{0}")]
    InvalidInput(String),
    /// Something this store cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The store failed, with the portable kind of its error.
    #[error("{message}")]
    Store {
        /// The kind (conflict, corrupt, unavailable, ...).
        kind: StoreErrorKind,
        /// What went wrong, with its causes.
        message: String,
    },
}

/// The result of a graph store call.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

/// A store error as a [`GraphError`], its kind kept.
pub(crate) fn store_err(e: &StoreError) -> GraphError {
    GraphError::Store {
        kind: e.kind(),
        message: steadfast::error_chain(e),
    }
}
