//! Counters of this process's run loops, for a dashboard: steps executed,
//! re-executions after a crash, compare-and-swap conflicts, and a histogram
//! of save latency. Read them with [`snapshot`]; [`Metrics::prometheus`]
//! writes them in the Prometheus text format (`steadfast worker
//! --metrics-addr` serves that).
//!
//! ```
//! let m = steadfast_core::metrics::snapshot();
//! assert!(m.prometheus().contains("steadfast_steps_executed_total"));
//! ```

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// The upper bounds of the save-latency buckets, in milliseconds.
pub const SAVE_BUCKETS_MS: [u64; 12] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000];

struct Counters {
    steps_executed: AtomicU64,
    steps_completed: AtomicU64,
    steps_failed: AtomicU64,
    reexecutions: AtomicU64,
    conflicts: AtomicU64,
    claims_missed: AtomicU64,
    saves: AtomicU64,
    save_errors: AtomicU64,
    save_micros: AtomicU64,
    buckets: [AtomicU64; SAVE_BUCKETS_MS.len() + 1],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

static C: Counters = Counters {
    steps_executed: ZERO,
    steps_completed: ZERO,
    steps_failed: ZERO,
    reexecutions: ZERO,
    conflicts: ZERO,
    claims_missed: ZERO,
    saves: ZERO,
    save_errors: ZERO,
    save_micros: ZERO,
    buckets: [ZERO; SAVE_BUCKETS_MS.len() + 1],
};

/// The most (workflow, name) pairs of spend the counters keep; charges of
/// further pairs are counted under the workflow `other`.
pub const MAX_SPEND_SERIES: usize = 1000;

/// Spend charged by this process's run loops, per workflow and name.
static SPEND: Mutex<BTreeMap<(String, String), f64>> = Mutex::new(BTreeMap::new());

/// What the counters read at one moment. Counts only grow, from the start
/// of the process.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Metrics {
    /// Step attempts started (a retry counts again).
    pub steps_executed: u64,
    /// Steps whose result was saved.
    pub steps_completed: u64,
    /// Step attempts that failed.
    pub steps_failed: u64,
    /// Steps run again because the call that ran them before was cut off
    /// (a crash, a kill, a lease that ran out) before saving them.
    pub reexecutions: u64,
    /// Saves refused because another writer saved first.
    pub conflicts: u64,
    /// Claims of a run that another process made first (two looked at a
    /// free run at once): the call ran nothing. Its save is also counted
    /// in `conflicts`.
    pub claims_missed: u64,
    /// Checkpoint saves the run loop made (lease renewals included).
    pub saves: u64,
    /// Saves that failed (conflicts included).
    pub save_errors: u64,
    /// The time all saves took, in microseconds.
    pub save_micros: u64,
    /// Saves that took at most each bound of [`SAVE_BUCKETS_MS`] (not
    /// cumulative), then those that took longer.
    pub save_buckets: Vec<u64>,
    /// Spend charged to runs by this process, per (workflow, name): what
    /// steps reported with [`StepCtx::spend`](crate::StepCtx::spend) or in
    /// their updates, at most [`MAX_SPEND_SERIES`] pairs.
    pub spend: BTreeMap<(String, String), f64>,
}

/// The counters now.
pub fn snapshot() -> Metrics {
    Metrics {
        steps_executed: C.steps_executed.load(Relaxed),
        steps_completed: C.steps_completed.load(Relaxed),
        steps_failed: C.steps_failed.load(Relaxed),
        reexecutions: C.reexecutions.load(Relaxed),
        conflicts: C.conflicts.load(Relaxed),
        claims_missed: C.claims_missed.load(Relaxed),
        saves: C.saves.load(Relaxed),
        save_errors: C.save_errors.load(Relaxed),
        save_micros: C.save_micros.load(Relaxed),
        save_buckets: C.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        spend: SPEND.lock().unwrap_or_else(|p| p.into_inner()).clone(),
    }
}

impl Metrics {
    /// The counters in the Prometheus text exposition format.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        counter(
            "steadfast_steps_executed_total",
            "Step attempts started.",
            self.steps_executed,
        );
        counter(
            "steadfast_steps_completed_total",
            "Steps whose result was saved.",
            self.steps_completed,
        );
        counter(
            "steadfast_steps_failed_total",
            "Step attempts that failed.",
            self.steps_failed,
        );
        counter(
            "steadfast_reexecutions_total",
            "Steps run again after the call that ran them was cut off before saving.",
            self.reexecutions,
        );
        counter(
            "steadfast_conflicts_total",
            "Saves refused because another writer saved first.",
            self.conflicts,
        );
        counter(
            "steadfast_claims_missed_total",
            "Claims of a free run that another process made first; nothing ran.",
            self.claims_missed,
        );
        counter(
            "steadfast_save_errors_total",
            "Saves that failed.",
            self.save_errors,
        );
        let name = "steadfast_save_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Checkpoint save latency.\n# TYPE {name} histogram"
        );
        let mut cumulative = 0;
        for (i, bound) in SAVE_BUCKETS_MS.iter().enumerate() {
            cumulative += self.save_buckets.get(i).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\"}} {cumulative}",
                *bound as f64 / 1000.0
            );
        }
        cumulative += self.save_buckets.last().copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.save_micros as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.saves);
        if !self.spend.is_empty() {
            let name = "steadfast_spend_total";
            let _ = writeln!(
                out,
                "# HELP {name} Spend steps reported, charged to runs by this process.\n# TYPE {name} counter"
            );
            for ((workflow, what), v) in &self.spend {
                let _ = writeln!(
                    out,
                    "{name}{{workflow=\"{}\",name=\"{}\"}} {v}",
                    label(workflow),
                    label(what)
                );
            }
        }
        out
    }
}

/// A label value in the text format: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Books `amounts` charged to a run of `workflow`.
pub(crate) fn spent(workflow: &str, amounts: &BTreeMap<String, f64>) {
    let mut m = SPEND.lock().unwrap_or_else(|p| p.into_inner());
    for (what, v) in amounts {
        let mut key = (workflow.to_string(), what.clone());
        if !m.contains_key(&key) && m.len() >= MAX_SPEND_SERIES {
            key.0 = "other".into();
        }
        *m.entry(key).or_insert(0.0) += v;
    }
}

pub(crate) fn claim_missed() {
    C.claims_missed.fetch_add(1, Relaxed);
}

pub(crate) fn step_started() {
    C.steps_executed.fetch_add(1, Relaxed);
}

pub(crate) fn step_completed() {
    C.steps_completed.fetch_add(1, Relaxed);
}

pub(crate) fn step_failed() {
    C.steps_failed.fetch_add(1, Relaxed);
}

pub(crate) fn reexecution() {
    C.reexecutions.fetch_add(1, Relaxed);
}

/// Books one save that took `took`, and how it ended.
pub(crate) fn save(took: Duration, ok: bool, conflict: bool) {
    C.saves.fetch_add(1, Relaxed);
    if !ok {
        C.save_errors.fetch_add(1, Relaxed);
    }
    if conflict {
        C.conflicts.fetch_add(1, Relaxed);
    }
    let micros = took.as_micros().min(u64::MAX as u128) as u64;
    C.save_micros.fetch_add(micros, Relaxed);
    let ms = micros.div_ceil(1000);
    let i = SAVE_BUCKETS_MS
        .iter()
        .position(|b| ms <= *b)
        .unwrap_or(SAVE_BUCKETS_MS.len());
    C.buckets[i].fetch_add(1, Relaxed);
}
