//! Charging spend to a run's record and the budget check: reports saved
//! as they come, what is left charged with the attempt's end, and a run
//! past a budget stopped at its `budget` gate before its next step.

use crate::engine::session::Session;
use crate::engine::spend::{Report, SpendLine};
use crate::engine::{store_error, Runner};
use crate::record::checkpoint::{Checkpoint, OnTimeout, RunStatus, Wait};
use crate::record::error::Error;
use crate::record::outcome::Suspension;
use crate::record::spend::{amounts_of, Spend, BUDGET_GATE};
use crate::store::Store;
use std::collections::BTreeMap;

/// Saves one report in the run's head: the run's spend grows by its
/// amounts (the attempt's too), or, when the store refuses, nothing is
/// charged now and the amounts wait for the attempt's checkpoint.
pub(crate) async fn serve<S: Store + ?Sized>(
    r: &Runner<'_, S>,
    session: &tokio::sync::Mutex<Session>,
    line: &SpendLine,
    report: Report,
) {
    let mut s = session.lock().await;
    if s.expected.is_none() {
        // The run has no record yet (its first step, run without a lease):
        // there is nothing a crash would keep, and its first checkpoint
        // charges the report.
        line.charge_later(&report.amounts);
        let _ = report.done.send(Ok(()));
        return;
    }
    let before = s.cp.spend.clone();
    let charged =
        s.cp.spend
            .get_or_insert_with(Spend::default)
            .charge(&report.amounts);
    let result = match charged {
        Err(reason) => {
            s.cp.spend = before;
            Err(Error::InvalidInput {
                what: format!("spend reported by a step of run {:?}", s.cp.run_id),
                reason: format!("{reason}; nothing was charged"),
            })
        }
        Ok(()) => match s.save_head(r).await {
            Ok(()) => {
                crate::engine::metrics::spent(&s.cp.workflow, &report.amounts);
                let mut t = line.tally();
                for (k, v) in &report.amounts {
                    *t.saved.entry(k.clone()).or_insert(0.0) += v;
                }
                Ok(())
            }
            Err(e) => {
                s.cp.spend = before;
                line.charge_later(&report.amounts);
                Err(store_error(&s.cp.run_id, "save of a step's spend", e))
            }
        },
    };
    let _ = report.done.send(result);
}

/// Charges the attempt's unsaved spend to the run's record before the save
/// that ends the attempt, and returns what to put back if that save fails
/// (the record's spend before, and the amounts taken), plus the attempt's
/// whole spend for its step record. A charge out of range is left out
/// (logged): the step's result is not lost for its bookkeeping.
pub(crate) fn charge_ending(
    cp: &mut Checkpoint,
    line: &SpendLine,
) -> (Option<Spend>, BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let before = cp.spend.clone();
    let (unsaved, whole) = line.take_unsaved();
    if !unsaved.is_empty() {
        if let Err(reason) = cp.spend.get_or_insert_with(Spend::default).charge(&unsaved) {
            tracing::warn!(run_id = %cp.run_id, %reason, "a step's spend could not be charged");
            cp.spend = before.clone();
            return (before, BTreeMap::new(), whole);
        }
    }
    (before, unsaved, whole)
}

impl Session {
    /// Before a step goes live: a run over a budget stops at its `budget`
    /// gate (saved, the lease released); a run whose budget wait was
    /// approved takes the granted amounts and goes on. `None`: go on.
    pub(crate) async fn budget_stop<S: Store + ?Sized>(
        &mut self,
        r: &Runner<'_, S>,
    ) -> Result<Option<Suspension>, Error> {
        let now = r.clock.now();
        if let Some(Wait::Gate { step, since, .. }) = &self.cp.wait {
            if step == BUDGET_GATE {
                let since = *since;
                let decision = self
                    .cp
                    .decisions
                    .iter()
                    .rev()
                    .find(|d| d.gate == BUDGET_GATE && d.waited_since == Some(since))
                    .cloned();
                let Some(d) = decision else {
                    return Ok(Some(Suspension::Waiting {
                        gate: BUDGET_GATE.into(),
                    }));
                };
                if !d.approved {
                    // A rejection ends the run where it is recorded.
                    return Ok(Some(crate::record::outcome::rejected(&self.cp)));
                }
                let granted = d
                    .data
                    .as_ref()
                    .map(amounts_of)
                    .transpose()
                    .map_err(|reason| Error::InvalidInput {
                        what: format!("the approval of the budget of run {:?}", self.cp.run_id),
                        reason,
                    })?
                    .unwrap_or_default();
                let mut spend = self.cp.spend.clone().unwrap_or_default();
                spend
                    .grant(&granted)
                    .map_err(|reason| Error::InvalidInput {
                        what: format!("the approval of the budget of run {:?}", self.cp.run_id),
                        reason,
                    })?;
                self.cp.spend = Some(spend);
                self.cp.wait = None;
                self.cp.status = RunStatus::Running;
                self.cp.updated_at = now;
                self.save_head(r).await.map_err(|e| {
                    store_error(&self.cp.run_id, "save of the budget's approval", e)
                })?;
            }
        }
        let over = self.cp.spend.as_ref().map(Spend::over).unwrap_or_default();
        if over.is_empty() {
            return Ok(None);
        }
        tracing::info!(run_id = %self.cp.run_id, over = ?over, "the run is over its budget: it waits at the budget gate");
        // Decisions find their wait by its start: a new wait at the gate
        // starts after every earlier one, however fast the run came back.
        let since = self
            .cp
            .decisions
            .iter()
            .filter(|d| d.gate == BUDGET_GATE)
            .filter_map(|d| d.waited_since)
            .max()
            .map_or(now, |last| {
                now.max(last.saturating_add(std::time::Duration::from_millis(1)))
            });
        self.cp.wait = Some(Wait::Gate {
            step: BUDGET_GATE.into(),
            since,
            timeout_at: None,
            on_timeout: OnTimeout::Reject,
        });
        self.cp.status = RunStatus::Waiting;
        self.cp.lease = None;
        self.cp.updated_at = now;
        self.save_head(r)
            .await
            .map_err(|e| store_error(&self.cp.run_id, "save of the wait at the budget gate", e))?;
        Ok(Some(Suspension::Waiting {
            gate: BUDGET_GATE.into(),
        }))
    }
}
