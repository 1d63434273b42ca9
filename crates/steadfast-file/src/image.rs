//! The file's layout: `{"format": 1, "runs": {run_id: checkpoint, ...}}`, or,
//! once a run has per-step history, `{"format": 2, "runs": {...}, "history":
//! {run_id: [step record, ...], ...}}`, or, once a value is stored as a blob
//! (or a value that looks like a reference is escaped), format 3, the same
//! layout whose values may be references (`{"$blob": "sha256:…", "bytes":
//! N}`, the blob in the directory beside the file); format 4 adds `"events":
//! {run_id: [event, ...]}`, each run's event log; format 5 adds
//! `"documents": {key: {"value": {...}, "version": N}}`, the shared
//! documents; and its strict decoder.
//! Anything it cannot account for is `Corrupt`, with a location.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::Path;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use steadfast_core::store::blob::STORED_DECISIONS_FORMAT;
use steadfast_core::store::image::{RunImage, StoredDocument};
use steadfast_core::{Checkpoint, NewEvent, RunEvent, StepRecord, StoreError};

/// The newest version of the file layout this build writes and reads: 7,
/// whose runs' decisions may hold references to blobs (a record of
/// checkpoint format 2, see `STORED_DECISIONS_FORMAT`). Version 6's
/// history rows may hold what a step ran as (`__step`), and its runs may
/// carry the mark of a worker that lacked their workflow's version
/// (`passed_over`). A file
/// without history is written as version 1, one without references or
/// escaped values as version 2, one without events as version 3 (whose
/// values may refer to blobs), one without documents as version 4, one
/// without step definitions as version 5 (shared documents), which older
/// builds read; they refuse the versions after theirs, and so never take a
/// reference for the value it stands for, drop a run's events or a limit's
/// holders, merge a step's definition into its run's state, nor show a
/// decision's reference as its data.
pub const FILE_FORMAT: u32 = 7;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Image {
    format: u32,
    #[serde(deserialize_with = "unique_runs")]
    pub(crate) runs: BTreeMap<String, Checkpoint>,
    /// Each run's step records in index order, for runs that have any.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "unique_history"
    )]
    pub(crate) history: BTreeMap<String, Vec<StepRecord>>,
    /// Each run's event log, in order, for runs that have one.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "unique_events"
    )]
    pub(crate) events: BTreeMap<String, Vec<RunEvent>>,
    /// Shared documents by key (format 5).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) documents: BTreeMap<String, StoredDocument>,
}

/// Where the text of each run's record and history rows stands in the file
/// [`Image::encode_with`] wrote last, kept between writes of one handle.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    /// Where each run's record stands in the text last written.
    runs: HashMap<String, Range<usize>>,
    /// Where each run's history rows stand in it.
    history: HashMap<String, Range<usize>>,
    /// Whether to keep the text of the runs written (no use when the
    /// handle will not keep the image they belong to).
    keep: bool,
}

impl Fragments {
    /// None kept yet; where the runs written stand is kept only when
    /// `keep` is set.
    pub(crate) fn new(keep: bool) -> Self {
        Fragments {
            keep,
            ..Fragments::default()
        }
    }

    /// These, kept with a file within the size kept: the next write keeps
    /// where its runs stand (this one may have been read from a larger
    /// file, and kept nothing).
    pub(crate) fn keeping(mut self) -> Self {
        self.keep = true;
        self
    }

    /// Drops the text of run `run_id`, which a change may touch.
    pub(crate) fn forget(&mut self, run_id: &str) {
        self.runs.remove(run_id);
        self.history.remove(run_id);
    }
}

/// Appends the pretty JSON text of `value` as it stands `depth` levels deep
/// in the file (two spaces a level), as `serde_json`'s pretty printer writes
/// it there.
fn write_nested<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    depth: usize,
) -> serde_json::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(
        out,
        Nested {
            depth,
            has_value: false,
        },
    );
    value.serialize(&mut ser)
}

