//! The file's layout: `{"format": 1, "runs": {run_id: checkpoint, ...}}`, and its
//! strict decoder. Anything it cannot account for is `Corrupt`, with a location.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use steadfast_core::{Checkpoint, StoreError};

/// The version of the file layout written by this build.
pub const FILE_FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Image {
    format: u32,
    #[serde(deserialize_with = "unique_runs")]
    pub(crate) runs: BTreeMap<String, Checkpoint>,
}

#[derive(Deserialize)]
struct FormatOnly {
    format: Option<serde_json::Value>,
}

impl Image {
    pub(crate) fn empty() -> Self {
        Image {
            format: FILE_FORMAT,
            runs: BTreeMap::new(),
        }
    }

    /// Pretty JSON without a trailing newline, so that no strict prefix of a
    /// written file is itself valid JSON: a torn file can never decode.
    pub(crate) fn encode(&self, path: &Path) -> Result<Vec<u8>, StoreError> {
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
                    if f.as_u64() != Some(FILE_FORMAT as u64) {
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
        if image.format != FILE_FORMAT {
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
        Ok(image)
    }
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
