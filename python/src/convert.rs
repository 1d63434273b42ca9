//! JSON values between Python and Rust, checked on the way in: what cannot be
//! stored and read back unchanged is refused with the path where it sits.
//!
//! `bytes` are stored as `{"$py": "bytes", "base64": "…"}` (standard
//! alphabet, padded), and a dict of the caller's that has a `"$py"` key as
//! `{"$py": "dict", "items": {…}}`, so that both read back as they were
//! given. Other languages see those objects as they are stored.

use base64::Engine as _;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// The key that marks a value this module encodes.
pub(crate) const MARK: &str = "$py";

/// How deep a Python value may nest before it is refused: the stores' own
/// limit, so that the walk stays shallow on any thread's stack.
const MAX_DEPTH: usize = steadfast::MAX_VALUE_DEPTH;

/// A value that cannot be stored: where it sits (`$.a[2]`) and why.
#[derive(Debug)]
pub struct Unstorable {
    /// The path from the top, `$` for the value itself.
    pub path: String,
    /// What is wrong there.
    pub reason: String,
}

impl std::fmt::Display for Unstorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {}: {}", shorten(&self.path), self.reason)
    }
}

/// A path short enough for a message: a very deep one keeps its start and
/// its end.
pub fn shorten(path: &str) -> String {
    const KEEP: usize = 80;
    let chars: Vec<char> = path.chars().collect();
    if chars.len() <= 2 * KEEP {
        return path.to_string();
    }
    let head: String = chars[..KEEP].iter().collect();
    let tail: String = chars[chars.len() - KEEP..].iter().collect();
    format!("{head}…{tail}")
}

/// Converts a Python value (None, bool, int, float, str, bytes, list, tuple,
/// dict with str keys) to JSON. An error names the path (`$.a[2]`) and what
/// is wrong: another type, a non-string key, a NaN or infinite float, an int
/// beyond 64 bits. Tuples become lists; bytes and dicts with a `"$py"` key
/// are marked (see the module).
pub fn to_json(v: &Bound<'_, PyAny>) -> Result<Value, Unstorable> {
    let mut path = String::from("$");
    walk(v, &mut path, 0).map_err(|reason| {
        // The walk puts the path in front of its reasons; split it off.
        let prefix = format!("at {path}: ");
        match reason.strip_prefix("at ").and_then(|r| r.split_once(": ")) {
            Some((p, why)) => Unstorable {
                path: p.to_string(),
                reason: why.to_string(),
            },
            None => Unstorable {
                path: path.clone(),
                reason: reason.strip_prefix(&prefix).unwrap_or(&reason).to_string(),
            },
        }
    })
}

fn walk(v: &Bound<'_, PyAny>, path: &mut String, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("at {path}: nested deeper than {MAX_DEPTH} levels"));
    }
    if v.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if v.is_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = v.extract::<u64>() {
            return Ok(Value::from(u));
        }
        return Err(format!("at {path}: the int {v} does not fit in 64 bits"));
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        let x = f.value();
        return Number::from_f64(x).map(Value::Number).ok_or_else(|| {
            format!("at {path}: {x} is not a finite number; JSON has no NaN or infinity")
        });
    }
    if let Ok(s) = v.cast::<PyString>() {
        return s
            .extract::<String>()
            .map(Value::String)
            .map_err(|e| format!("at {path}: the string is not valid Unicode text: {e}"));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        let mut m = Map::new();
        m.insert(MARK.into(), Value::from("bytes"));
        let text = base64::engine::general_purpose::STANDARD.encode(b.as_bytes());
        m.insert("base64".into(), Value::String(text));
        return Ok(Value::Object(m));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, item) in d.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(format!(
                    "at {path}: the key {} is {}, not a str; JSON keys are strings",
                    k.repr().map(|r| r.to_string()).unwrap_or_default(),
                    type_name(&k)
                ));
            };
            let key = key
                .extract::<String>()
                .map_err(|e| format!("at {path}: a key is not valid Unicode text: {e}"))?;
            let len = path.len();
            path.push('.');
            path.push_str(&key);
            let value = walk(&item, path, depth + 1)?;
            path.truncate(len);
            map.insert(key, value);
        }
        if map.contains_key(MARK) {
            // The caller's own key: kept apart from the marks.
            let mut wrapped = Map::new();
            wrapped.insert(MARK.into(), Value::from("dict"));
            wrapped.insert("items".into(), Value::Object(map));
            return Ok(Value::Object(wrapped));
        }
        return Ok(Value::Object(map));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (i, item) in v.try_iter().map_err(|e| e.to_string())?.enumerate() {
            let item = item.map_err(|e| e.to_string())?;
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            items.push(walk(&item, path, depth + 1)?);
            path.truncate(len);
        }
        return Ok(Value::Array(items));
    }
    Err(format!(
        "at {path}: {} is not a JSON value (use None, bool, int, float, str, bytes, list or dict)",
        type_name(v)
    ))
}

/// "an int", "a set": the value's type with its article.
fn type_name(v: &Bound<'_, PyAny>) -> String {
    let name = v
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "value".into());
    let vowel = name
        .chars()
        .next()
        .is_some_and(|c| "aeiouAEIOU".contains(c));
    format!("{} {name}", if vowel { "an" } else { "a" })
}

/// What a stored object marked with `"$py"` stands for, if it is one of
/// the two shapes this module writes.
enum Marked<'a> {
    Bytes(&'a str),
    Dict(&'a Map<String, Value>),
}

fn marked(map: &Map<String, Value>) -> Option<Marked<'_>> {
    if map.len() != 2 {
        return None;
    }
    match map.get(MARK)?.as_str()? {
        "bytes" => map.get("base64")?.as_str().map(Marked::Bytes),
        "dict" => map.get("items")?.as_object().map(Marked::Dict),
        _ => None,
    }
}

/// Converts JSON to Python: objects become dicts, arrays lists, and the
/// marked objects this module writes bytes and dicts again. An object
/// marked otherwise (written by another program) stays a dict.
pub fn to_py(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else {
                n.as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let map = match marked(map) {
                Some(Marked::Bytes(text)) => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(text)
                        .map_err(|e| {
                            pyo3::exceptions::PyValueError::new_err(format!(
                                "a stored bytes value is not base64: {e}"
                            ))
                        })?;
                    return Ok(PyBytes::new(py, &bytes).into_any().unbind());
                }
                Some(Marked::Dict(items)) => items,
                None => map,
            };
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, to_py(py, item)?)?;
            }
            dict.into_any().unbind()
        }
    })
}

/// Converts a serializable Rust value (a checkpoint, a summary) to Python.
pub fn serde_to_py<T: serde::Serialize>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    let json = serde_json::to_value(v)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    to_py(py, &json)
}
