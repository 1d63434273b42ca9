//! What a run spent and what it may spend: amounts per name (`tokens`,
//! `usd`, ...) that steps report, and the budgets that stop a run at its
//! `budget` gate when they are exceeded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The name of the gate a run stops at when its spend exceeds a budget.
/// It is answered like any gate: `approve ID budget --data '{"usd": 10}'`
/// grants 10 more `usd`; `reject` ends the run.
pub const BUDGET_GATE: &str = "budget";

/// The state key under which a completed step's update records what that
/// attempt spent (`{"tokens": 1234}`). A flow step (or any listed step)
/// may report its spend by returning this key in its update.
pub const SPEND_KEY: &str = "__spend";

/// The most names one run's spend or budget may hold.
pub const MAX_SPEND_NAMES: usize = 32;

/// The largest amount a spend or a budget may reach, per name (10^15: a
/// thousand trillion tokens, exact as a whole number in a 64-bit float).
pub const MAX_SPEND_AMOUNT: f64 = 1e15;

/// What a run spent and its budgets, per name, kept in the run's record
/// (its head) and saved with the checkpoint of the step that spent, so a
/// step that is replayed is never charged twice.
///
/// ```
/// use steadfast_core::Spend;
/// let mut s = Spend::default();
/// s.budget.insert("usd".into(), 1.0);
/// s.charge(&[("usd".to_string(), 0.75)].into()).unwrap();
/// assert!(s.over().is_empty());
/// s.charge(&[("usd".to_string(), 0.5)].into()).unwrap();
/// assert_eq!(s.over(), vec!["usd".to_string()]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Spend {
    /// What the run's steps reported, summed per name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spent: BTreeMap<String, f64>,
    /// The most the run may spend, per name; names without a budget are
    /// only counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub budget: BTreeMap<String, f64>,
}

impl Spend {
    /// A record with these budgets and nothing spent.
    pub fn with_budget(budget: BTreeMap<String, f64>) -> Self {
        Spend {
            spent: BTreeMap::new(),
            budget,
        }
    }

    /// Whether nothing is spent and no budget set.
    pub fn is_empty(&self) -> bool {
        self.spent.is_empty() && self.budget.is_empty()
    }

    /// Adds `amounts` to what was spent. Refused, changing nothing, when a
    /// name or an amount is out of range or a sum would pass
    /// [`MAX_SPEND_AMOUNT`].
    pub fn charge(&mut self, amounts: &BTreeMap<String, f64>) -> Result<(), String> {
        let mut next = self.spent.clone();
        for (name, amount) in amounts {
            check_spend_name(name)?;
            check_amount(name, *amount)?;
            let sum = next.get(name).copied().unwrap_or(0.0) + amount;
            if sum > MAX_SPEND_AMOUNT {
                return Err(format!(
                    "{name:?} would reach {sum}, over the limit of {MAX_SPEND_AMOUNT}"
                ));
            }
            next.insert(name.clone(), sum);
        }
        if next.len() > MAX_SPEND_NAMES {
            return Err(format!(
                "a run spends at most {MAX_SPEND_NAMES} different names"
            ));
        }
        self.spent = next;
        Ok(())
    }

    /// The names whose spend exceeds their budget.
    pub fn over(&self) -> Vec<String> {
        self.budget
            .iter()
            .filter(|(name, limit)| self.spent.get(*name).copied().unwrap_or(0.0) > **limit)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Raises the budgets by `granted` (an approval of the `budget` gate);
    /// a budget still below what was spent is raised to it, so the run goes
    /// on and stops again when it spends more of that name.
    pub fn grant(&mut self, granted: &BTreeMap<String, f64>) -> Result<(), String> {
        let mut next = self.budget.clone();
        for (name, amount) in granted {
            check_spend_name(name)?;
            check_amount(name, *amount)?;
            let sum = next.get(name).copied().unwrap_or(0.0) + amount;
            next.insert(name.clone(), sum.min(MAX_SPEND_AMOUNT));
        }
        for (name, limit) in next.iter_mut() {
            if let Some(spent) = self.spent.get(name) {
                *limit = limit.max(*spent);
            }
        }
        if next.len() > MAX_SPEND_NAMES {
            return Err(format!(
                "a run has budgets for at most {MAX_SPEND_NAMES} names"
            ));
        }
        self.budget = next;
        Ok(())
    }

    /// Checks a record read back or about to be written: names and amounts
    /// in range.
    pub fn check(&self) -> Result<(), String> {
        for (what, map) in [("spent", &self.spent), ("budget", &self.budget)] {
            if map.len() > MAX_SPEND_NAMES {
                return Err(format!(
                    "{what} holds {} names, over {MAX_SPEND_NAMES}",
                    map.len()
                ));
            }
            for (name, amount) in map {
                check_spend_name(name).map_err(|r| format!("{what}: {r}"))?;
                check_amount(name, *amount).map_err(|r| format!("{what}: {r}"))?;
            }
        }
        Ok(())
    }
}

/// Checks the name of a spend or budget: 1 to 64 bytes of ASCII letters,
/// digits, `_`, `-` and `.`.
///
/// ```
/// use steadfast_core::check_spend_name;
/// assert!(check_spend_name("usd").is_ok());
/// assert!(check_spend_name("gpt-4o.tokens").is_ok());
/// assert!(check_spend_name("").is_err());
/// assert!(check_spend_name("a b").is_err());
/// ```
pub fn check_spend_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("the name {:?} must be 1 to 64 bytes", shown(name)));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "the name {:?} has {c:?}; use letters, digits, '_', '-' and '.'",
            shown(name)
        ));
    }
    Ok(())
}

