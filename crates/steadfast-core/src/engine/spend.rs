//! Spend while a step runs: what an attempt reported, on its way to the
//! attempt loop, which saves it in the run's record at once (so an attempt
//! cut off by a crash is charged for what it reported); see
//! [`budget`](crate::engine::budget) for the saving and the budget check.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot};

use crate::record::error::Error;
use crate::record::spend::{amounts_of, SPEND_KEY};
use crate::record::state::Update;

/// One report of a step, on its way to the attempt loop.
pub(crate) struct Report {
    pub(crate) amounts: BTreeMap<String, f64>,
    pub(crate) done: oneshot::Sender<Result<(), Error>>,
}

/// What one attempt reported: saved already in the run's head, or still to
/// be charged with the attempt's checkpoint (or its failure's record).
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) saved: BTreeMap<String, f64>,
    pub(crate) unsaved: BTreeMap<String, f64>,
}

impl Tally {
    /// Everything the attempt spent.
    pub(crate) fn whole(&self) -> BTreeMap<String, f64> {
        let mut all = self.saved.clone();
        for (k, v) in &self.unsaved {
            *all.entry(k.clone()).or_insert(0.0) += v;
        }
        all
    }
}

/// An attempt's line to the loop that saves its spend.
pub(crate) struct SpendLine {
    pub(crate) tally: Mutex<Tally>,
    tx: mpsc::UnboundedSender<Report>,
}

impl SpendLine {
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<Report>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            SpendLine {
                tally: Mutex::new(Tally::default()),
                tx,
            },
            rx,
        )
    }

    pub(crate) fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `amounts` to be saved; the receiver says when they are.
    pub(crate) fn report(
        &self,
        amounts: BTreeMap<String, f64>,
    ) -> oneshot::Receiver<Result<(), Error>> {
        let (done, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError(report)) = self.tx.send(Report { amounts, done }) {
            // The attempt is over: what it reports now is charged with
            // nothing; say so.
            let _ = report.done.send(Err(Error::InvalidInput {
                what: "a spend report".into(),
                reason: "the step's attempt had already ended; nothing was charged".into(),
            }));
        }
        rx
    }

    /// Adds `amounts` to what the attempt's checkpoint charges (a listed
    /// step's `__spend`).
    pub(crate) fn charge_later(&self, amounts: &BTreeMap<String, f64>) {
        let mut t = self.tally();
        for (k, v) in amounts {
            *t.unsaved.entry(k.clone()).or_insert(0.0) += v;
        }
    }

    /// Takes what is still to be charged, and the whole attempt's spend.
    pub(crate) fn take_unsaved(&self) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
        let mut t = self.tally();
        let whole = t.whole();
        let unsaved = std::mem::take(&mut t.unsaved);
        for (k, v) in &unsaved {
            *t.saved.entry(k.clone()).or_insert(0.0) += v;
        }
        (unsaved, whole)
    }

    /// Puts back what [`take_unsaved`](Self::take_unsaved) took, when the save
    /// that was to charge it failed.
    pub(crate) fn put_back(&self, unsaved: BTreeMap<String, f64>) {
        let mut t = self.tally();
        for (k, v) in unsaved {
            if let Some(s) = t.saved.get_mut(&k) {
                *s -= v;
            }
            *t.unsaved.entry(k).or_insert(0.0) += v;
        }
    }
}

/// The record a completed attempt's update keeps of its spend.
pub(crate) fn record_in(
    update: &mut Update,
    index: usize,
    step: &str,
    whole: BTreeMap<String, f64>,
) {
    if whole.is_empty() {
        return;
    }
    update.insert(
        SPEND_KEY.into(),
        serde_json::json!({ "index": index, "step": step, "spent": whole }),
    );
}

/// A listed step's own `__spend` in its update: its report, unless it only
/// gives back the record the state holds (a step that echoes its state).
/// Returns the amounts, or why they cannot be taken.
pub(crate) fn reported(
    update: &mut Update,
    state_has: Option<&serde_json::Value>,
) -> Result<BTreeMap<String, f64>, String> {
    let Some(v) = update.remove(SPEND_KEY) else {
        return Ok(BTreeMap::new());
    };
    if state_has == Some(&v) {
        return Ok(BTreeMap::new());
    }
    amounts_of(&v).map_err(|r| format!("its `{SPEND_KEY}`: {r}"))
}