/// `serde_json`'s pretty layout (two spaces a level), starting at a depth.
struct Nested {
    depth: usize,
    has_value: bool,
}

impl Nested {
    fn line<W: ?Sized + std::io::Write>(&self, w: &mut W, first: bool) -> std::io::Result<()> {
        w.write_all(if first { b"\n" } else { b",\n" })?;
        for _ in 0..self.depth {
            w.write_all(b"  ")?;
        }
        Ok(())
    }

    fn close<W: ?Sized + std::io::Write>(&mut self, w: &mut W, end: &[u8]) -> std::io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            w.write_all(b"\n")?;
            for _ in 0..self.depth {
                w.write_all(b"  ")?;
            }
        }
        w.write_all(end)
    }
}

impl serde_json::ser::Formatter for Nested {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.line(w, first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.line(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// Writes `map`, the value of a top-level member, as pretty JSON: each
/// member's value copied from `old` (the text last written) where `kept`
/// says it stands there. Returns where each member now stands in `out`, for
/// the next write (nothing unless `keep`).
fn write_members<V: Serialize>(
    out: &mut Vec<u8>,
    map: &BTreeMap<String, V>,
    mut kept: HashMap<String, Range<usize>>,
    old: &[u8],
    keep: bool,
) -> serde_json::Result<HashMap<String, Range<usize>>> {
    if map.is_empty() {
        out.extend_from_slice(b"{}");
        return Ok(HashMap::new());
    }
    let mut now = HashMap::with_capacity(if keep { map.len() } else { 0 });
    out.extend_from_slice(b"{\n");
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b",\n");
        }
        out.extend_from_slice(b"    ");
        serde_json::to_writer(&mut *out, key)?;
        out.extend_from_slice(b": ");
        let start = out.len();
        match kept.remove(key).and_then(|r| old.get(r)) {
            Some(text) => out.extend_from_slice(text),
            None => write_nested(out, value, 2)?,
        }
        if keep {
            now.insert(key.clone(), start..out.len());
        }
    }
    out.extend_from_slice(b"\n  }");
    Ok(now)
}

#[derive(Deserialize)]
struct FormatOnly {
    format: Option<serde_json::Value>,
}

impl Image {
    pub(crate) fn empty() -> Self {
        Image {
            format: 1,
            runs: BTreeMap::new(),
            history: BTreeMap::new(),
            events: BTreeMap::new(),
            documents: BTreeMap::new(),
        }
    }

    /// Applies `change` to the runs and rows as the toolkit's image.
    pub(crate) fn with<T>(
        &mut self,
        change: impl FnOnce(&mut RunImage) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut data = RunImage::from_parts(
            std::mem::take(&mut self.runs),
            std::mem::take(&mut self.history),
        );
        data.events = std::mem::take(&mut self.events);
        data.documents = std::mem::take(&mut self.documents);
        let out = change(&mut data);
        self.events = std::mem::take(&mut data.events);
        self.documents = std::mem::take(&mut data.documents);
        (self.runs, self.history) = data.into_parts();
        out
    }

    /// Pretty JSON without a trailing newline, so that no strict prefix of a
    /// written file is itself valid JSON: a torn file can never decode.
    pub(crate) fn encode(&mut self, path: &Path) -> Result<Vec<u8>, StoreError> {
        self.encode_with(path, &mut Fragments::default(), &[], Vec::new())
    }

