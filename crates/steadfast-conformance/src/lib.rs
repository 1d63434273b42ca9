//! The definition of a Steadfast store, as tests.
//!
//! One macro call per backend expands every check as its own `#[test]`, each on a
//! store of its own made by the backend's factory:
//!
//! ```
//! use steadfast_conformance::{store_conformance, Config, TestStore};
//! use steadfast_core::MemoryStore;
//!
//! fn make(cfg: Config) -> TestStore {
//!     TestStore::new(MemoryStore::with_state_limit(cfg.state_limit))
//! }
//!
//! // In a test file, this expands one #[test] per check.
//! store_conformance!(make);
//! # fn main() {}
//! ```
//!
//! The factory may also be an `async fn`. A backend that cannot pass a check must
//! list it with its reason in its own documentation; checks are never skipped
//! silently.
//!
//! Every check of [`store_conformance!`] is required (among them the run
//! operations that need no history: cancel, retry, retention by
//! `Store::delete_if`). The checks of [`history_conformance!`] are the only
//! optional ones: they cover the `History` capability, whose absence answers
//! `Unsupported`, and the operations built on it (rewind, fork); a store
//! that keeps no history does not expand them and says why
//! in its docs.
//!
//! [`events_conformance!`] covers the `Events` capability (each run's event
//! log); a store that keeps no events does not expand it.
//!
//! A store that keeps large values as blobs gives the suite a way to lose
//! them behind its back ([`TestStore::with_blob_loss`]) and a blob threshold
//! of at most 1 MiB, so that its checks of cut saves and missing blobs can
//! reach its blobs.
//!
//! The crate also ships [`FaultyStore`], a wrapper that fails or loses writes
//! from the N-th save on, for crash tests at the store boundary.

mod blob_checks;
pub mod checks;
mod events_checks;
mod faulty;
pub mod fixtures;
pub use crate::blob_checks::Cut;
mod ops_checks;
mod replace_checks;

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use faulty::{Fault, FaultyStore};

/// Checks that `wrapped`, a store wrapped around `inner`, declares every
/// capability `inner` declares ([`Store::capabilities`]): a wrapper that
/// forgot one would make the stores it wraps answer `Unsupported` for
/// history, or fall back to slower scheduling and another clock.
///
/// ```
/// use std::sync::Arc;
/// use steadfast_conformance::{keeps_capabilities, FaultyStore, Fault};
/// use steadfast_core::MemoryStore;
///
/// let inner = Arc::new(MemoryStore::new());
/// let faulty = FaultyStore::new(Arc::clone(&inner), 0, Fault::LoseButReportUnknown);
/// assert!(keeps_capabilities(&*inner, &faulty).is_ok());
/// ```
pub fn keeps_capabilities(inner: &dyn Store, wrapped: &dyn Store) -> Result<(), String> {
    let (had, has) = (inner.capabilities().names(), wrapped.capabilities().names());
    let lost: Vec<&str> = had.iter().filter(|n| !has.contains(n)).copied().collect();
    if !lost.is_empty() {
        return Err(format!(
            "the wrapper lost {lost:?} of the wrapped store's capabilities {had:?} (it declares {has:?})"
        ));
    }
    // What it declares, it must not declare larger than the store below
    // takes: a wrapper that forgets a defaulted method promises the default.
    let (below, above) = (inner.capabilities(), wrapped.capabilities());
    if let (Some(b), Some(a)) = (below.max_state_bytes, above.max_state_bytes) {
        if a > b {
            return Err(format!(
                "the wrapper takes states of {a} bytes, more than the wrapped store's {b}"
            ));
        }
    }
    if let (Some(b), Some(a)) = (below.events, above.events) {
        let (b, a) = (b.append_bounds(), a.append_bounds());
        if a.0 > b.0 || a.1 > b.1 {
            return Err(format!(
                "the wrapper's appends take up to {} events and {} bytes, more than the wrapped store's {} and {}: it must pass append_bounds on",
                a.0, a.1, b.0, b.1
            ));
        }
    }
    Ok(())
}

