//! A store wrapper that misbehaves from a chosen save on, for crash tests at the
//! store boundary.

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use steadfast_core::store::SaveRequest;
use steadfast_core::{
    Capabilities, Checkpoint, ListFilter, RunSummary, Store, StoreError, StoreErrorKind,
};

/// What [`FaultyStore`] does to the save it is armed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The save and every later one fail without taking effect, as if the
    /// process had died just before writing.
    FailFromHere,
    /// This one save takes effect but reports an error whose outcome is unknown
    /// (a lost reply); later saves behave.
    LandButReportUnknown,
    /// This one save fails without taking effect but reports an outcome that is
    /// unknown; later saves behave.
    LoseButReportUnknown,
    /// The save and every later one never answer, as through a network
    /// partition that drops packets; loads still answer.
    HangFromHere,
    /// The save and every later one wait this long before they are made,
    /// as on a slow but healthy store.
    SlowFromHere(std::time::Duration),
}

/// Wraps a store and applies a [`Fault`] at save number `at` (0-based).
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    at: usize,
    fault: Fault,
    saves: AtomicUsize,
}

impl<S: Store> FaultyStore<S> {
    /// Arms `fault` for save number `at`.
    pub fn new(inner: S, at: usize, fault: Fault) -> Self {
        FaultyStore {
            inner,
            at,
            fault,
            saves: AtomicUsize::new(0),
        }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many saves were attempted through this wrapper.
    pub fn saves_attempted(&self) -> usize {
        self.saves.load(Ordering::SeqCst)
    }
}

fn injected(kind: StoreErrorKind, what: &str) -> StoreError {
    StoreError::backend(kind, format!("injected fault: {what}"))
}

#[async_trait]
impl<S: Store> Store for FaultyStore<S> {
    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load(run_id).await
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let n = self.saves.fetch_add(1, Ordering::SeqCst);
        let unknown = |source| StoreError::OutcomeUnknown {
            run_id: req.checkpoint.run_id.clone(),
            source: Box::new(source),
        };
        match self.fault {
            Fault::FailFromHere if n >= self.at => {
                Err(injected(StoreErrorKind::Unavailable, "save refused"))
            }
            Fault::LandButReportUnknown if n == self.at => {
                self.inner.save(req).await?;
                Err(unknown(injected(
                    StoreErrorKind::Unavailable,
                    "reply lost after the save landed",
                )))
            }
            Fault::LoseButReportUnknown if n == self.at => {
                Err(unknown(injected(StoreErrorKind::Unavailable, "save lost")))
            }
            Fault::HangFromHere if n >= self.at => std::future::pending().await,
            Fault::SlowFromHere(wait) if n >= self.at => {
                tokio::time::sleep(wait).await;
                self.inner.save(req).await
            }
            _ => self.inner.save(req).await,
        }
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.inner.list(filter).await
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        self.inner.delete(run_id).await
    }
    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        self.inner.delete_if(run_id, version).await
    }
    /// The wrapped store's capabilities, all of them: faults are injected
    /// into saves only.
    fn capabilities(&self) -> Capabilities<'_> {
        self.inner.capabilities()
    }
}
