//! W7 of WORKLOAD.md, large values: 100 runs of 10 steps, each step
//! returning a 1 MiB value, half of them the value an earlier step of the
//! same run returned (an agent rereading a document). Reports the bytes the
//! store holds afterwards against the bytes of unique content, µs per step
//! against a raw write of the same bytes plus fsync in the same run, and the
//! process's peak memory during the runs.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use steadfast::{open_store, run, update, RetryPolicy, Step, Workflow};

use crate::baseline::round;
use crate::workloads::{fresh_url, Res, STEPS};
use crate::{durability, emit, median, Args};

/// The size of one value's JSON text, quotes included: 1 MiB.
pub(crate) const VALUE_BYTES: usize = 1 << 20;

/// Text of `len` characters that does not compress (so that a store that
/// compresses, such as PostgreSQL's TOAST, is measured on what it keeps).
fn noise(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for shift in (0..60).step_by(6) {
            if out.len() < len {
                out.push(ALPHABET[((x >> shift) & 63) as usize]);
            }
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Document `k` of run `run`: a JSON string of [`VALUE_BYTES`] bytes.
pub(crate) fn document(run: usize, k: usize) -> String {
    noise((run as u64) << 8 | k as u64, VALUE_BYTES - 2)
}

/// Run `run`'s workflow: step `i` returns document `i % 5` under a key of
/// its own, so steps 5 to 9 reread what steps 0 to 4 read. The documents
/// are made before the run (a step only hands over the value it has, as a
/// model's or a tool's answer), so the time is the checkpoints'.
pub(crate) fn workflow(run: usize) -> Workflow {
    let docs: Arc<Vec<String>> = Arc::new((0..5).map(|k| document(run, k)).collect());
    let mut b = Workflow::builder("w7");
    for i in 0..STEPS {
        let docs = Arc::clone(&docs);
        b = b.push(
            Step::new(format!("s{i}"), move |_, _| {
                let value = docs[i % 5].clone();
                async move { update(json!({ format!("doc{i}"): value })) }
            })
            .retry(RetryPolicy::none()),
        );
    }
    b.build().expect("a valid workflow")
}

/// A line of the process's status (`VmHWM`, `VmRSS`), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The process's peak resident memory (VmHWM) in bytes.
pub(crate) fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Resets the peak to what is resident now (Linux: `5` to `clear_refs`),
/// and returns that: memory earlier workloads of the same process left
/// resident (the allocator keeps what it freed) counts in the peak too.
pub(crate) fn reset_peak() -> u64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_bytes("VmRSS:").unwrap_or(0)
}

/// Microseconds per write of `bytes` bytes to a file plus its fsync
/// (median of `n`), on the disk under `dir`.
pub(crate) fn raw_write(dir: &Path, bytes: usize, n: usize) -> Res<f64> {
    let path = dir.join("w7-raw.bin");
    let body = noise(7, bytes).into_bytes();
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)?;
        use std::io::Seek;
        // A different place each time, as a store appends.
        f.seek(std::io::SeekFrom::Start(((i % 64) * bytes) as u64))?;
        let t = Instant::now();
        f.write_all(&body)?;
        f.sync_all()?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let _ = std::fs::remove_file(&path);
    Ok(median(samples))
}

/// A raw write of new content, as a store must make it: each call appends
/// one value of [`VALUE_BYTES`] to the end of one growing file and `fsync`s
/// it, so that every write lands in page-cache pages the file never held
/// before. W7 calls it after each run, five times (the run's unique
/// content), so that it meets the memory and the disk the run met.
///
/// Why not only [`raw_write`]: on a virtual machine whose host takes back
/// the memory its guest frees (free page reporting, as on the VMs these
/// figures come from), a page the guest has not used lately costs the host
/// a fault on first touch: a `write()` of 1 MiB into such pages took 3 to
/// 3.5 ms where one over pages the page cache held took 0.2 ms (the
/// `fsync` apart).
/// [`raw_write`] overwrites the same 64 MiB over and over, so it never pays
/// that; a store keeping 500 MiB of new content must, and so must this.
pub(crate) struct RawAppend {
    file: std::fs::File,
    path: std::path::PathBuf,
    body: Vec<u8>,
    samples: Vec<f64>,
}