/// A store that declares smaller appends than the one it wraps takes
/// ([`Events::append_bounds`](steadfast_core::Events::append_bounds)) and,
/// when asked ([`Bounded::leaving`]), leftovers it always finds, and
/// forwards everything else: the store below a wrapper under test, to
/// check with [`keeps_capabilities`] and [`keeps_blob_duties`] that the
/// wrapper passes its bounds and its look for leftovers on (as a Cosmos DB
/// store's would be).
#[derive(Debug)]
pub struct Bounded<S> {
    inner: S,
    bounds: (usize, u64),
    found: Option<steadfast_core::Leftovers>,
}

impl<S: Store> Bounded<S> {
    /// `inner`, declaring appends of at most `bounds` (events, bytes).
    pub fn new(inner: S, bounds: (usize, u64)) -> Self {
        Bounded {
            inner,
            bounds,
            found: None,
        }
    }

    /// The same store, whose look for leftovers
    /// ([`Blobs::collect_leftovers`](steadfast_core::Blobs::collect_leftovers))
    /// always finds `found` and removes nothing; `inner` must keep blobs.
    /// The store below a wrapper under [`keeps_blob_duties`].
    pub fn leaving(mut self, found: steadfast_core::Leftovers) -> Self {
        self.found = Some(found);
        self
    }

    fn blobs(&self) -> Result<&dyn steadfast_core::Blobs, steadfast_core::StoreError> {
        self.inner.capabilities().blobs.ok_or_else(|| {
            steadfast_core::StoreError::backend(
                steadfast_core::StoreErrorKind::Unsupported,
                "no blobs",
            )
        })
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for Bounded<S> {
    async fn load(
        &self,
        id: &str,
    ) -> Result<Option<steadfast_core::Checkpoint>, steadfast_core::StoreError> {
        self.inner.load(id).await
    }
    async fn save(
        &self,
        req: steadfast_core::store::SaveRequest<'_>,
    ) -> Result<u64, steadfast_core::StoreError> {
        self.inner.save(req).await
    }
    async fn list(
        &self,
        f: &steadfast_core::ListFilter,
    ) -> Result<Vec<steadfast_core::RunSummary>, steadfast_core::StoreError> {
        self.inner.list(f).await
    }
    async fn delete(&self, id: &str) -> Result<bool, steadfast_core::StoreError> {
        self.inner.delete(id).await
    }
    async fn delete_if(&self, id: &str, v: u64) -> Result<bool, steadfast_core::StoreError> {
        self.inner.delete_if(id, v).await
    }
    fn capabilities(&self) -> steadfast_core::Capabilities<'_> {
        let mut c = self.inner.capabilities();
        if c.events.is_some() {
            c.events = Some(self);
        }
        if c.blobs.is_some() && self.found.is_some() {
            c.blobs = Some(self);
        }
        c
    }
}

#[async_trait::async_trait]
impl<S: Store> steadfast_core::Blobs for Bounded<S> {
    async fn usage(
        &self,
        id: &str,
    ) -> Result<Option<steadfast_core::Usage>, steadfast_core::StoreError> {
        self.blobs()?.usage(id).await
    }
    async fn blob_totals(&self) -> Result<steadfast_core::BlobTotals, steadfast_core::StoreError> {
        self.blobs()?.blob_totals().await
    }
    fn threshold(&self) -> u64 {
        self.blobs().map_or(u64::MAX, |b| b.threshold())
    }
    fn shared_across_runs(&self) -> bool {
        self.blobs().is_ok_and(|b| b.shared_across_runs())
    }
    async fn collect_leftovers(
        &self,
        dry_run: bool,
    ) -> Result<steadfast_core::Leftovers, steadfast_core::StoreError> {
        match self.found {
            Some(found) => Ok(found),
            None => self.blobs()?.collect_leftovers(dry_run).await,
        }
    }
}

#[async_trait::async_trait]
impl<S: Store> steadfast_core::Events for Bounded<S> {
    async fn append_events(
        &self,
        id: &str,
        events: &[steadfast_core::NewEvent],
    ) -> Result<u64, steadfast_core::StoreError> {
        let log = self.inner.capabilities().events.ok_or_else(|| {
            steadfast_core::StoreError::backend(
                steadfast_core::StoreErrorKind::Unsupported,
                "no event log",
            )
        })?;
        log.append_events(id, events).await
    }
    async fn read_events(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<steadfast_core::RunEvent>, steadfast_core::StoreError> {
        let log = self.inner.capabilities().events.ok_or_else(|| {
            steadfast_core::StoreError::backend(
                steadfast_core::StoreErrorKind::Unsupported,
                "no event log",
            )
        })?;
        log.read_events(id, after, limit).await
    }
    fn append_bounds(&self) -> (usize, u64) {
        self.bounds
    }
}

/// Checks that `wrapped` passes on the duties of the [`Blobs`] capability
/// of `inner` that a wrapper implementing it itself could forget (its
/// defaulted methods): whether content is shared across runs, and what
/// [`Blobs::collect_leftovers`] finds (asked dry, so nothing is removed).
/// Make the store below a [`Bounded`] store [`leaving`](Bounded::leaving)
/// something, so that it finds what a forgetting wrapper would not.
///
/// [`Blobs`]: steadfast_core::Blobs
/// [`Blobs::collect_leftovers`]: steadfast_core::Blobs::collect_leftovers
pub async fn keeps_blob_duties(inner: &dyn Store, wrapped: &dyn Store) -> Result<(), String> {
    let (Some(below), Some(above)) = (inner.capabilities().blobs, wrapped.capabilities().blobs)
    else {
        return Ok(());
    };
    if below.shared_across_runs() != above.shared_across_runs() {
        return Err(format!(
            "the wrapper says content is shared across runs: {}, the wrapped store: {}",
            above.shared_across_runs(),
            below.shared_across_runs()
        ));
    }
    let b = below
        .collect_leftovers(true)
        .await
        .map_err(|e| e.to_string())?;
    let a = above
        .collect_leftovers(true)
        .await
        .map_err(|e| e.to_string())?;
    if a != b {
        return Err(format!(
            "the wrapper's collect_leftovers found {a:?} where the wrapped store's found {b:?}: it must pass it on"
        ));
    }
    Ok(())
}

use steadfast_core::Store;

/// Re-exported for the macro's expansion.
#[doc(hidden)]
pub use tokio as __tokio;

/// The state size limit every conformance store is built with: 64 KiB.
pub const STATE_LIMIT: u64 = 64 * 1024;

/// What a factory must honour when it builds a store for one check.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The largest serialized state the store must accept; larger ones must be
    /// refused with `StoreError::TooLarge`.
    pub state_limit: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_limit: STATE_LIMIT,
        }
    }
}

