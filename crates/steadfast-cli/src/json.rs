//! JSON read exactly: every number as printed (or refused), and every
//! member name a name. For what a step prints and what the command is given
//! (`--data`, `--input`).

use serde_json::Value;

/// Parses JSON text and refuses a number that would not be kept exactly.
///
/// Every object is read as the members it has: serde_json's own reading of
/// a `Value` takes an object whose first member is named
/// `$serde_json::private::RawValue` as the JSON text that member holds,
/// which would let a value past these checks (the store then refuses that
/// name).
pub fn parse_json_exact(text: &str) -> Result<Value, String> {
    let Plain(value) = serde_json::from_str(text).map_err(|e| e.to_string())?;
    check_numbers(text)?;
    Ok(value)
}

/// A JSON value read member by member, with no names taken as markers.
struct Plain(Value);

impl<'de> serde::Deserialize<'de> for Plain {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PlainVisitor).map(Plain)
    }
}

struct PlainVisitor;

impl<'de> serde::de::Visitor<'de> for PlainVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        // As serde_json's own `Value` does.
        Ok(serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Plain(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = serde_json::Map::new();
        while let Some((k, Plain(v))) = map.next_entry::<String, Plain>()? {
            members.insert(k, v);
        }
        Ok(Value::Object(members))
    }
}

/// Checks every number literal of valid JSON `text`: each must come back
/// from a 64-bit integer or a double as the same number.
fn check_numbers(text: &str) -> Result<(), String> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                check_number(&text[start..i])?;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

fn check_number(literal: &str) -> Result<(), String> {
    let is_integer = !literal.contains(['.', 'e', 'E']);
    if is_integer {
        if literal.parse::<i64>().is_ok() || literal.parse::<u64>().is_ok() {
            return Ok(());
        }
        return Err(format!(
            "the integer {} does not fit in 64 bits and would be rounded; print it as a string",
            shorten(literal)
        ));
    }
    let parsed: f64 = literal
        .parse()
        .map_err(|_| format!("{} is not a number", shorten(literal)))?;
    // Kept exactly when the literal is a shortest decimal of the double it
    // names: no more digits than the double keeps. Where two such decimals
    // are equally near (1078178814758225.2 and .3 both name
    // 1078178814758225.25), printers choose differently, and either is taken.
    let shortest = decimal(&format!("{parsed:e}"));
    let kept = parsed.is_finite()
        && match (decimal(literal), shortest) {
            (None, None) => true,
            (Some(printed), Some(shortest)) => printed.1.len() <= shortest.1.len(),
            _ => false,
        };
    if kept {
        Ok(())
    } else {
        Err(format!(
            "the number {} has more digits than a double keeps and would be rounded to {parsed}; print it as a string",
            shorten(literal)
        ))
    }
}

fn shorten(literal: &str) -> String {
    if literal.len() > 40 {
        format!("{}...", &literal[..40])
    } else {
        literal.to_string()
    }
}

/// A decimal literal as (negative, significant digits, power of ten), with
/// zero as `None`, so that `1.50`, `15e-1` and `1.5` compare equal.
fn decimal(literal: &str) -> Option<(bool, String, i128)> {
    let (negative, rest) = match literal.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, literal),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, "0"),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits: String = format!("{int}{frac}").trim_start_matches('0').to_string();
    if digits.is_empty() {
        return None;
    }
    // Bounded so that the arithmetic below cannot overflow: an exponent
    // this far out is nothing a double keeps, whatever its exact value.
    let exp: i128 = exp
        .parse::<i128>()
        .unwrap_or(i128::MAX / 2)
        .clamp(i128::MIN / 2, i128::MAX / 2);
    let mut power = exp - frac.len() as i128;
    while digits.ends_with('0') {
        digits.pop();
        power += 1;
    }
    Some((negative, digits, power))
}