    /// [`encode`](Self::encode) into `out` (its contents dropped, its
    /// memory used), copying each run's record and history rows from `old`,
    /// the text last written, where `kept` says they stand there, and
    /// leaving in `kept` where every run now stands in the text returned.
    /// The caller forgets what a change may have touched
    /// ([`Fragments::forget`]); the text is the same byte for byte (debug
    /// builds check it at every call).
    pub(crate) fn encode_with(
        &mut self,
        path: &Path,
        kept: &mut Fragments,
        old: &[u8],
        mut out: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        self.format = self.format_needed();
        let failed = |e: serde_json::Error| {
            StoreError::backend(
                steadfast_core::StoreErrorKind::InvalidInput,
                format!("cannot encode the runs for {}: {e}", path.display()),
            )
        };
        // Room for the file as it was (the text last written, or the file
        // read into `out`) and some growth; memory far past that (a file
        // that shrank) is given back.
        let was = old.len().max(out.len());
        let room = was + was / 8 + 256;
        if out.capacity() > 2 * room {
            out = Vec::new();
        }
        out.clear();
        out.reserve_exact(room);
        out.extend_from_slice(b"{\n  \"format\": ");
        out.extend_from_slice(self.format.to_string().as_bytes());
        out.extend_from_slice(b",\n  \"runs\": ");
        kept.runs = write_members(
            &mut out,
            &self.runs,
            std::mem::take(&mut kept.runs),
            old,
            kept.keep,
        )
        .map_err(failed)?;
        if !self.history.is_empty() {
            out.extend_from_slice(b",\n  \"history\": ");
            kept.history = write_members(
                &mut out,
                &self.history,
                std::mem::take(&mut kept.history),
                old,
                kept.keep,
            )
            .map_err(failed)?;
        } else {
            kept.history.clear();
        }
        if !self.events.is_empty() {
            out.extend_from_slice(b",\n  \"events\": ");
            write_nested(&mut out, &self.events, 1).map_err(failed)?;
        }
        if !self.documents.is_empty() {
            out.extend_from_slice(b",\n  \"documents\": ");
            write_nested(&mut out, &self.documents, 1).map_err(failed)?;
        }
        out.extend_from_slice(b"\n}");
        debug_assert!(
            serde_json::to_vec_pretty(&*self).is_ok_and(|whole| whole == out),
            "the file's text put together from kept runs differs from the image's"
        );
        Ok(out)
    }

    /// The oldest format that holds everything in the image.
    fn format_needed(&mut self) -> u32 {
        let marked = self.with(|data| Ok(data.holds_marks())).unwrap_or(true);
        let defined = self.history.values().any(|rows| {
            rows.iter()
                .any(|r| r.update.contains_key(steadfast_core::STEP_KEY))
        });
        // A mark of a worker that passed a run over is a head field older
        // builds would refuse as unknown: it takes the newest format too.
        let passed_over = self.runs.values().any(|cp| cp.passed_over.is_some());
        let stored_decisions = self
            .runs
            .values()
            .any(|cp| cp.format == STORED_DECISIONS_FORMAT);
        if stored_decisions {
            FILE_FORMAT
        } else if defined || passed_over {
            6
        } else if !self.documents.is_empty() {
            5
        } else if !self.events.is_empty() {
            4
        } else if marked {
            3
        } else if self.history.is_empty() {
            1
        } else {
            2
        }
    }