/// A store made for one check, plus whatever must live as long as it (a temp
/// directory, a schema to drop).
pub struct TestStore {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// Removes every blob the store holds, behind its back, and says how
    /// many it removed ([`TestStore::with_blob_loss`]).
    pub lose_blobs: Option<LoseBlobs>,
    _guard: Box<dyn Any + Send + Sync>,
}

/// What [`TestStore::with_blob_loss`] takes: a function that removes every
/// blob a store holds (as a disk or an operator might lose them) without
/// going through the store, and returns how many it removed.
pub type LoseBlobs =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Send + Sync>;

impl TestStore {
    /// A store that needs nothing else kept alive.
    pub fn new(store: impl Store + 'static) -> Self {
        TestStore {
            store: Arc::new(store),
            lose_blobs: None,
            _guard: Box::new(()),
        }
    }

    /// A store plus a guard dropped after the check.
    pub fn with_guard(store: impl Store + 'static, guard: impl Any + Send + Sync) -> Self {
        TestStore {
            store: Arc::new(store),
            lose_blobs: None,
            _guard: Box::new(guard),
        }
    }

    /// Gives the checks a way to lose the store's blobs behind its back:
    /// every store that keeps blobs ([`Capabilities::blobs`](steadfast_core::Capabilities))
    /// must give one, so that the suite can see a reference to a missing
    /// blob refused as damage.
    ///
    /// ```
    /// use steadfast_conformance::TestStore;
    /// use steadfast_core::MemoryStore;
    ///
    /// // A store without blobs has nothing to lose: a hook that finds none.
    /// let ts = TestStore::new(MemoryStore::new()).with_blob_loss(|| async { Ok(0) });
    /// assert!(ts.lose_blobs.is_some());
    /// ```
    pub fn with_blob_loss<F, Fut>(mut self, lose: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<u64, String>> + Send + 'static,
    {
        self.lose_blobs = Some(Arc::new(move || Box::pin(lose())));
        self
    }
}

/// The result of one check: `Err` carries what was violated.
pub type CheckResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// What a factory returns: a [`TestStore`], or a future of one.
pub trait IntoTestStore {
    /// The future that yields the store.
    fn into_future(self) -> impl Future<Output = TestStore>;
}

impl IntoTestStore for TestStore {
    async fn into_future(self) -> TestStore {
        self
    }
}

impl<F: Future<Output = TestStore>> IntoTestStore for F {
    async fn into_future(self) -> TestStore {
        self.await
    }
}

/// The runtime checks (and store tests) run on: multi-threaded, two workers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs the future `make` returns to completion on a thread and a runtime
/// of its own, and waits for it: for asynchronous clean-up (dropping a test's
/// schema or database) from a `Drop`, where the test's runtime may be gone
/// or busy. Returns `None` if the thread could not finish.
pub fn block_on_own_thread<F, Fut>(make: F) -> Option<Fut::Output>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
            .map(|rt| rt.block_on(make()))
    })
    .join()
    .ok()
    .flatten()
}

