//! What a completed step ran as: a fingerprint of its definition, kept in
//! the step's record so that a later resume can be checked against the code
//! given then ([`plan`](crate::ops::plan)).
//!
//! A definition is a few named fields: for a flow file's step its command,
//! environment, working directory, timeout and retry settings; for a Rust or
//! Python step the version its author declares. Texts that may say more
//! than a program should keep (a command line, an environment value) are
//! kept as a digest ([`StepVersion::digest`]); numbers and durations are
//! kept as they are, so a plan can say `timeout: 30s → 60s`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use sha2::Digest as _;

pub use crate::record::limits::check_version;
pub use crate::record::state::STEP_KEY;

pub use crate::record::limits::MAX_VERSION_BYTES;

/// The most fields one definition may have.
pub const MAX_FIELDS: usize = 32;

/// The longest a field's name may be, in bytes.
pub const MAX_FIELD_NAME_BYTES: usize = 64;

/// The most bytes one field's value may take as JSON: long texts are given
/// as a [`StepVersion::digest`].
pub const MAX_FIELD_BYTES: usize = 2048;

/// A step's definition, as fingerprinted: its fields and a SHA-256 over
/// them.
///
/// ```
/// use steadfast_core::StepVersion;
/// let v1 = StepVersion::declared("2").unwrap();
/// let v2 = StepVersion::declared("3").unwrap();
/// assert_ne!(v1.fingerprint(), v2.fingerprint());
/// let changes = v1.changes_to(&v2);
/// assert_eq!(changes[0].field, "version");
/// assert!(StepVersion::declared("").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepVersion {
    fields: BTreeMap<String, Value>,
    fingerprint: String,
}

/// One field that differs between a recorded definition and the one given
/// now (`None`: the field is absent on that side).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FieldChange {
    /// The field's name (`command`, `env.TOKEN`, `timeout`, `version`, …).
    pub field: String,
    /// What the record has.
    pub was: Option<Value>,
    /// What the definition given now has.
    pub now: Option<Value>,
}

impl StepVersion {
    /// A step whose author declares its version (`"2"`, `"2026-12-03"`):
    /// a text of 1 to [`MAX_VERSION_BYTES`] bytes without control
    /// characters.
    pub fn declared(version: &str) -> Result<Self, String> {
        check_version("a step's version", version)?;
        Self::of_fields(BTreeMap::from([(
            "version".to_string(),
            Value::String(version.to_string()),
        )]))
    }

    /// A definition of these fields: at most [`MAX_FIELDS`], each name 1 to
    /// [`MAX_FIELD_NAME_BYTES`] bytes, each value at most
    /// [`MAX_FIELD_BYTES`] as JSON with finite numbers only.
    pub fn of_fields(fields: BTreeMap<String, Value>) -> Result<Self, String> {
        if fields.len() > MAX_FIELDS {
            return Err(format!(
                "a step's definition has at most {MAX_FIELDS} fields, not {}",
                fields.len()
            ));
        }
        let mut canonical = Map::new();
        for (name, value) in &fields {
            if name.is_empty() || name.len() > MAX_FIELD_NAME_BYTES {
                return Err(format!(
                    "a definition's field name is 1 to {MAX_FIELD_NAME_BYTES} bytes, not {}",
                    name.len()
                ));
            }
            let value = sorted(value);
            let text = serde_json::to_string(&value).map_err(|e| e.to_string())?;
            if text.len() > MAX_FIELD_BYTES {
                return Err(format!(
                    "field {name:?} of a step's definition is {} bytes as JSON, over {MAX_FIELD_BYTES}: give a digest of it",
                    text.len()
                ));
            }
            let mut one = Map::new();
            one.insert("v".into(), value.clone());
            crate::record::state::check_update(&one)
                .map_err(|p| format!("field {name:?} of a step's definition: {}", p.reason))?;
            canonical.insert(name.clone(), value);
        }
        let fields: BTreeMap<String, Value> = canonical.into_iter().collect();
        let text = serde_json::to_string(&fields).map_err(|e| e.to_string())?;
        let fingerprint = hex(&sha2::Sha256::digest(text.as_bytes())[..16]);
        Ok(StepVersion {
            fields,
            fingerprint,
        })
    }

    /// A digest of `text` to keep in a field instead of the text:
    /// `sha256:` and the first 12 bytes of its SHA-256 in hex. It shows that
    /// a text changed without keeping it (a command line may carry a token).
    ///
    /// ```
    /// let d = steadfast_core::StepVersion::digest("echo hi");
    /// assert!(d.starts_with("sha256:") && d.len() == 7 + 24);
    /// ```
    pub fn digest(text: &str) -> String {
        format!(
            "sha256:{}",
            hex(&sha2::Sha256::digest(text.as_bytes())[..12])
        )
    }

