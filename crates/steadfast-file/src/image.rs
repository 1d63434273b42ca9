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

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use steadfast_core::store::image::{RunImage, StoredDocument};
use steadfast_core::{Checkpoint, NewEvent, RunEvent, StepRecord, StoreError};

/// The newest version of the file layout this build writes and reads: 6,
/// whose history rows may hold what a step ran as (`__step`), and whose
/// runs may carry the mark of a worker that lacked their workflow's
/// version (`passed_over`). A file
/// without history is written as version 1, one without references or
/// escaped values as version 2, one without events as version 3 (whose
/// values may refer to blobs), one without documents as version 4, one
/// without step definitions as version 5 (shared documents), which older
/// builds read; they refuse the versions after theirs, and so never take a
/// reference for the value it stands for, drop a run's events or a limit's
/// holders, nor merge a step's definition into its run's state.
pub const FILE_FORMAT: u32 = 6;

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
        let marked = self.with(|data| Ok(data.holds_marks())).unwrap_or(true);
        let defined = self.history.values().any(|rows| {
            rows.iter()
                .any(|r| r.update.contains_key(steadfast_core::STEP_KEY))
        });
        // A mark of a worker that passed a run over is a head field older
        // builds would refuse as unknown: it takes the newest format too.
        let passed_over = self.runs.values().any(|cp| cp.passed_over.is_some());
        self.format = if defined || passed_over {
            FILE_FORMAT
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
        };
        serde_json::to_vec_pretty(self).map_err(|e| {
            StoreError::backend(
                steadfast_core::StoreErrorKind::InvalidInput,
                format!("cannot encode the runs for {}: {e}", path.display()),
            )
        })
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
            cp.check().map_err(|reason| corrupt(at(), reason))?;
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
