//! The run's state (a JSON object), step updates, and the check that a value
//! will load back after it is saved.

use serde_json::{Map, Value};

/// A run's state: a JSON object. Each step's [`Update`] is merged into it key by key.
pub type State = Map<String, Value>;

/// What a step returns: a JSON object whose top-level keys overwrite the state's.
pub type Update = Map<String, Value>;

/// The deepest nesting accepted inside a state value (an object or array counts as
/// one level). JSON parsers stop at some depth (serde_json at 128); stores wrap the
/// state in a few levels of their own, so the limit leaves room for them.
pub const MAX_VALUE_DEPTH: usize = 100;

/// The key under which a completed step's update records what the step ran
/// as ([`StepVersion`](crate::StepVersion): `{"fingerprint": …, "fields":
/// {…}}`). It is the step's record only: [`merge`] never puts it in the
/// run's state, and a step cannot set it.
pub const STEP_KEY: &str = "__step";

/// Merges `update` into `state`: each top-level key of the update overwrites the same key.
/// The step's own record ([`STEP_KEY`](crate::STEP_KEY), what the step ran
/// as) stays in the update and never reaches the state.
///
/// ```
/// use serde_json::json;
/// let mut state = json!({"a": 1, "b": 2}).as_object().unwrap().clone();
/// let update = json!({"b": 3, "c": 4, "__step": {}}).as_object().unwrap().clone();
/// steadfast_core::merge(&mut state, update);
/// assert_eq!(serde_json::Value::Object(state), json!({"a": 1, "b": 3, "c": 4}));
/// ```
pub fn merge(state: &mut State, update: Update) {
    for (k, v) in update {
        if k != STEP_KEY {
            state.insert(k, v);
        }
    }
}

/// [`merge`] of a borrowed update.
pub fn merge_ref(state: &mut State, update: &Update) {
    for (k, v) in update {
        if k != STEP_KEY {
            state.insert(k.clone(), v.clone());
        }
    }
}

/// Why a value cannot be stored, and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueProblem {
    /// The key path to the offending value, like `report.items[3]`.
    pub path: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Checks that every value in `update` survives a save and a load: nesting within
/// [`MAX_VALUE_DEPTH`], every number finite, and no object (the update's own
/// included) whose first member is named `$serde_json::private::RawValue`,
/// which serde_json reads as a marker.
///
/// `serde_json::Value` cannot hold NaN or infinities (they turn into `null` on the
/// way in), so the typed façade checks for those separately by reading the state
/// back into its type.
pub fn check_update(update: &Update) -> Result<(), ValueProblem> {
    // Its own object too: a state is written inside the records, exports
    // and `show --json` that readers take apart as one value.
    if let Some(first) = update.keys().next().filter(|k| *k == SERDE_MARKER) {
        return Err(marker(&[PathPart::Key(first)]));
    }
    check_entries(update.iter().map(|(k, v)| (k.as_str(), v)))
}

/// [`check_update`] over top-level entries that need not be in a map.
pub(crate) fn check_entries<'a>(
    entries: impl Iterator<Item = (&'a str, &'a Value)>,
) -> Result<(), ValueProblem> {
    for (k, v) in entries {
        check_value(PathPart::Key(k), v)?;
    }
    Ok(())
}

/// The children of a container being walked.
enum Children<'a> {
    Object(serde_json::map::Iter<'a>),
    Array(std::iter::Enumerate<std::slice::Iter<'a, Value>>),
}

impl<'a> Children<'a> {
    fn next(&mut self) -> Option<(PathPart<'a>, &'a Value)> {
        match self {
            Children::Object(it) => it.next().map(|(k, v)| (PathPart::Key(k), v)),
            Children::Array(it) => it.next().map(|(i, v)| (PathPart::Index(i), v)),
        }
    }
}

/// Walks one value depth first with an explicit stack (a hostile value must
/// not overflow ours) that holds one path, so memory grows with the depth, not
/// with the number of values.
fn check_value<'a>(part: PathPart<'a>, value: &'a Value) -> Result<(), ValueProblem> {
    let mut path = vec![part];
    let mut open: Vec<Children<'a>> = Vec::new();
    let mut next = Some(value);
    loop {
        if let Some(value) = next.take() {
            match value {
                Value::Object(map) if !map.is_empty() => {
                    if path.len() >= MAX_VALUE_DEPTH {
                        return Err(too_deep(&path));
                    }
                    if let Some(first) = map.keys().next().filter(|k| *k == SERDE_MARKER) {
                        path.push(PathPart::Key(first));
                        return Err(marker(&path));
                    }
                    open.push(Children::Object(map.iter()));
                }
                Value::Array(items) if !items.is_empty() => {
                    if path.len() >= MAX_VALUE_DEPTH {
                        return Err(too_deep(&path));
                    }
                    open.push(Children::Array(items.iter().enumerate()));
                }
                Value::Number(n) if n.as_f64().is_some_and(|f| !f.is_finite()) => {
                    return Err(ValueProblem {
                        path: render_path(&path),
                        reason: "the number is not finite".into(),
                    });
                }
                _ => {
                    path.pop();
                }
            }
        }
        let Some(top) = open.last_mut() else {
            return Ok(());
        };
        match top.next() {
            Some((part, child)) => {
                path.push(part);
                next = Some(child);
            }
            None => {
                open.pop();
                path.pop();
            }
        }
    }
}

