//! Run ids, step names and idempotency keys.

use crate::record::error::Error;

/// The longest run id accepted, in bytes of UTF-8.
pub const MAX_RUN_ID_BYTES: usize = 200;

/// The longest step name accepted, in bytes of UTF-8.
pub const MAX_STEP_NAME_BYTES: usize = 200;

/// Checks that `run_id` is 1 to 200 bytes of UTF-8 without control characters.
///
/// Every entry point of the run loop calls this, and every store may rely on it.
///
/// ```
/// assert!(steadfast_core::validate_run_id("order-42/retry").is_ok());
/// assert!(steadfast_core::validate_run_id("bad\nid").is_err());
/// assert!(steadfast_core::validate_run_id("").is_err());
/// ```
pub fn validate_run_id(run_id: &str) -> Result<(), Error> {
    check_name(run_id, MAX_RUN_ID_BYTES).map_err(|reason| Error::InvalidRunId {
        run_id: run_id.chars().take(64).collect(),
        reason,
    })
}

/// The first 64 characters of `text`, for an error message.
pub(crate) fn preview(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Checks a name the engine records (a step's, a gate's, a workflow's, or
/// who decided or operated): 1 to 200 bytes, no control characters. The
/// error says what is wrong and where, for the caller to prefix with what
/// was named.
///
/// ```
/// use steadfast_core::check_step_name;
/// assert!(check_step_name("review").is_ok());
/// assert_eq!(
///     check_step_name("a\u{7}b").unwrap_err(),
///     "it contains the control character U+0007 at byte 1"
/// );
/// ```
pub fn check_step_name(name: &str) -> Result<(), String> {
    check_name(name, MAX_STEP_NAME_BYTES)
}

fn check_name(name: &str, max: usize) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name.len() > max {
        return Err(format!(
            "it is {} bytes long, the limit is {max}",
            name.len()
        ));
    }
    if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
        return Err(format!(
            "it contains the control character U+{:04X} at byte {at}",
            c as u32
        ));
    }
    Ok(())
}

/// The idempotency key of step `step` in run `run_id`: stable across attempts,
/// resumes and machines, and distinct for distinct `(run_id, step)` pairs.
///
/// Both parts are percent-encoded (`%` and `/` only) and joined by one `/`, so the
/// key reads like `"<run_id>/<step>"` for ordinary names and stays unambiguous when
/// a name itself contains `/`.
///
/// ```
/// use steadfast_core::idempotency_key;
/// assert_eq!(idempotency_key("order-42", "charge"), "order-42/charge");
/// assert_ne!(idempotency_key("a/b", "c"), idempotency_key("a", "b/c"));
/// ```
pub fn idempotency_key(run_id: &str, step: &str) -> String {
    let mut key = String::with_capacity(run_id.len() + step.len() + 1);
    encode_into(&mut key, run_id);
    key.push('/');
    encode_into(&mut key, step);
    key
}

fn encode_into(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn run_ids_are_checked() {
        assert!(validate_run_id("a").is_ok());
        assert!(validate_run_id(&"x".repeat(200)).is_ok());
        assert!(validate_run_id(&"x".repeat(201)).is_err());
        assert!(validate_run_id("nul\0byte").is_err());
        assert!(validate_run_id("tab\there").is_err());
        assert!(
            validate_run_id("../../etc/passwd").is_ok(),
            "stores must encode, not reject"
        );
    }

    #[test]
    fn invalid_run_id_error_says_why() {
        let err = validate_run_id("a\u{7}b").unwrap_err().to_string();
        assert!(err.contains("U+0007"), "{err}");
        assert!(err.contains("byte 1"), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]
        #[test]
        fn distinct_pairs_give_distinct_keys(
            a in "[a-c/%]{0,6}", b in "[a-c/%]{0,6}",
            c in "[a-c/%]{0,6}", d in "[a-c/%]{0,6}",
        ) {
            prop_assume!((a.as_str(), b.as_str()) != (c.as_str(), d.as_str()));
            prop_assert_ne!(idempotency_key(&a, &b), idempotency_key(&c, &d));
        }
    }
}