/// Runs one check on a fresh store from `make`, on a multi-threaded runtime.
/// Panics with the violation, so that it fails the `#[test]` that called it.
pub fn run_check<M, R, C, Fut>(name: &str, make: M, check: C)
where
    M: Fn(Config) -> R,
    R: IntoTestStore,
    C: FnOnce(TestStore) -> Fut,
    Fut: Future<Output = CheckResult>,
{
    runtime().block_on(async {
        let store = make(Config::default()).into_future().await;
        if let Err(e) = check(store).await {
            panic!("conformance check {name} failed: {e}");
        }
    });
}

/// Expands every conformance check as a `#[test]` for the store that `$make`
/// builds (a function or closure from [`Config`] to a [`TestStore`] or a future
/// of one).
#[macro_export]
macro_rules! store_conformance {
    ($make:expr) => {
        $crate::__checks!($make;
            absent_run_loads_as_none,
            odd_run_ids_are_kept_apart_and_load_back,
            first_save_writes_version_one_and_loads_back_equal,
            second_fresh_save_conflicts,
            stale_version_conflicts_and_leaves_record_unchanged,
            expected_version_on_absent_run_conflicts,
            each_save_increments_the_version_by_one,
            list_applies_every_filter_and_the_limit,
            list_cursor_pages_through_every_run_once,
            delete_removes_the_run_and_allows_a_fresh_start,
            interleaved_savers_keep_versions_gap_free,
            oversize_state_is_refused_and_prior_record_intact,
            accepted_values_load_back_equal,
            head_values_are_refused_or_load_back_equal,
            values_nested_far_too_deep_are_refused_not_overflowed,
            head_only_saves_keep_the_stored_state,
            spend_records_load_back_exactly,
            queue_places_load_back_and_list,
            workflow_versions_and_pass_over_marks_load_back,
            claims_follow_the_queue,
            documents_are_compare_and_swap,
            delete_if_is_guarded_by_the_version,
            retry_clears_a_failed_run,
            cancel_stops_a_run_at_the_next_boundary,
            gc_deletes_old_finished_runs_and_never_a_live_one,
            a_save_can_write_a_given_version,
            put_run_copies_a_run_exactly_and_never_overwrites_a_newer_one,
            a_refused_replacement_leaves_the_run_as_it_was,
            delete_and_replace_refuse_a_held_run,
            a_holder_is_told_its_run_was_deleted_or_replaced,
            a_half_built_run_is_left_alone_by_retention,
            wrappers_keep_every_capability,
            concurrent_starts_of_one_id_agree,
            large_values_and_lookalikes_load_back_equal,
            shared_large_values_survive_concurrent_saves_and_deletes,
            saves_cut_off_anywhere_leave_whole_runs,
            a_missing_blob_is_damage_and_never_a_value,
            large_decision_data_is_a_blob_kept_while_its_record_refers_to_it,
        );
    };
}

/// Expands the checks of [`History`](steadfast_core::History),
/// for stores that keep per-step history.
#[macro_export]
macro_rules! history_conformance {
    ($make:expr) => {
        $crate::__checks!($make;
            history_lists_completed_steps_in_order,
            history_is_none_for_an_absent_run,
            rewind_reruns_exactly_the_rewound_steps,
            fork_copies_the_first_steps_and_leaves_the_original,
            durable_functions_rewind_and_fork_by_step_name,
            a_relabelled_record_keeps_its_history_usable,
            a_half_built_fork_is_left_alone_by_retention_and_prune,
            step_definitions_are_recorded_and_never_reach_the_state,
        );
    };
}

