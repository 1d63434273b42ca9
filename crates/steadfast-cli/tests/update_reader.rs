//! A step's stdout read as it comes: whatever the pieces, the reader accepts
//! what a parse of the whole output accepts, as the same values, and refuses
//! what it refuses.

use proptest::prelude::*;
use serde_json::{json, Value};
use steadfast_cli::command::parse_whole;
use steadfast_cli::update_reader::UpdateReader;

/// The reader fed `bytes` cut at `cuts` (positions, in any order).
fn read_in_pieces(bytes: &[u8], cuts: &[usize]) -> Result<steadfast::Update, String> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut reader = UpdateReader::new();
    let mut from = 0;
    for to in at {
        reader.feed(&bytes[from..to]);
        from = to;
    }
    reader.feed(&bytes[from..]);
    reader.finish()
}

/// Both accept with equal values, or both refuse.
fn same(bytes: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
    let whole = parse_whole(bytes);
    let pieces = read_in_pieces(bytes, cuts);
    match (&whole, &pieces) {
        (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{:?}", String::from_utf8_lossy(bytes)),
        (Err(_), Err(_)) => {}
        _ => prop_assert!(
            false,
            "whole {:?} against pieces {:?} for {:?}",
            whole,
            pieces,
            String::from_utf8_lossy(bytes)
        ),
    }
    Ok(())
}

/// JSON values whose strings hold what needs escaping: quotes, backslashes,
/// control characters, characters beyond the BMP.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "(\\PC|[\"\\\\/\u{0}-\u{1f}\u{7f}\u{2028}😀é])*".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Text that is mostly JSON's punctuation, escapes and odd bytes: outputs a
/// parser must refuse or take apart with care.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b"[".to_vec()),
        Just(b"]".to_vec()),
        Just(b"\"".to_vec()),
        Just(b":".to_vec()),
        Just(b",".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"\\u".to_vec()),
        Just(b"d83d".to_vec()),
        Just(b"de00".to_vec()),
        Just(b"\\ud83d\\ude00".to_vec()),
        Just(b"1e400".to_vec()),
        Just(b"-0.5".to_vec()),
        Just(b"18446744073709551616".to_vec()),
        Just(b"true".to_vec()),
        Just(b"null".to_vec()),
        Just("é".as_bytes().to_vec()),
        Just("\u{a0}".as_bytes().to_vec()),
        Just(vec![0xe2, 0x82]),
        Just(vec![0xff]),
        Just(vec![0x01]),
        "[a-z]{1,3}".prop_map(String::into_bytes),
    ];
    prop::collection::vec(token, 0..24).prop_map(|t| t.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn an_object_printed_any_way_reads_the_same_in_any_pieces(
        members in prop::collection::vec((".{0,8}", value()), 0..6),
        pretty in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let object = Value::Object(members.into_iter().collect());
        let text = if pretty {
            serde_json::to_vec_pretty(&object).unwrap()
        } else {
            serde_json::to_vec(&object).unwrap()
        };
        let read = read_in_pieces(&text, &cuts);
        prop_assert_eq!(read.as_ref().ok(), object.as_object(), "{:?}", read);
        same(&text, &cuts)?;
    }

    #[test]
    fn jsonish_bytes_in_any_pieces_read_as_a_whole_parse_reads_them(
        body in jsonish(),
        wrap in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        // Most of it inside an object, where the reader takes it apart.
        let bytes = if wrap { [b"{\"k\": ".as_slice(), &body, b"}"].concat() } else { body };
        same(&bytes, &cuts)?;
    }

    #[test]
    fn arbitrary_bytes_in_any_pieces_read_as_a_whole_parse_reads_them(
        bytes in prop::collection::vec(any::<u8>(), 0..48),
        cuts in prop::collection::vec(any::<usize>(), 0..4),
    ) {
        same(&bytes, &cuts)?;
        same(&[b"{\"a\":\"".as_slice(), &bytes, b"\"}"].concat(), &cuts)?;
    }
}