    /// The fingerprint: the first 16 bytes of a SHA-256 over the fields
    /// (sorted, as JSON), in hex.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The fields.
    pub fn fields(&self) -> &BTreeMap<String, Value> {
        &self.fields
    }

    /// The value a step's record keeps under [`STEP_KEY`].
    pub fn to_value(&self) -> Value {
        serde_json::json!({
            "fingerprint": self.fingerprint,
            "fields": self.fields,
        })
    }

    /// Reads what [`to_value`](Self::to_value) wrote; `None` for anything
    /// else (a record that says nothing usable is taken to match).
    pub fn from_value(v: &Value) -> Option<Self> {
        let fingerprint = v.get("fingerprint")?.as_str()?.to_string();
        let fields = v
            .get("fields")?
            .as_object()?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(StepVersion {
            fields,
            fingerprint,
        })
    }

    /// The fields that differ between this (recorded) definition and
    /// `now`, by name; an object field (an environment) is compared key by
    /// key (`env.TOKEN`).
    pub fn changes_to(&self, now: &StepVersion) -> Vec<FieldChange> {
        let mut out = Vec::new();
        let names: std::collections::BTreeSet<&String> =
            self.fields.keys().chain(now.fields.keys()).collect();
        for name in names {
            let (was, is) = (self.fields.get(name), now.fields.get(name));
            if let (Some(Value::Object(a)), Some(Value::Object(b))) = (was, is) {
                let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for k in keys {
                    if a.get(k) != b.get(k) {
                        out.push(FieldChange {
                            field: format!("{name}.{k}"),
                            was: a.get(k).cloned(),
                            now: b.get(k).cloned(),
                        });
                    }
                }
            } else if was != is {
                out.push(FieldChange {
                    field: name.clone(),
                    was: was.cloned(),
                    now: is.cloned(),
                });
            }
        }
        out
    }
}

/// `v` with every object's keys in order, so that equal definitions give
/// equal text whatever order they were built in.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let ordered: BTreeMap<&String, Value> =
                map.iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn of(v: Value) -> StepVersion {
        StepVersion::of_fields(
            v.as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn the_fingerprint_ignores_key_order_and_sees_every_field() {
        let a = of(json!({"command": "sha256:aa", "env": {"A": "1", "B": "2"}, "timeout": "30s"}));
        let b = of(json!({"timeout": "30s", "env": {"B": "2", "A": "1"}, "command": "sha256:aa"}));
        assert_eq!(a.fingerprint(), b.fingerprint());
        let c = of(json!({"command": "sha256:aa", "env": {"A": "1", "B": "3"}, "timeout": "30s"}));
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_eq!(
            a.changes_to(&c),
            vec![FieldChange {
                field: "env.B".into(),
                was: Some(json!("2")),
                now: Some(json!("3")),
            }]
        );
        let d = of(json!({"command": "sha256:aa", "env": {"A": "1", "B": "2"}}));
        assert_eq!(a.changes_to(&d)[0].field, "timeout");
        assert_eq!(a.changes_to(&d)[0].now, None);
    }

    #[test]
    fn a_recorded_value_reads_back() {
        let a = of(json!({"retries": 2, "workdir": "sha256:bb"}));
        assert_eq!(StepVersion::from_value(&a.to_value()), Some(a));
        assert_eq!(StepVersion::from_value(&json!("v2")), None);
        assert_eq!(StepVersion::from_value(&json!({"fields": {}})), None);
    }

    #[test]
    fn bad_definitions_are_refused() {
        assert!(StepVersion::declared(&"x".repeat(MAX_VERSION_BYTES + 1)).is_err());
        assert!(StepVersion::declared("a\nb").is_err());
        assert!(StepVersion::declared(&"x".repeat(MAX_VERSION_BYTES)).is_ok());
        let many: BTreeMap<String, Value> = (0..=MAX_FIELDS)
            .map(|i| (format!("f{i}"), json!(i)))
            .collect();
        assert!(StepVersion::of_fields(many).is_err());
        let long = BTreeMap::from([("command".to_string(), json!("x".repeat(MAX_FIELD_BYTES)))]);
        assert!(StepVersion::of_fields(long).is_err());
        let unnamed = BTreeMap::from([(String::new(), json!(1))]);
        assert!(StepVersion::of_fields(unnamed).is_err());
        let deep = (0..200).fold(json!(1), |v, _| json!([v]));
        assert!(StepVersion::of_fields(BTreeMap::from([("d".to_string(), deep)])).is_err());
    }
}