    pub(crate) fn decode(bytes: &[u8], path: &Path) -> Result<Image, StoreError> {
        let corrupt = |location: String, reason: String| StoreError::Corrupt { location, reason };
        if bytes.is_empty() {
            return Err(corrupt(
                path.display().to_string(),
                "the file is empty".into(),
            ));
        }
        let image: Image = match serde_json::from_slice(bytes) {
            Ok(image) => image,
            Err(e) => {
                // Say "newer format" rather than a confusing shape error when we can.
                if let Ok(FormatOnly { format: Some(f) }) = serde_json::from_slice(bytes) {
                    if !f
                        .as_u64()
                        .is_some_and(|f| (1..=FILE_FORMAT as u64).contains(&f))
                    {
                        return Err(corrupt(
                            path.display().to_string(),
                            format!("file format {f} is not understood by this build (it reads {FILE_FORMAT})"),
                        ));
                    }
                }
                return Err(corrupt(
                    format!("{}:{}:{}", path.display(), e.line(), e.column()),
                    e.to_string(),
                ));
            }
        };
        if !(1..=FILE_FORMAT).contains(&image.format) {
            return Err(corrupt(
                path.display().to_string(),
                format!(
                    "file format {} is not understood by this build (it reads {FILE_FORMAT})",
                    image.format
                ),
            ));
        }
        for (key, cp) in &image.runs {
            let at = || format!("{} run {key:?}", path.display());
            if &cp.run_id != key {
                return Err(corrupt(
                    at(),
                    format!("the record says its run id is {:?}", cp.run_id),
                ));
            }
            steadfast_core::validate_run_id(key).map_err(|e| corrupt(at(), e.to_string()))?;
            // A record whose decisions hold references (from format 7 on) is
            // checked as the record it becomes once a load resolves them.
            let checked = if image.format >= 7 {
                cp.check_stored()
            } else {
                cp.check()
            };
            checked.map_err(|reason| corrupt(at(), reason))?;
        }
        let mut image = image;
        if image.format < 3 {
            // Written before blobs: a value that looks like a reference is
            // the caller's own, and reads back as written.
            image.with(|data| {
                data.escape_lookalikes();
                Ok(())
            })?;
        }
        if image.format < 2 && !image.history.is_empty() {
            return Err(corrupt(
                path.display().to_string(),
                "a file of format 1 has no history".into(),
            ));
        }
        for (key, rows) in &image.history {
            let at = || format!("{} history of run {key:?}", path.display());
            let Some(cp) = image.runs.get(key) else {
                return Err(corrupt(at(), "there is no such run".into()));
            };
            let mut last = None;
            for r in rows {
                if r.index >= cp.next || last.is_some_and(|l| l >= r.index) {
                    return Err(corrupt(
                        at(),
                        format!(
                            "row {} ({:?}) does not match the run's completed steps",
                            r.index, r.name
                        ),
                    ));
                }
                last = Some(r.index);
            }
        }
        if image.format < 4 && !image.events.is_empty() {
            return Err(corrupt(
                path.display().to_string(),
                format!("a file of format {} has no events", image.format),
            ));
        }
        if image.format < 5 && !image.documents.is_empty() {
            return Err(corrupt(
                path.display().to_string(),
                format!("a file of format {} has no documents", image.format),
            ));
        }
        for (key, doc) in &image.documents {
            let at = || format!("{} document {key:?}", path.display());
            steadfast_core::store::check_document(key, &doc.value)
                .map_err(|e| corrupt(at(), e.to_string()))?;
            if doc.version == 0 {
                return Err(corrupt(at(), "version 0 is never stored".into()));
            }
        }
        for (key, log) in &image.events {
            let at = || format!("{} events of run {key:?}", path.display());
            steadfast_core::validate_run_id(key).map_err(|e| corrupt(at(), e.to_string()))?;
            for (i, e) in log.iter().enumerate() {
                if e.seq != i as u64 + 1 {
                    return Err(corrupt(
                        at(),
                        format!(
                            "event {} is numbered {} (a log is numbered 1, 2, 3…)",
                            i + 1,
                            e.seq
                        ),
                    ));
                }
            }
            for chunk in log.chunks(steadfast_core::store::MAX_EVENTS_PER_APPEND) {
                let events: Vec<NewEvent> = chunk
                    .iter()
                    .map(|e| {
                        let mut n = NewEvent::new(e.step.clone(), e.attempt, e.at, e.value.clone());
                        n.first = e.first;
                        n
                    })
                    .collect();
                steadfast_core::store::check_events(key, &events)
                    .map_err(|e| corrupt(at(), e.to_string()))?;
            }
        }
        Ok(image)
    }
}

/// A map of event logs that refuses a run named twice.
fn unique_events<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Vec<RunEvent>>, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = BTreeMap<String, Vec<RunEvent>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of run ids to events")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format_args!(
                        "the events of run {key:?} appear twice"
                    )));
                }
                let log = map.next_value::<Vec<RunEvent>>()?;
                out.insert(key, log);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique)
}

/// A map that refuses duplicate keys instead of keeping the last one silently.
fn unique_runs<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Checkpoint>, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = BTreeMap<String, Checkpoint>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of run ids to checkpoints")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format_args!("run {key:?} appears twice")));
                }
                let cp = map.next_value::<Checkpoint>()?;
                out.insert(key, cp);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique)
}

