//! A step's stdout read as its update while it arrives.
//!
//! A command step may print a value as large as a store takes (1 GiB). Read
//! whole and then parsed, such an output was in memory twice, as the bytes
//! that came and as the value made of them, before the save wrote its text a
//! third time. [`UpdateReader`] takes the output a piece at a time: a string
//! member (a document, a transcript, a file's text) is decoded into its value
//! as its bytes come, and the bytes are not kept. Any other member (a number,
//! an array, an object) is kept as text until it ends and then parsed alone,
//! so one such member is briefly held twice, as before. An output that is not
//! an object is kept whole and read as before, for its message.
//!
//! What is accepted, and as what value, is what [`parse_whole`] accepts for
//! the same bytes however they are cut (property-tested against it): UTF-8,
//! one JSON object of serde_json's grammar with its nesting limit, numbers
//! kept exactly, a repeated name keeping its last value.

use serde_json::{Map, Value};

use crate::json::parse_json_exact;
use steadfast::Update;

/// Reads a step's stdout as its update: one JSON object, or nothing.
///
/// The bytes must be UTF-8, and every number must be stored exactly as
/// printed: an integer beyond 64 bits or a decimal with more digits than a
/// double keeps is refused (print it as a string) rather than rounded. The run
/// loop then checks, as for every step, that the values can be stored.
///
/// This is an [`UpdateReader`] fed the whole output at once; a running
/// step's output is fed to one as it comes.
pub fn parse_update(out: &[u8]) -> Result<Update, String> {
    let mut reader = UpdateReader::new();
    reader.feed(out);
    reader.finish()
}