#[test]
fn every_cut_of_tricky_outputs_reads_the_same() {
    let outputs: &[&[u8]] = &[
        br#"{"a": "x\ud83d\ude00y", "b": "\u00e9\n\t\"\\\/"}"#,
        "{\"é\": \"日本語 😀\", \"n\": [1, {\"m\": \"}\"}], \"z\": -1.5e3}".as_bytes(),
        br#"{"a": "\ud83d"}"#,
        br#"{"a": "\ude00"}"#,
        br#"{"a": "\ud83d\n"}"#,
        br#"{"a": "\ud83d\u0041"}"#,
        br#"{"a": "\x"}"#,
        br#"{"a": 1, "a": 2}"#,
        br#"{"a": 1,}"#,
        br#"{"a" 1}"#,
        br#"{"a": }"#,
        br#"{"a": 1} x"#,
        br#"{"a": 1} {"b": 2}"#,
        br#"{"a": 12345678901234567890123}"#,
        br#"{"a": 0.1000000000000000055511151231257827}"#,
        br#"{"a": [1, 2]"#,
        br#"{"a": "unterminated"#,
        b"{\"a\": \"\xe2\x82\xac\"}",
        b"{\"a\": \"\xe2\x82\"}",
        b"{\"a\": \"\x01\"}",
        b"  \n",
        "\u{a0}".as_bytes(),
        b"",
        b"[1, 2]",
        b"\"just a string\"",
        b"{}",
        b"{ }",
        b"{\"a\":{}}",
        // Split four-byte characters and surrogates written as UTF-8.
        "{\"a\": \"\u{1F600}x\"}".as_bytes(),
        b"{\"a\": \"\xed\xa0\x80\"}",
        b"{\"a\": \"\xf5\x80\x80\x80\"}",
        b"{\"a\": \"\xf0\x9f\x98\"}",
        // serde_json's marker name, first or not, at the top or inside.
        br#"{"$serde_json::private::RawValue": "{\"a\": 1}"}"#,
        br#"{"\u0024serde_json::private::RawValue": "[1]"}"#,
        br#"{"$serde_json::private::RawValue": 1, "b": 2}"#,
        br#"{"x": {"$serde_json::private::RawValue": "{\"n\": 12345678901234567890123}"}}"#,
        // Leading lines before something that is not an object.
        b"\n\n  [1,]",
    ];
    for output in outputs {
        for cut in 0..=output.len() {
            for second in cut..=output.len() {
                let whole = parse_whole(output);
                let pieces = read_in_pieces(output, &[cut, second]);
                assert_eq!(
                    whole.as_ref().ok(),
                    pieces.as_ref().ok(),
                    "{:?} cut at {cut} and {second}: {whole:?} against {pieces:?}",
                    String::from_utf8_lossy(output)
                );
            }
        }
    }
}

/// serde_json's nesting limit counts the object around the members, and so
/// does the reader's: 126 levels in a member are taken, 127 refused, arrays
/// and objects alike.
#[test]
fn nesting_is_limited_as_in_a_whole_parse() {
    for (depth, objects) in [125, 126, 127, 128]
        .into_iter()
        .flat_map(|d| [(d, false), (d, true)])
    {
        let (open, close) = if objects {
            ("{\"k\": [", "]}")
        } else {
            ("[", "]")
        };
        let levels = if objects { depth / 2 } else { depth };
        let depth = if objects { levels * 2 } else { depth };
        let text = format!("{{\"a\": {}{}}}", open.repeat(levels), close.repeat(levels));
        let whole = parse_whole(text.as_bytes());
        let pieces = read_in_pieces(text.as_bytes(), &[7, 50]);
        assert_eq!(whole.is_ok(), depth <= 126, "{depth}: {whole:?}");
        assert_eq!(pieces.is_ok(), depth <= 126, "{depth}: {pieces:?}");
    }
}

