//! Property tests of the CLI's parsing: flow files with arbitrary durations
//! and names, step outputs of arbitrary bytes and JSON, and flags. Each input
//! ends in a value or an error, never a panic.

use std::path::Path;

use clap::Parser;
use proptest::prelude::*;
use steadfast_cli::args::Cli;
use steadfast_cli::command::parse_update;
use steadfast_cli::flow;

fn toml_str(s: &str) -> String {
    // JSON's string escapes are TOML basic-string escapes.
    serde_json::to_string(s).unwrap()
}

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,25}(ns|us|ms|s|m|h|d|w|M|y)",
        "[0-9]{1,6}(s|m|h) [0-9]{1,6}(ms|s)",
        ".{0,12}",
        Just("10000y".to_string()),
        Just("0s".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn flow_files_with_arbitrary_durations_and_names_parse_or_fail_cleanly(
        name in ".{0,20}",
        step in ".{0,20}",
        timeout in duration_text(),
        backoff in duration_text(),
        sleep in duration_text(),
        gate_timeout in duration_text(),
        retries in any::<u32>(),
    ) {
        let text = format!(
            "name = {}\n[[step]]\nname = {}\nrun = \"true\"\ntimeout = {}\nbackoff = {}\nretries = {retries}\n[[step]]\nname = \"g\"\ngate = true\ntimeout = {}\non_timeout = \"approve\"\n[[step]]\nname = \"z\"\nsleep = {}\n",
            toml_str(&name), toml_str(&step), toml_str(&timeout), toml_str(&backoff),
            toml_str(&gate_timeout), toml_str(&sleep)
        );
        match flow::parse(&text, Path::new("p.toml")) {
            Ok(wf) => prop_assert_eq!(wf.steps().len(), 3),
            Err(e) => prop_assert!(e.0.starts_with("p.toml"), "{}", e.0),
        }
    }

    #[test]
    fn arbitrary_step_output_bytes_give_an_update_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(update) = parse_update(&bytes) {
            let text = serde_json::to_string(&update).unwrap();
            let back: steadfast::Update = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(back, update);
        }
    }

    #[test]
    fn integers_are_kept_exactly_or_refused_when_beyond_64_bits(ints in prop::collection::vec(any::<i128>(), 1..4)) {
        let text = format!(
            "{{\"i\": [{}]}}",
            ints.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        );
        let fits = ints.iter().all(|i| i64::try_from(*i).is_ok() || u64::try_from(*i).is_ok());
        match parse_update(text.as_bytes()) {
            Ok(update) => {
                prop_assert!(fits, "an integer beyond 64 bits was accepted: {}", text);
                for (i, v) in ints.iter().zip(update["i"].as_array().unwrap()) {
                    prop_assert_eq!(v.to_string(), i.to_string());
                }
            }
            Err(e) => {
                prop_assert!(!fits, "refused {}: {}", text, e);
                prop_assert!(e.contains("64 bits"), "{}", e);
            }
        }
    }

    #[test]
    fn doubles_as_printed_are_always_kept_exactly(
        floats in prop::collection::vec(any::<f64>().prop_filter("finite", |f| f.is_finite()), 1..4),
        exponent_form in any::<bool>(),
    ) {
        let show = |f: &f64| if exponent_form { format!("{f:e}") } else { format!("{f:?}") };
        let text = format!("{{\"f\": [{}]}}", floats.iter().map(show).collect::<Vec<_>>().join(","));
        let update = parse_update(text.as_bytes());
        prop_assert!(update.is_ok(), "refused {}: {:?}", text, update.err());
        for (f, v) in floats.iter().zip(update.unwrap()["f"].as_array().unwrap()) {
            prop_assert_eq!(v.as_f64(), Some(*f));
        }
    }

    #[test]
    fn long_decimals_are_kept_exactly_or_refused(digits in "[1-9][0-9]{0,30}(\\.[0-9]{1,30})?(e-?[0-9]{1,3})?") {
        let text = format!("{{\"d\": {digits}}}");
        match parse_update(text.as_bytes()) {
            Ok(update) => {
                // Accepted: the stored double is the number the text names.
                let stored = update["d"].as_f64();
                let named: f64 = digits.parse().unwrap();
                prop_assert_eq!(stored, Some(named));
            }
            Err(e) => prop_assert!(e.contains("digits") || e.contains("64 bits") || e.contains("out of range"), "{}", e),
        }
    }

    #[test]
    fn flags_with_arbitrary_values_parse_or_fail_cleanly(lease in duration_text(), id in ".{0,20}") {
        let _ = Cli::try_parse_from(["steadfast", "run", "f.toml", "--run-id", &id, "--lease", &lease]);
    }
}

/// Where two shortest decimals name one double equally well, printers
/// choose differently (serde_json's and Rust's differ here): both are taken,
/// and a digit more is refused.
#[test]
fn either_shortest_decimal_of_a_double_is_taken() {
    for (text, kept) in [
        ("1078178814758225.2", true),
        ("1078178814758225.3", true),
        ("1078178814758225.25", false),
        ("0.30000000000000004", true),
        ("0.300000000000000044", false),
        ("1e-400", false),
        ("1e400", false),
        ("-0.0", true),
    ] {
        let update = parse_update(format!("{{\"d\": {text}}}").as_bytes());
        assert_eq!(update.is_ok(), kept, "{text}: {update:?}");
        if let Ok(update) = update {
            assert_eq!(update["d"].as_f64(), text.parse::<f64>().ok(), "{text}");
        }
    }
}

/// Exponents at the ends of a 128-bit integer are refused or taken, never a
/// panic (the digits of a literal are compared with what a double keeps).
#[test]
fn extreme_exponents_do_not_overflow() {
    for text in [
        "{\"a\": 1.5e-170141183460469231731687303715884105728}",
        "{\"a\": 1.5e170141183460469231731687303715884105727}",
        "{\"a\": 10e170141183460469231731687303715884105727}",
        "{\"a\": 1e-99999999999999999999999999999999999999999999}",
    ] {
        let _ = parse_update(text.as_bytes());
    }
}