/// Reads a whole output held in memory: what the reader does for an output
/// that is not an object, and the rule its property tests hold it to.
#[doc(hidden)]
pub fn parse_whole(out: &[u8]) -> Result<Update, String> {
    let text = std::str::from_utf8(out).map_err(|e| {
        format!(
            "stdout is not UTF-8 (an invalid byte at offset {})",
            e.valid_up_to()
        )
    })?;
    if text.trim().is_empty() {
        return Ok(Update::new());
    }
    let quote = || {
        let start: String = text.trim().chars().take(120).collect();
        if text.trim().chars().count() > 120 {
            format!("{start}...")
        } else {
            start
        }
    };
    match parse_json_exact(text) {
        // Whether the values can be stored is checked once, by the run loop,
        // for every kind of step.
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!(
            "stdout must be one JSON object (or nothing), got {}: {:?}",
            kind(&other),
            quote()
        )),
        Err(e) => Err(format!(
            "stdout is not JSON that can be stored ({e}); it starts with {:?}",
            quote()
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The deepest nesting a member's value may have: serde_json refuses text
/// nested 128 levels deep, and the object around the members is one.
const MAX_MEMBER_DEPTH: usize = 126;

/// How many characters of an output a message quotes.
const QUOTE_CHARS: usize = 120;

/// Reads a step's stdout as its update, fed a piece at a time.
///
/// ```
/// use steadfast_cli::update_reader::UpdateReader;
///
/// let mut reader = UpdateReader::new();
/// reader.feed(br#"{"doc": "a long do"#);
/// reader.feed(br#"cument\n", "pages": 12}"#);
/// let update = reader.finish().unwrap();
/// assert_eq!(update["doc"], "a long document\n");
/// assert_eq!(update["pages"], 12);
/// ```
pub struct UpdateReader {
    fed: u64,
    utf8: Utf8Check,
    quote: Quote,
    mode: Mode,
    map: Map<String, Value>,
    error: Option<String>,
}

enum Mode {
    /// Whitespace before anything else: how many lines, and the column.
    Start {
        lines: usize,
        column: usize,
    },
    /// Not an object: kept whole, read at the end.
    Whole(Vec<u8>),
    /// After `{` (`first`) or a `,`: a member's name comes next.
    Name {
        first: bool,
    },
    InName(Text),
    Colon(String),
    Value(String),
    InString(String, Text),
    InOther(String, Other),
    /// After a member: `,` or `}`.
    Next,
    /// After the object: whitespace only.
    End,
    /// After an error: the rest is only checked for UTF-8.
    Failed,
}

impl Default for UpdateReader {
    fn default() -> Self {
        Self::new()
    }
}

impl UpdateReader {
    /// A reader that has seen nothing yet.
    pub fn new() -> Self {
        UpdateReader {
            fed: 0,
            utf8: Utf8Check::default(),
            quote: Quote::default(),
            mode: Mode::Start {
                lines: 0,
                column: 0,
            },
            map: Map::new(),
            error: None,
        }
    }

    /// Takes the next piece of the output.
    pub fn feed(&mut self, piece: &[u8]) {
        let at = self.fed;
        self.fed += piece.len() as u64;
        self.utf8.feed(piece, at);
        self.quote.feed(piece);
        if self.error.is_some() {
            return;
        }
        // Not UTF-8: that is the answer, whatever follows; nothing more is kept.
        let taken = match self.utf8.bad {
            Some(offset) => Err(format!("not UTF-8 at byte {offset}")),
            None => self.take(piece, at),
        };
        if let Err(e) = taken {
            self.error = Some(e);
            // What was read so far is no use any more.
            self.mode = Mode::Failed;
            self.map = Map::new();
        }
    }

    /// The update, once the output has ended: the object's members, an
    /// empty update for an output that is empty or only whitespace, or what
    /// is wrong, with the output's start quoted.
    pub fn finish(self) -> Result<Update, String> {
        if let Some(offset) = self.utf8.finish() {
            return Err(format!(
                "stdout is not UTF-8 (an invalid byte at offset {offset})"
            ));
        }
        let error = match self.mode {
            Mode::Start { .. } => return Ok(Update::new()),
            Mode::Whole(bytes) => return parse_whole(&bytes),
            Mode::End if self.error.is_none() => return Ok(self.map),
            _ => self.error.unwrap_or_else(|| {
                format!("the output ends inside its object, at byte {}", self.fed)
            }),
        };
        Err(format!(
            "stdout is not JSON that can be stored ({error}); it starts with {:?}",
            self.quote.text()
        ))
    }

    fn take(&mut self, piece: &[u8], at: u64) -> Result<(), String> {
        let mut i = 0;
        while i < piece.len() {
            let b = piece[i];
            let here = at + i as u64;
            let mode = std::mem::replace(&mut self.mode, Mode::Failed);
            self.mode = match mode {
                Mode::Start { lines, column } if is_space(b) => {
                    i += 1;
                    if b == b'\n' {
                        Mode::Start {
                            lines: lines + 1,
                            column: 0,
                        }
                    } else {
                        Mode::Start {
                            lines,
                            column: column + 1,
                        }
                    }
                }
                Mode::Start { .. } if b == b'{' => {
                    i += 1;
                    Mode::Name { first: true }
                }
                Mode::Start { lines, column } => {
                    // Whitespace standing in for what came first, so that a
                    // message's line and column are the output's.
                    let mut whole = Vec::with_capacity(lines + column + piece.len() - i);
                    whole.resize(lines, b'\n');
                    whole.resize(lines + column, b' ');
                    whole.extend_from_slice(&piece[i..]);
                    self.mode = Mode::Whole(whole);
                    return Ok(());
                }
                Mode::Whole(mut bytes) => {
                    bytes.extend_from_slice(&piece[i..]);
                    self.mode = Mode::Whole(bytes);
                    return Ok(());
                }
                Mode::Name { first } => {
                    i += 1;
                    match b {
                        _ if is_space(b) => Mode::Name { first },
                        b'"' => Mode::InName(Text::default()),
                        b'}' if first => Mode::End,
                        _ => return Err(unexpected(b, here, "a member's name in double quotes")),
                    }
                }
                Mode::InName(mut text) => {
                    i += text.take(&piece[i..], here)?;
                    if text.ended {
                        Mode::Colon(text.into_string(here)?)
                    } else {
                        Mode::InName(text)
                    }
                }
                Mode::Colon(name) => {
                    i += 1;
                    match b {
                        _ if is_space(b) => Mode::Colon(name),
                        b':' => Mode::Value(name),
                        _ => return Err(unexpected(b, here, "`:`")),
                    }
                }
                Mode::Value(name) => match b {
                    _ if is_space(b) => {
                        i += 1;
                        Mode::Value(name)
                    }
                    b'"' => {
                        i += 1;
                        Mode::InString(name, Text::default())
                    }
                    b',' | b'}' => return Err(unexpected(b, here, "a value")),
                    _ => Mode::InOther(name, Other::starting_at(here)),
                },
                Mode::InString(name, mut text) => {
                    i += text.take(&piece[i..], here)?;
                    if text.ended {
                        let value = Value::String(text.into_string(here)?);
                        self.map.insert(name, value);
                        Mode::Next
                    } else {
                        Mode::InString(name, text)
                    }
                }
                Mode::InOther(name, mut other) => match other.take(&piece[i..]) {
                    Some(used) => {
                        i += used;
                        let value = other.into_value(&name)?;
                        self.map.insert(name, value);
                        Mode::Next
                    }
                    None => {
                        self.mode = Mode::InOther(name, other);
                        return Ok(());
                    }
                },
                Mode::Next => {
                    i += 1;
                    match b {
                        _ if is_space(b) => Mode::Next,
                        b',' => Mode::Name { first: false },
                        b'}' => Mode::End,
                        _ => return Err(unexpected(b, here, "`,` or `}`")),
                    }
                }
                Mode::End => {
                    if !is_space(b) {
                        return Err(unexpected(b, here, "nothing after the object"));
                    }
                    i += 1;
                    Mode::End
                }
                Mode::Failed => return Ok(()),
            };
        }
        Ok(())
    }
}

/// JSON's whitespace.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

fn unexpected(b: u8, at: u64, wanted: &str) -> String {
    let found = if b.is_ascii_graphic() {
        format!("`{}`", b as char)
    } else {
        format!("byte 0x{b:02x}")
    };
    format!("expected {wanted} at byte {at}, found {found}")
}

/// A JSON string's content, decoded as it comes (after its opening quote).
#[derive(Default)]
struct Text {
    out: Vec<u8>,
    escape: Escape,
    ended: bool,
}

#[derive(Default, Clone, Copy)]
enum Escape {
    #[default]
    None,
    /// After `\`.
    Backslash,
    /// `\u` and `digits` hex digits of `code`.
    Hex {
        digits: u8,
        code: u32,
    },
    /// A leading surrogate, which a `\u` of a trailing one must follow.
    Lead(u32),
    LeadBackslash(u32),
    Trail {
        lead: u32,
        digits: u8,
        code: u32,
    },
}

impl Text {
    /// Takes what it can of `s` (up to and including the closing quote);
    /// returns how many bytes it took.
    fn take(&mut self, s: &[u8], at: u64) -> Result<usize, String> {
        let mut i = 0;
        while i < s.len() {
            let b = s[i];
            let here = at + i as u64;
            match self.escape {
                Escape::None => {
                    let rest = &s[i..];
                    let run = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
                    if let Some(p) = control(&rest[..run]) {
                        return Err(format!(
                            "a control character (byte 0x{:02x}) inside a string at byte {}; write it escaped",
                            rest[p],
                            here + p as u64
                        ));
                    }
                    self.out.extend_from_slice(&rest[..run]);
                    i += run;
                    if i < s.len() {
                        i += 1;
                        if s[i - 1] == b'"' {
                            self.ended = true;
                            return Ok(i);
                        }
                        self.escape = Escape::Backslash;
                    }
                    continue;
                }
                Escape::Backslash => {
                    self.escape = Escape::None;
                    let plain = match b {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            self.escape = Escape::Hex { digits: 0, code: 0 };
                            i += 1;
                            continue;
                        }
                        _ => return Err(format!("an invalid escape at byte {here}")),
                    };
                    self.out.push(plain);
                }
                Escape::Hex { digits, code } => {
                    let code = code << 4 | hex(b, here)?;
                    self.escape = if digits < 3 {
                        Escape::Hex {
                            digits: digits + 1,
                            code,
                        }
                    } else if (0xDC00..=0xDFFF).contains(&code) {
                        return Err(format!(
                            "a lone trailing surrogate \\u{code:04x} before byte {here}"
                        ));
                    } else if (0xD800..=0xDBFF).contains(&code) {
                        Escape::Lead(code)
                    } else {
                        self.push(code);
                        Escape::None
                    };
                }
                Escape::Lead(lead) | Escape::LeadBackslash(lead) => {
                    let wanted = if matches!(self.escape, Escape::Lead(_)) {
                        b'\\'
                    } else {
                        b'u'
                    };
                    if b != wanted {
                        return Err(format!(
                            "a leading surrogate \\u{lead:04x} without its trailing one, at byte {here}"
                        ));
                    }
                    self.escape = if wanted == b'\\' {
                        Escape::LeadBackslash(lead)
                    } else {
                        Escape::Trail {
                            lead,
                            digits: 0,
                            code: 0,
                        }
                    };
                }
                Escape::Trail { lead, digits, code } => {
                    let code = code << 4 | hex(b, here)?;
                    self.escape = if digits < 3 {
                        Escape::Trail {
                            lead,
                            digits: digits + 1,
                            code,
                        }
                    } else if (0xDC00..=0xDFFF).contains(&code) {
                        self.push(0x1_0000 + ((lead - 0xD800) << 10 | (code - 0xDC00)));
                        Escape::None
                    } else {
                        return Err(format!(
                            "a leading surrogate \\u{lead:04x} without its trailing one, at byte {here}"
                        ));
                    };
                }
            }
            i += 1;
        }
        Ok(i)
    }

    fn push(&mut self, code: u32) {
        // Surrogates were handled before; every other code is a char.
        let c = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
        let mut buf = [0u8; 4];
        self.out
            .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }

    fn into_string(mut self, at: u64) -> Result<String, String> {
        // Grown by doubling; what it did not fill goes back.
        self.out.shrink_to_fit();
        // The whole output's UTF-8 is checked too, and that error is the one
        // reported; this one only keeps a bad string out of the update.
        String::from_utf8(self.out)
            .map_err(|_| format!("a string that is not UTF-8, before byte {at}"))
    }
}

/// The first byte below 0x20 in `run`, which a JSON string may not hold.
fn control(run: &[u8]) -> Option<usize> {
    // Looked for in one pass that vectorizes; found rarely.
    if run.iter().fold(false, |seen, &b| seen | (b < 0x20)) {
        run.iter().position(|&b| b < 0x20)
    } else {
        None
    }
}

fn hex(b: u8, at: u64) -> Result<u32, String> {
    (b as char)
        .to_digit(16)
        .ok_or_else(|| format!("an invalid \\u escape at byte {at}"))
}

/// A member's value that is not a string: its text, kept until the `,` or
/// `}` that ends it, then parsed alone.
struct Other {
    start: u64,
    text: Vec<u8>,
    depth: usize,
    deepest: usize,
    in_string: bool,
    escaped: bool,
}

impl Other {
    fn starting_at(start: u64) -> Self {
        Other {
            start,
            text: Vec::new(),
            depth: 0,
            deepest: 0,
            in_string: false,
            escaped: false,
        }
    }

    /// Takes `s` up to the end of the value: `Some(n)` when `s[n]` is the
    /// `,` or `}` that ends it (not taken), `None` when all of `s` is part
    /// of it.
    fn take(&mut self, s: &[u8]) -> Option<usize> {
        for (k, &b) in s.iter().enumerate() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'[' | b'{' => {
                    self.depth += 1;
                    self.deepest = self.deepest.max(self.depth);
                }
                b']' | b'}' if self.depth > 0 => self.depth -= 1,
                b',' | b'}' if self.depth == 0 => {
                    self.text.extend_from_slice(&s[..k]);
                    return Some(k);
                }
                _ => {}
            }
        }
        self.text.extend_from_slice(s);
        None
    }

    /// The value, read alone; a message names the member and where its
    /// value starts (a line and column in it count from there).
    fn into_value(self, name: &str) -> Result<Value, String> {
        let start = self.start;
        let what = || format!("the value of {name:?} (from byte {start})");
        if self.deepest > MAX_MEMBER_DEPTH {
            return Err(format!(
                "{} is nested more than {MAX_MEMBER_DEPTH} levels deep",
                what()
            ));
        }
        let text =
            std::str::from_utf8(&self.text).map_err(|_| format!("{} is not UTF-8", what()))?;
        parse_json_exact(text).map_err(|e| format!("{}: {e}", what()))
    }
}