/// A name as an error shows it: at most 40 characters.
fn shown(name: &str) -> String {
    name.chars().take(40).collect()
}

fn check_amount(name: &str, amount: f64) -> Result<(), String> {
    if !amount.is_finite() || !(0.0..=MAX_SPEND_AMOUNT).contains(&amount) {
        return Err(format!(
            "the amount {amount} for {name:?} is not a number from 0 to {MAX_SPEND_AMOUNT}"
        ));
    }
    Ok(())
}

/// Reads amounts from a JSON object (`{"tokens": 1234, "usd": 0.02}`), as
/// a flow step's `__spend`, an approval of the `budget` gate or a budget
/// option gives them. `null` is no amounts.
///
/// ```
/// use serde_json::json;
/// use steadfast_core::amounts_of;
/// let a = amounts_of(&json!({"usd": 0.5})).unwrap();
/// assert_eq!(a["usd"], 0.5);
/// assert!(amounts_of(&json!({"usd": -1})).is_err());
/// assert!(amounts_of(&json!({"usd": "1"})).is_err());
/// assert!(amounts_of(&json!([1])).is_err());
/// ```
pub fn amounts_of(value: &serde_json::Value) -> Result<BTreeMap<String, f64>, String> {
    let map = match value {
        serde_json::Value::Null => return Ok(BTreeMap::new()),
        serde_json::Value::Object(map) => map,
        other => {
            return Err(format!(
                "amounts are a JSON object of names and numbers, not {}",
                crate::record::state::json_kind(other)
            ))
        }
    };
    if map.len() > MAX_SPEND_NAMES {
        return Err(format!(
            "{} names, over the limit of {MAX_SPEND_NAMES}",
            map.len()
        ));
    }
    let mut out = BTreeMap::new();
    for (name, v) in map {
        check_spend_name(name)?;
        let amount = v.as_f64().ok_or_else(|| {
            format!(
                "the amount for {name:?} is {}, not a number",
                crate::record::state::json_kind(v)
            )
        })?;
        check_amount(name, amount)?;
        out.insert(name.clone(), amount);
    }
    Ok(out)
}

/// Reads amounts written `tokens=200000,usd=5`, as the command line gives
/// a budget.
///
/// ```
/// use steadfast_core::parse_amounts;
/// let b = parse_amounts("tokens=200000,usd=5").unwrap();
/// assert_eq!((b["tokens"], b["usd"]), (200000.0, 5.0));
/// assert!(parse_amounts("usd").is_err());
/// assert!(parse_amounts("usd=NaN").is_err());
/// ```
pub fn parse_amounts(text: &str) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, amount) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not NAME=AMOUNT"))?;
        let name = name.trim();
        check_spend_name(name)?;
        let amount: f64 = amount
            .trim()
            .parse()
            .map_err(|_| format!("the amount in {part:?} is not a number"))?;
        check_amount(name, amount)?;
        if out.insert(name.to_string(), amount).is_some() {
            return Err(format!("{name:?} is given twice"));
        }
    }
    if out.len() > MAX_SPEND_NAMES {
        return Err(format!(
            "{} names, over the limit of {MAX_SPEND_NAMES}",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_refused_charge_changes_nothing() {
        let mut s = Spend::default();
        s.charge(&m(&[("usd", 1.0)])).unwrap();
        assert!(s.charge(&m(&[("tokens", 5.0), ("usd", f64::NAN)])).is_err());
        assert!(s.charge(&m(&[("usd", MAX_SPEND_AMOUNT)])).is_err());
        assert!(s.charge(&m(&[("bad name", 1.0)])).is_err());
        assert_eq!(s.spent, m(&[("usd", 1.0)]));
        let many: BTreeMap<String, f64> = (0..=MAX_SPEND_NAMES)
            .map(|i| (format!("n{i}"), 1.0))
            .collect();
        assert!(s.charge(&many).is_err());
        assert_eq!(s.spent, m(&[("usd", 1.0)]));
    }

    #[test]
    fn a_grant_adds_and_never_leaves_a_budget_below_the_spend() {
        let mut s = Spend::with_budget(m(&[("usd", 5.0), ("tokens", 100.0)]));
        s.charge(&m(&[("usd", 5.5), ("tokens", 150.0)])).unwrap();
        assert_eq!(s.over(), vec!["tokens".to_string(), "usd".to_string()]);
        s.grant(&m(&[("usd", 10.0)])).unwrap();
        assert_eq!(s.budget, m(&[("usd", 15.0), ("tokens", 150.0)]));
        assert!(s.over().is_empty());
        s.charge(&m(&[("tokens", 1.0)])).unwrap();
        assert_eq!(s.over(), vec!["tokens".to_string()]);
        assert!(s.grant(&m(&[("usd", -1.0)])).is_err());
    }

    #[test]
    fn a_record_out_of_range_is_refused() {
        let mut s = Spend::default();
        s.spent.insert("usd".into(), f64::INFINITY);
        assert!(s.check().is_err());
        let mut s = Spend::default();
        s.budget.insert("".into(), 1.0);
        assert!(s.check().is_err());
    }

    #[test]
    fn amounts_are_read_strictly() {
        assert!(parse_amounts("usd=1,usd=2").is_err());
        assert!(parse_amounts("usd=-1").is_err());
        assert!(parse_amounts("usd=inf").is_err());
        assert!(parse_amounts("=1").is_err());
        assert_eq!(parse_amounts("").unwrap(), BTreeMap::new());
        assert!(amounts_of(&serde_json::json!({"usd": 1e300})).is_err());
        assert!(amounts_of(&serde_json::json!({"usd": null})).is_err());
    }
}