/// The checks of [`History::rewrite`](steadfast_core::History::rewrite) (rewrites and folds)
/// (and `steadfast prune`, built on them), for stores that implement them.
#[macro_export]
macro_rules! history_rewrite_conformance {
    ($make:expr) => {
        $crate::__checks!($make;
            history_rewrite_is_guarded_by_the_version,
            prune_keeps_load_resume_rewind_and_fork_correct,
        );
    };
}

/// The checks of [`Events`](steadfast_core::Events) (each run's event log,
/// and the steps that emit into it), for stores that keep one.
#[macro_export]
macro_rules! events_conformance {
    ($make:expr) => {
        $crate::__checks!($make;
            events_are_numbered_per_run_and_read_back_equal,
            concurrent_appends_get_gap_free_numbers,
            bad_appends_are_refused_and_write_nothing,
            events_are_deleted_with_their_run,
            emitted_events_land_with_their_step,
            a_run_travels_with_its_events,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __checks {
    ($make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::run_check(stringify!($name), $make, $crate::checks::$name);
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use steadfast_core::store::SaveRequest;
    use steadfast_core::{Checkpoint, ListFilter, MemoryStore, RunSummary, StoreError};

    /// A wrapper that forwards the five methods and forgets the rest.
    struct Forgetful(MemoryStore);

    #[async_trait::async_trait]
    impl Store for Forgetful {
        async fn load(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
            self.0.load(id).await
        }
        async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
            self.0.save(req).await
        }
        async fn list(&self, f: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
            self.0.list(f).await
        }
        async fn delete(&self, id: &str) -> Result<bool, StoreError> {
            self.0.delete(id).await
        }
        async fn delete_if(&self, id: &str, v: u64) -> Result<bool, StoreError> {
            self.0.delete_if(id, v).await
        }
    }

    /// A wrapper that forwards the event log but not its bounds.
    struct Unbounded(Bounded<MemoryStore>);

    #[async_trait::async_trait]
    impl Store for Unbounded {
        async fn load(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
            self.0.load(id).await
        }
        async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
            self.0.save(req).await
        }
        async fn list(&self, f: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
            self.0.list(f).await
        }
        async fn delete(&self, id: &str) -> Result<bool, StoreError> {
            self.0.delete(id).await
        }
        async fn delete_if(&self, id: &str, v: u64) -> Result<bool, StoreError> {
            self.0.delete_if(id, v).await
        }
        fn capabilities(&self) -> steadfast_core::Capabilities<'_> {
            let mut c = self.0.capabilities();
            c.events = Some(self);
            c
        }
    }

    #[async_trait::async_trait]
    impl steadfast_core::Events for Unbounded {
        async fn append_events(
            &self,
            id: &str,
            events: &[steadfast_core::NewEvent],
        ) -> Result<u64, StoreError> {
            self.0.append_events(id, events).await
        }
        async fn read_events(
            &self,
            id: &str,
            after: u64,
            limit: usize,
        ) -> Result<Vec<steadfast_core::RunEvent>, StoreError> {
            self.0.read_events(id, after, limit).await
        }
    }

    /// The negative control for defaulted methods: a wrapper that forgets
    /// to pass the store's append bounds on is caught.
    #[test]
    fn a_wrapper_that_forgets_the_append_bounds_is_caught() {
        let inner = Bounded::new(MemoryStore::new(), (99, 800_000));
        let err = keeps_capabilities(
            &inner,
            &Unbounded(Bounded::new(MemoryStore::new(), (99, 800_000))),
        )
        .unwrap_err();
        assert!(err.contains("append_bounds"), "{err}");
    }

    /// The negative control: a wrapper that drops capabilities is caught.
    #[test]
    fn a_wrapper_that_forgets_a_capability_is_caught() {
        let inner = MemoryStore::new();
        let err = keeps_capabilities(&inner, &Forgetful(MemoryStore::new())).unwrap_err();
        assert!(
            err.contains("history") && err.contains("max_state_bytes"),
            "{err}"
        );
    }
}