/// Checks that the output is UTF-8 as it comes, and where it is not.
#[derive(Default)]
struct Utf8Check {
    /// The start of a character cut at the end of the last piece.
    carry: [u8; 4],
    carried: usize,
    carry_at: u64,
    bad: Option<u64>,
}

impl Utf8Check {
    fn feed(&mut self, mut s: &[u8], mut at: u64) {
        if self.bad.is_some() {
            return;
        }
        if self.carried > 0 {
            let width = match self.carry[0] {
                0xF0..=0xF7 => 4,
                0xE0..=0xEF => 3,
                _ => 2,
            };
            let take = (width - self.carried).min(s.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&s[..take]);
            self.carried += take;
            s = &s[take..];
            at += take as u64;
            if self.carried < width {
                return;
            }
            if std::str::from_utf8(&self.carry[..width]).is_err() {
                self.bad = Some(self.carry_at);
                return;
            }
            self.carried = 0;
        }
        if let Err(e) = std::str::from_utf8(s) {
            let valid = e.valid_up_to();
            if e.error_len().is_some() {
                self.bad = Some(at + valid as u64);
            } else {
                let rest = &s[valid..];
                self.carry[..rest.len()].copy_from_slice(rest);
                self.carried = rest.len();
                self.carry_at = at + valid as u64;
            }
        }
    }