/// A map of history rows that refuses a run named twice.
fn unique_history<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Vec<StepRecord>>, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = BTreeMap<String, Vec<StepRecord>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of run ids to step records")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format_args!(
                        "the history of run {key:?} appears twice"
                    )));
                }
                let rows = map.next_value::<Vec<StepRecord>>()?;
                out.insert(key, rows);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use steadfast_core::{NewEvent, Timestamp};

    fn record(run_id: &str, n: usize) -> Checkpoint {
        let mut cp = Checkpoint::new(run_id, "w\n\"q\"", Timestamp::from_unix_millis(1_000));
        cp.next = n;
        cp.completed = (0..n).map(|i| format!("s{i}")).collect();
        cp.state = json!({"n": n, "text": "line\nbreak \u{2028} \"quoted\"", "list": [1, {"a": []}], "empty": {}})
            .as_object()
            .cloned()
            .unwrap_or_default();
        cp
    }

    fn rows(n: usize) -> Vec<StepRecord> {
        (0..n)
            .map(|i| {
                let update = json!({"i": i}).as_object().cloned().unwrap_or_default();
                let t = Timestamp::from_unix_millis(2_000 + i as u64);
                StepRecord::new(i, &format!("s{i}"), update, 1, t, t)
            })
            .collect()
    }

    /// The text put together from kept runs is the whole image's pretty
    /// JSON, byte for byte, through changes of one run at a time (each
    /// forgotten first), deletions, and the optional sections coming and
    /// going; and a run changed without being forgotten shows (the text
    /// would be stale).
    #[test]
    fn text_from_kept_runs_is_the_whole_images_text() {
        let path = Path::new("runs.json");
        let mut image = Image::empty();
        let mut kept = Fragments::new(true);
        let mut last = Vec::new();
        fn check(image: &mut Image, kept: &mut Fragments, last: &mut Vec<u8>) {
            let text = image
                .encode_with(Path::new("runs.json"), kept, last, b"left over".to_vec())
                .unwrap();
            assert_eq!(
                String::from_utf8(text.clone()).unwrap(),
                serde_json::to_string_pretty(&*image).unwrap()
            );
            *last = text;
        }
        check(&mut image, &mut kept, &mut last);
        for (i, id) in ["b", "a", "é\"x", "c"].into_iter().enumerate() {
            kept.forget(id);
            image.runs.insert(id.to_string(), record(id, i));
            if i > 0 {
                image.history.insert(id.to_string(), rows(i));
            }
            check(&mut image, &mut kept, &mut last);
        }
        kept.forget("a");
        image
            .runs
            .get_mut("a")
            .unwrap()
            .state
            .insert("more".into(), json!(2));
        image
            .history
            .get_mut("a")
            .unwrap()
            .extend(rows(2).split_off(1));
        check(&mut image, &mut kept, &mut last);
        kept.forget("b");
        image.with(|d| Ok(d.delete("b"))).unwrap();
        check(&mut image, &mut kept, &mut last);
        image
            .with(|d| {
                d.append_events(
                    "c",
                    &[NewEvent::new("s0", 1, Timestamp::EPOCH, json!({"e": 1}))],
                )
            })
            .unwrap();
        image
            .with(|d| d.put_document("limits/x", &json!({"holders": []}), None))
            .unwrap();
        check(&mut image, &mut kept, &mut last);
        image.events.clear();
        image.documents.clear();
        image.history.clear();
        check(&mut image, &mut kept, &mut last);
        // Not forgotten: the kept text of "c" is stale.
        image.runs.get_mut("c").unwrap().next = 0;
        let text = image
            .encode_with(path, &mut Fragments::new(false), &[], Vec::new())
            .unwrap();
        let stale = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            image.encode_with(path, &mut kept, &last, Vec::new())
        }));
        assert!(
            !matches!(stale, Ok(Ok(ref t)) if *t == text),
            "a stale kept run went unnoticed"
        );
    }
}