/// What a refusal says: where the output stops being UTF-8, or what is
/// wrong and how the output starts.
#[test]
fn refusals_say_what_and_where() {
    let err = read_in_pieces(b"{\"a\": \"ok\xff\"}", &[8]).unwrap_err();
    assert_eq!(err, "stdout is not UTF-8 (an invalid byte at offset 9)");
    // A character cut at the output's end.
    let err = read_in_pieces(b"{\"a\": 1}\xe2\x82", &[9]).unwrap_err();
    assert_eq!(err, "stdout is not UTF-8 (an invalid byte at offset 8)");
    let err = read_in_pieces(br#"{"a" 1}"#, &[3]).unwrap_err();
    assert!(err.contains("expected `:` at byte 5"), "{err}");
    assert!(err.contains(r#"it starts with "{\"a\" 1}""#), "{err}");
    let err = read_in_pieces(br#"{"n": 12345678901234567890123}"#, &[10]).unwrap_err();
    assert!(err.contains("does not fit in 64 bits"), "{err}");
    let long = format!("{{\"a\": \"{}\" x", "b".repeat(500));
    let err = read_in_pieces(long.as_bytes(), &[100, 300]).unwrap_err();
    let quoted = format!("{{\\\"a\\\": \\\"{}...", "b".repeat(113));
    assert!(err.contains(&quoted), "{err}");
    let err = read_in_pieces(b"[1]", &[1]).unwrap_err();
    assert!(err.contains("got an array"), "{err}");
    // A member's value that is not a string: named, with where it starts.
    let err = read_in_pieces(br#"{"ok": 1, "list": [1, x]}"#, &[20]).unwrap_err();
    assert!(
        err.contains(r#"the value of "list" (from byte 18)"#),
        "{err}"
    );
    // Before something that is not an object, the lines still count.
    let err = read_in_pieces(b"\n\n  [1,]", &[1, 4]).unwrap_err();
    assert!(err.contains("line 3"), "{err}");
}

/// serde_json's marker name is read as a name like any other, by the reader
/// and by a parse of the whole output alike (the run loop then refuses it):
/// it does not smuggle in a value the number check did not see.
#[test]
fn the_serde_marker_name_is_an_ordinary_name_here() {
    let out = br#"{"x": {"$serde_json::private::RawValue": "{\"n\": 12345678901234567890123}"}}"#;
    let read = read_in_pieces(out, &[9]).unwrap();
    assert_eq!(read, parse_whole(out).unwrap());
    assert_eq!(
        read["x"]["$serde_json::private::RawValue"],
        "{\"n\": 12345678901234567890123}"
    );
}

/// A large string member arrives in many pieces and comes out whole.
#[test]
fn a_large_string_read_in_pipe_sized_pieces_is_the_string() {
    let doc: String = (0..300_000)
        .map(|i| match i % 7 {
            0 => '\n',
            1 => '"',
            2 => 'é',
            3 => '😀',
            _ => 'x',
        })
        .collect();
    let text = serde_json::to_vec(&json!({ "doc": doc, "pages": 3 })).unwrap();
    let mut reader = UpdateReader::new();
    for piece in text.chunks(65_536) {
        reader.feed(piece);
    }
    let update = reader.finish().unwrap();
    assert_eq!(update["doc"].as_str(), Some(doc.as_str()));
    assert_eq!(update["pages"], 3);
}

/// The smallest pieces a pipe can give, one byte each (an escape, a
/// surrogate pair and a four-byte character cut everywhere at once), an
/// empty piece between each, and a long run of whitespace before the end.
#[test]
fn one_byte_pieces_read_as_the_whole_output_reads() {
    let outputs: &[&[u8]] = &[
        br#"{"a": "x\ud83d\ude00y\n\"q\"", "b": [1, {"c": "}"}], "d": -1.5e3, "e": null}"#,
        "{\"é\": \"日本語 😀\"}".as_bytes(),
        b"{\"a\": \"\xf0\x9f\x98\"}",
        b"\n\n  [1,]",
        b"{\"a\": 1}     \n\t\r ",
        b"",
    ];
    for output in outputs {
        let mut reader = UpdateReader::new();
        for b in output.iter() {
            reader.feed(&[]);
            reader.feed(std::slice::from_ref(b));
        }
        let pieces = reader.finish();
        let whole = parse_whole(output);
        assert_eq!(
            pieces.as_ref().ok(),
            whole.as_ref().ok(),
            "{:?}: {pieces:?} against {whole:?}",
            String::from_utf8_lossy(output)
        );
        assert_eq!(pieces.is_err(), whole.is_err());
    }
}