/// The member name serde_json's reader of a `Value` takes as a marker: an
/// object whose first member (in the order written, which is the map's)
/// has it is read as the JSON text that member holds, so it would not load
/// back as saved. A member that is not first is an ordinary name, so values
/// stored with one are taken again.
const SERDE_MARKER: &str = "$serde_json::private::RawValue";

fn marker(path: &[PathPart<'_>]) -> ValueProblem {
    ValueProblem {
        path: render_path(path),
        reason: format!(
            "an object whose first member is named `{SERDE_MARKER}` would not load back (serde_json reads an object that starts with that name as a marker)"
        ),
    }
}

fn too_deep(path: &[PathPart<'_>]) -> ValueProblem {
    ValueProblem {
        path: render_path(path),
        reason: format!("nesting deeper than {MAX_VALUE_DEPTH} levels would not load back"),
    }
}

#[derive(Clone, Copy)]
enum PathPart<'a> {
    Key(&'a str),
    Index(usize),
}

fn render_path(path: &[PathPart<'_>]) -> String {
    let mut out = String::new();
    for part in path {
        match part {
            PathPart::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            PathPart::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

/// What kind of JSON value `v` is, for an error: `"a string"`, `"null"`.
pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nest(depth: usize) -> Value {
        let mut v = json!(1);
        for _ in 0..depth {
            v = json!([v]);
        }
        v
    }

    fn update(v: Value) -> Update {
        let mut m = Map::new();
        m.insert("k".into(), v);
        m
    }

    #[test]
    fn depth_at_the_limit_is_accepted_and_beyond_is_named() {
        assert!(check_update(&update(nest(MAX_VALUE_DEPTH - 1))).is_ok());
        let err = check_update(&update(nest(MAX_VALUE_DEPTH))).unwrap_err();
        assert!(err.path.starts_with("k[0][0]"), "{}", err.path);
        assert!(err.reason.contains("nesting"));
    }

    #[test]
    fn accepted_depth_parses_back_inside_store_envelopes() -> Result<(), serde_json::Error> {
        // Four envelope levels: file, runs map, checkpoint, state.
        let v = json!({"runs": {"r": {"state": update(nest(MAX_VALUE_DEPTH - 1))}}});
        let text = serde_json::to_string(&v)?;
        let back: Value = serde_json::from_str(&text)?;
        assert_eq!(back, v);
        Ok(())
    }

    #[test]
    fn wide_values_are_walked_whole_and_problems_named_by_path() {
        let wide = json!({"a": [vec![0; 64], {"b": vec![1; 100_000]}, nest(96)]});
        assert!(check_update(&update(wide)).is_ok());
        let err = check_update(&update(json!([1, {"x": [2, nest(MAX_VALUE_DEPTH)]}]))).unwrap_err();
        assert!(err.path.starts_with("k[1].x[1]"), "{}", err.path);
    }

    /// serde_json reads an object whose first member has the marker's name
    /// as the text that member holds: saved, it would load back as another
    /// value, or not at all. Refused there, with its path, a state's own
    /// object included; where it loads back (a member not first) it is
    /// taken, so nothing stored that loaded back is refused when saved again.
    #[test]
    fn the_serde_marker_name_is_refused_where_it_would_not_load_back() {
        let inner = json!({"a": [{ SERDE_MARKER: "{\"n\": 1}" }]});
        let text = serde_json::to_string(&inner).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_ne!(back, inner, "serde_json reads the marker as a marker");
        let err = check_update(&update(inner)).unwrap_err();
        assert_eq!(err.path, format!("k.a[0].{SERDE_MARKER}"));
        assert!(err.reason.contains("would not load back"), "{}", err.reason);
        assert!(check_update(&update(json!({ SERDE_MARKER: 1 }))).is_err());
        let mut top = Map::new();
        top.insert(SERDE_MARKER.into(), json!("1"));
        assert_eq!(check_update(&top).unwrap_err().path, SERDE_MARKER);
        // Where it loads back as saved, inside another value too: taken.
        top.insert("!".into(), json!(0));
        top.insert("z".into(), json!({"!": 1, SERDE_MARKER: 2}));
        let text = serde_json::to_string(&json!({ "state": top })).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({ "state": top })
        );
        assert!(check_update(&top).is_ok());
        assert!(check_update(&update(json!({"$serde_json::private::RawValu": 1}))).is_ok());
    }

    #[test]
    fn paths_name_keys_and_indexes() {
        let v = json!({"items": [{"x": nest(MAX_VALUE_DEPTH)}]});
        let err = check_update(&update(v)).unwrap_err();
        assert!(err.path.starts_with("k.items[0].x"), "{}", err.path);
    }
}