impl RawAppend {
    /// A new, empty file under `dir`.
    pub(crate) fn new(dir: &Path) -> Res<RawAppend> {
        let path = dir.join("w7-raw-append.bin");
        // A new file, never one planted there (a link is removed, not followed).
        let _ = std::fs::remove_file(&path);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)?;
        Ok(RawAppend {
            file,
            path,
            body: noise(13, VALUE_BYTES).into_bytes(),
            samples: Vec::new(),
        })
    }

    /// Appends one value and `fsync`s it, `n` times, each timed.
    pub(crate) fn append(&mut self, n: usize) -> Res<()> {
        for _ in 0..n {
            let t = Instant::now();
            self.file.write_all(&self.body)?;
            self.file.sync_all()?;
            self.samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(())
    }

    /// The median of the appends, in µs; the file goes when `self` does.
    pub(crate) fn finish(mut self) -> f64 {
        median(std::mem::take(&mut self.samples))
    }
}

impl Drop for RawAppend {
    /// Removes the file, also when a measure stopped on an error.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Microseconds (medians of `n`) for the work every save of a new large
/// value does before its write, whatever the store: writing one value of
/// [`VALUE_BYTES`] into a record, which writes its JSON text and names it
/// by SHA-256 (each time a value not met before, so that it is hashed); and
/// of that, the SHA-256 of the text alone.
pub(crate) fn encode_and_hash(n: usize) -> (f64, f64) {
    use steadfast::store::blob::{encode_object, BlobHash};
    let (mut encode, mut hash) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let doc = noise(11 + i as u64, VALUE_BYTES - 2);
        let mut map = serde_json::Map::new();
        map.insert("doc".into(), serde_json::Value::String(doc));
        let mut blobs = Vec::new();
        let t = Instant::now();
        let record = encode_object(&map, 64 << 10, "w7", "state", &mut blobs);
        encode.push(t.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(record.ok());
        if let Some(blob) = blobs.first() {
            let t = Instant::now();
            std::hint::black_box(BlobHash::of(blob.text.as_bytes()));
            hash.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    (median(encode), median(hash))
}

/// What every store's W7 reports, from the samples of its repetitions
/// (µs per step, raw write + fsync µs, bytes stored, peak memory) and
/// the floor measured now.
pub(crate) fn w7_figures(
    runs: usize,
    per_step: &[f64],
    raw: &[f64],
    appends: &[f64],
    stored: &[f64],
    peaks: &[f64],
    before: &[f64],
) -> serde_json::Map<String, serde_json::Value> {
    let unique = (runs * 5 * VALUE_BYTES) as f64;
    let (us, raw_us, append_us, bytes) = (
        median(per_step.to_vec()),
        median(raw.to_vec()),
        median(appends.to_vec()),
        median(stored.to_vec()),
    );
    let (encode_us, hash_us) = encode_and_hash(20);
    let figures = json!({"runs": runs, "steps": STEPS, "value_bytes": VALUE_BYTES,
        "us_per_step": round(us), "raw_write_fsync_us": round(raw_us),
        "us_per_step_over_raw": round(us / raw_us * 100.0) / 100.0,
        "raw_append_fsync_us": round(append_us),
        "us_per_step_over_raw_append": round(us / append_us * 100.0) / 100.0,
        "encode_and_name_us": round(encode_us), "sha256_us": round(hash_us),
        "floor_over_raw": round((raw_us + encode_us) / raw_us * 100.0) / 100.0,
        "stored_bytes": bytes as u64, "unique_bytes": unique as u64,
        "stored_over_unique": round(bytes / unique * 100.0) / 100.0,
        "peak_rss_bytes": median(peaks.to_vec()) as u64,
        "rss_before_bytes": median(before.to_vec()) as u64});
    match figures {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// The bytes a store keeps: the files of an SQLite database, the relations
/// of a PostgreSQL schema, or the file store's file and its blob files.
async fn stored_bytes(kind: &str, url: &str) -> Res<u64> {
    match kind {
        "sqlite" => {
            let path = url.trim_start_matches("sqlite:");
            let path = path.split('?').next().unwrap_or(path);
            let mut total = 0;
            for suffix in ["", "-wal"] {
                total += std::fs::metadata(format!("{path}{suffix}")).map_or(0, |m| m.len());
            }
            Ok(total)
        }
        "postgres" => crate::pg::schema_bytes(url).await,
        "file" => {
            let path = url.trim_start_matches("file:");
            let mut total = std::fs::metadata(path).map_or(0, |m| m.len());
            if let Ok(entries) = std::fs::read_dir(format!("{path}.blobs")) {
                for e in entries.flatten() {
                    total += e.metadata().map_or(0, |m| m.len());
                }
            }
            Ok(total)
        }
        other => Err(format!("W7 does not measure {other}").into()),
    }
}

/// W7 on `kind` (SQLite, PostgreSQL and the file store).
pub async fn w7(kind: &str, args: &Args) -> Res<()> {
    if !matches!(kind, "sqlite" | "postgres" | "file") {
        return Ok(());
    }
    let runs = if args.quick { 4 } else { 100 };
    let mut per_step = Vec::new();
    let mut raw = Vec::new();
    let mut appends = Vec::new();
    let mut stored = Vec::new();
    let mut peaks = Vec::new();
    let mut before = Vec::new();
    for rep in 0..args.reps() {
        let url = fresh_url(kind, &args.dir, &format!("w7-{rep}"));
        let store = open_store(&url).await?;
        // Made before the peak is reset: its buffer is not the store's.
        let mut append = RawAppend::new(&args.dir)?;
        before.push(reset_peak() as f64);
        let mut took = 0.0;
        for r in 0..runs {
            let wf = workflow(r);
            let t = Instant::now();
            run(&format!("w7-{r}"), &wf, &*store).await?;
            took += t.elapsed().as_secs_f64();
            append.append(5)?;
        }
        appends.push(append.finish());
        per_step.push(took * 1e6 / (runs * STEPS) as f64);
        peaks.push(peak_rss().unwrap_or(0) as f64);
        drop(store);
        stored.push(stored_bytes(kind, &url).await? as f64);
        crate::workloads::cleanup(kind, &url);
        raw.push(raw_write(&args.dir, VALUE_BYTES, 100)?);
    }
    let mut figures = w7_figures(runs, &per_step, &raw, &appends, &stored, &peaks, &before);
    figures.insert("notes".into(), json!("step i returns document i % 5 of its run (1 MiB each, incompressible); raw = write 1 MiB + fsync over a file's first 64 MiB (pages the page cache holds), median of 100 per repetition; raw_append = 1 MiB appended to one growing file + fsync, five after each run (its unique content, so into new page-cache pages as the store's writes are; on a VM whose host takes back freed memory, such pages cost a host fault each), median per repetition; encode_and_name = writing a record holding one such value not met before, which writes its JSON text and names it by SHA-256 (median of 20; sha256 = the hash alone, part of it), the work a save of a new large value does besides the write, so floor_over_raw = (raw + encode_and_name) / raw (a reread value is recognised among the texts the process named lately by comparing bytes, and costs less than that: us_per_step_over_raw may be below the floor); stored = the database's files (SQLite), the schema's relations (PostgreSQL) or the file and its blob files (file) after the runs; peak_rss_bytes = the process's peak resident memory during the runs, rss_before_bytes = what was resident when they began (in a run of the whole harness, memory earlier workloads freed stays resident); medians of the repetitions"));
    emit(
        "steadfast",
        kind,
        "W7",
        durability(kind),
        serde_json::Value::Object(figures),
    );
    Ok(())
}