    /// Where the output stops being UTF-8, if it does.
    fn finish(&self) -> Option<u64> {
        self.bad
            .or_else(|| (self.carried > 0).then_some(self.carry_at))
    }
}

/// The output's first characters, for messages.
#[derive(Default)]
struct Quote {
    head: Vec<u8>,
    chars: usize,
    /// Continuation bytes the last character kept may still have.
    open: usize,
    started: bool,
    /// Something other than whitespace came after the quoted characters.
    more: bool,
}

impl Quote {
    fn feed(&mut self, s: &[u8]) {
        if self.more {
            return;
        }
        for &b in s {
            if !self.started {
                if b.is_ascii_whitespace() {
                    continue;
                }
                self.started = true;
            }
            if b & 0xC0 == 0x80 {
                // A continuation byte: kept only as part of a character kept
                // (so that bytes that are not UTF-8 cannot grow the quote).
                if self.open > 0 {
                    self.open -= 1;
                    self.head.push(b);
                }
                continue;
            }
            if self.chars == QUOTE_CHARS {
                if !b.is_ascii_whitespace() {
                    self.more = true;
                    return;
                }
                continue;
            }
            self.chars += 1;
            self.open = match b {
                0xF0.. => 3,
                0xE0.. => 2,
                0xC0.. => 1,
                _ => 0,
            };
            self.head.push(b);
        }
    }

    fn text(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        if self.more {
            format!("{head}...")
        } else {
            head.trim_end().to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that are not UTF-8 end the reading: neither the quote nor a
    /// string keeps growing with what follows.
    #[test]
    fn bytes_that_are_not_utf8_are_not_kept() {
        let mut reader = UpdateReader::new();
        reader.feed(b"{\"a\": \"");
        for _ in 0..64 {
            reader.feed(&[0x80; 4096]);
        }
        assert!(reader.quote.head.len() <= 4 * QUOTE_CHARS);
        assert!(matches!(reader.mode, Mode::Failed));
        assert_eq!(
            reader.finish().unwrap_err(),
            "stdout is not UTF-8 (an invalid byte at offset 7)"
        );
    }

    #[test]
    fn the_quote_keeps_whole_characters_and_no_more() {
        let mut quote = Quote::default();
        let text = "é".repeat(200);
        quote.feed(text.as_bytes());
        assert_eq!(quote.text(), format!("{}...", "é".repeat(QUOTE_CHARS)));
        let mut quote = Quote::default();
        quote.feed("  😀 x  \n ".as_bytes());
        assert_eq!(quote.text(), "😀 x");
    }
}
