//! W7's floor (`--workloads W7-floor`): what the database (or the file
//! system) alone charges for W7's writes in the layout the design of large
//! values fixes for each store (large values in a table of the same
//! database, written in the transaction of the row that first refers to
//! them; for the file store, a blob directory beside the one file), with
//! nothing of Steadfast's on the path. And W1's floor on PostgreSQL
//! (`--workloads W1-floor`): W1's writes alone, in two layouts.
//!
//! The same mix as W7: 100 runs of 10 steps; steps 0 to 4 of a run each
//! store a new 1 MiB value, named by its SHA-256, and a step row referring
//! to it; steps 5 to 9 store a step row referring to a value stored before.
//! Each step is one transaction. Fewer tables, rows and indexes than a
//! store writes (no head row, no reference rows, no chunking), so the
//! figures are lower bounds for any store with this layout. Reported as µs
//! per step (mean, as W7's figure is: the time of all steps over their
//! number) against a raw write of 1 MiB plus `fsync` in the same run.

use std::path::Path;
use std::time::Instant;

use serde_json::json;
use steadfast::store::blob::BlobHash;

use crate::baseline::{remove_db, round};
use crate::large::{document, raw_write, RawAppend, VALUE_BYTES};
use crate::workloads::{Res, STEPS};
use crate::{emit, median, Args};

/// How a layout's steps went: µs per step for the transactions alone and
/// for the naming of new values (the SHA-256 every layout must compute).
struct Took {
    io_us: f64,
    name_us: f64,
    /// A raw append of 1 MiB + `fsync` ([`RawAppend`]), five after each
    /// run, outside the timing: the raw write of new content, as the
    /// layout met the memory and disk.
    append_us: f64,
}

impl Took {
    fn figures(&self, raw_us: f64) -> serde_json::Value {
        let total = self.io_us + self.name_us;
        let append = self.append_us;
        json!({"us_per_step": round(total), "io_us_per_step": round(self.io_us),
               "name_us_per_step": round(self.name_us),
               "us_per_step_over_raw": round(total / raw_us * 100.0) / 100.0,
               "io_over_raw": round(self.io_us / raw_us * 100.0) / 100.0,
               "raw_append_fsync_us": round(append),
               "us_per_step_over_raw_append": round(total / append * 100.0) / 100.0,
               "io_over_raw_append": round(self.io_us / append * 100.0) / 100.0})
    }
}

impl Took {
    /// The medians of some repetitions.
    fn median(took: &[Took]) -> Took {
        Took {
            io_us: median(took.iter().map(|t| t.io_us).collect()),
            name_us: median(took.iter().map(|t| t.name_us).collect()),
            append_us: median(took.iter().map(|t| t.append_us).collect()),
        }
    }
}

/// Prints one W7-floor line: each layout's figures against `raw_us`,
/// with `extra` fields beside them.
fn emit_floor(
    lib: &str,
    store: &str,
    durability: &str,
    runs: usize,
    raw_us: f64,
    layouts: Vec<(&str, Took)>,
    extra: &[(&str, f64)],
) {
    let mut fields = serde_json::Map::new();
    for (name, took) in layouts {
        fields.insert(name.into(), took.figures(raw_us));
    }
    fields.insert("raw_write_fsync_us".into(), json!(round(raw_us)));
    for (name, value) in extra {
        fields.insert((*name).into(), json!(round(*value)));
    }
    fields.insert("runs".into(), json!(runs));
    fields.insert("steps".into(), json!(STEPS));
    fields.insert("notes".into(), json!(NOTES));
    emit(
        lib,
        store,
        "W7-floor",
        durability,
        serde_json::Value::Object(fields),
    );
}

/// The runs' documents, made before any timing (as W7 makes them before
/// its runs): five per run.
fn documents(runs: usize) -> Vec<Vec<String>> {
    (0..runs)
        .map(|r| (0..5).map(|k| document(r, k)).collect())
        .collect()
}

/// W7's mix on one SQLite layout: WAL, `synchronous=FULL`, pages of `page`
/// bytes, SQLite's automatic checkpoint on or off (off: the copy of the log
/// back into the database is left out entirely, which no store can do for
/// long, so the figure is the lowest any rule for checkpoints can reach).
fn sqlite_layout(
    path: &Path,
    docs: &[Vec<String>],
    page: Option<u32>,
    autocheckpoint: bool,
) -> Res<Took> {
    remove_db(path);
    let conn = rusqlite::Connection::open(path)?;
    if let Some(page) = page {
        conn.pragma_update(None, "page_size", page)?;
    }
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if mode != "wal" {
        return Err(format!("journal_mode reads back {mode:?}, not wal").into());
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
    if sync != 2 {
        return Err("synchronous does not read back as FULL".into());
    }
    if !autocheckpoint {
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    }
    conn.execute_batch(
        "CREATE TABLE blobs (hash BLOB PRIMARY KEY, body TEXT NOT NULL);
         CREATE TABLE steps (run INTEGER, step INTEGER, hash BLOB NOT NULL,
                             PRIMARY KEY (run, step));",
    )?;
    let (mut io, mut name) = (0.0, 0.0);
    let mut append = RawAppend::new(path.parent().unwrap_or(Path::new(".")))?;
    let mut hashes = Vec::with_capacity(5);
    for (run, docs) in docs.iter().enumerate() {
        hashes.clear();
        for step in 0..STEPS {
            let doc = &docs[step % 5];
            if step < 5 {
                let t = Instant::now();
                let hash = BlobHash::of(doc.as_bytes());
                name += t.elapsed().as_secs_f64();
                hashes.push(hash);
            }
            let hash = &hashes[step % 5].as_bytes()[..];
            let t = Instant::now();
            let tx = conn.unchecked_transaction()?;
            if step < 5 {
                tx.execute(
                    "INSERT INTO blobs (hash, body) VALUES (?1, ?2)",
                    rusqlite::params![hash, doc],
                )?;
            }
            tx.execute(
                "INSERT INTO steps (run, step, hash) VALUES (?1, ?2, ?3)",
                rusqlite::params![run as i64, step as i64, hash],
            )?;
            tx.commit()?;
            io += t.elapsed().as_secs_f64();
        }
        append.append(5)?;
    }
    drop(conn);
    remove_db(path);
    let steps = (docs.len() * STEPS) as f64;
    Ok(Took {
        io_us: io * 1e6 / steps,
        name_us: name * 1e6 / steps,
        append_us: append.finish(),
    })
}

/// The SQLite layouts, each repetition interleaved with a raw write.
fn sqlite(args: &Args, docs: &[Vec<String>]) -> Res<()> {
    const LAYOUTS: [(&str, Option<u32>, bool); 3] = [
        ("wal_4k_autocheckpoint", None, true),
        ("wal_4k_no_checkpoint", None, false),
        ("wal_64k_no_checkpoint", Some(65536), false),
    ];
    let path = args.dir.join("w7-floor.db");
    let mut raw = Vec::new();
    let mut took: Vec<Vec<Took>> = LAYOUTS.iter().map(|_| Vec::new()).collect();
    for _ in 0..args.reps() {
        for (i, (_, page, auto)) in LAYOUTS.iter().enumerate() {
            took[i].push(sqlite_layout(&path, docs, *page, *auto)?);
            raw.push(raw_write(&args.dir, VALUE_BYTES, 100)?);
        }
    }
    let layouts = LAYOUTS
        .iter()
        .zip(&took)
        .map(|((name, _, _), took)| (*name, Took::median(took)))
        .collect();
    emit_floor(
        "sqlite-alone",
        "sqlite",
        "WAL, synchronous=FULL",
        docs.len(),
        median(raw),
        layouts,
        &[],
    );
    Ok(())
}

/// Writes `bytes` to a new file `tmp`, `fsync`s it and renames it to `to`.
fn put(tmp: &Path, to: &Path, bytes: &[u8]) -> Res<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(tmp, to)?;
    Ok(())
}

/// `fsync` of a directory.
fn sync_dir(dir: &Path) -> Res<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// W7's mix in the file store's layout (DESIGN.md: every run in one file,
/// replaced whole through a temp file, `fsync` and rename, its directory
/// synced; large values: each new value a file of a blob directory, synced
/// with its directory before the file that refers to it). The file here
/// holds one line per step stored (run, step, the value's hash: about 90
/// bytes), less than any record of a run, so the figure is a lower bound.
fn file_layout(dir: &Path, docs: &[Vec<String>]) -> Res<Took> {
    let root = dir.join("w7-floor-file");
    let _ = std::fs::remove_dir_all(&root);
    let blobs = root.join("store.json.blobs");
    std::fs::create_dir_all(&blobs)?;
    sync_dir(&root)?;
    let (file, tmp) = (root.join("store.json"), root.join(".store.json.tmp"));
    let mut record = Vec::new();
    let (mut io, mut name) = (0.0, 0.0);
    let mut append = RawAppend::new(dir)?;
    let mut hashes = Vec::with_capacity(5);
    for (run, docs) in docs.iter().enumerate() {
        hashes.clear();
        for step in 0..STEPS {
            let doc = &docs[step % 5];
            if step < 5 {
                let t = Instant::now();
                hashes.push(BlobHash::of(doc.as_bytes()));
                name += t.elapsed().as_secs_f64();
            }
            let hash = hashes[step % 5].hex();
            let t = Instant::now();
            if step < 5 {
                put(&blobs.join(".tmp"), &blobs.join(&hash), doc.as_bytes())?;
                sync_dir(&blobs)?;
            }
            record.extend_from_slice(format!("{run} {step} {hash}\n").as_bytes());
            put(&tmp, &file, &record)?;
            sync_dir(&root)?;
            io += t.elapsed().as_secs_f64();
        }
        append.append(5)?;
    }
    let _ = std::fs::remove_dir_all(&root);
    let steps = (docs.len() * STEPS) as f64;
    Ok(Took {
        io_us: io * 1e6 / steps,
        name_us: name * 1e6 / steps,
        append_us: append.finish(),
    })
}

/// The file store's layout, each repetition followed by a raw write.
fn file(args: &Args, docs: &[Vec<String>]) -> Res<()> {
    let (mut raw, mut took) = (Vec::new(), Vec::new());
    for _ in 0..args.reps() {
        took.push(file_layout(&args.dir, docs)?);
        raw.push(raw_write(&args.dir, VALUE_BYTES, 100)?);
    }
    emit_floor(
        "file-alone",
        "file",
        crate::durability("file"),
        docs.len(),
        median(raw),
        vec![("one_file_blob_dir", Took::median(&took))],
        &[],
    );
    Ok(())
}

/// What every line says of itself.
const NOTES: &str = "W7's mix with nothing of Steadfast's: steps 0-4 of a run each insert a new 1 MiB value (named by SHA-256) and a step row, steps 5-9 a step row referring to a stored value, one transaction a step; fewer rows and indexes than a store writes, so a lower bound for the layout; us_per_step = io + name, the mean over all steps; the file store's layout writes a file of one ~90-byte line per step stored in place of its records; raw = write 1 MiB + fsync over a file's first 64 MiB, pages the page cache holds (median of 100 after each layout's runs; for PostgreSQL also before them, on a quiet disk); raw_append = 1 MiB appended to a growing file + fsync, five after each run (between runs, untimed by the layout), so into new page-cache pages as the layout's writes are (median)";

/// W7's mix on PostgreSQL: the value in a `bytea` column of its own table
/// (TOAST as the server's defaults have it), one statement a step (so one
/// round trip, fewer than a store makes).
async fn postgres(args: &Args, docs: &[Vec<String>]) -> Res<()> {
    let Some(url) = crate::pg::server() else {
        eprintln!("W7-floor on postgres: skipped; set {}", crate::pg::ENV);
        return Ok(());
    };
    let client = crate::pg::connect(&url).await?;
    let schema = "bench_w7_floor";
    let (mut quiet, mut after, mut took) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.reps() {
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
                 CREATE TABLE {schema}.blobs (hash bytea PRIMARY KEY, body bytea NOT NULL);
                 CREATE TABLE {schema}.steps (run bigint, step bigint, hash bytea NOT NULL,
                                              PRIMARY KEY (run, step));
                 CHECKPOINT;"
            ))
            .await?;
        quiet.push(raw_write(&args.dir, VALUE_BYTES, 100)?);
        let first = client
            .prepare(&format!(
                "WITH b AS (INSERT INTO {schema}.blobs (hash, body) VALUES ($3, $4))
                 INSERT INTO {schema}.steps (run, step, hash) VALUES ($1, $2, $3)"
            ))
            .await?;
        let again = client
            .prepare(&format!(
                "INSERT INTO {schema}.steps (run, step, hash) VALUES ($1, $2, $3)"
            ))
            .await?;
        let (mut io, mut name) = (0.0, 0.0);
        let mut append = RawAppend::new(&args.dir)?;
        let mut hashes = Vec::with_capacity(5);
        for (run, docs) in docs.iter().enumerate() {
            hashes.clear();
            for step in 0..STEPS {
                let doc = &docs[step % 5];
                if step < 5 {
                    let t = Instant::now();
                    hashes.push(BlobHash::of(doc.as_bytes()));
                    name += t.elapsed().as_secs_f64();
                }
                let hash = &hashes[step % 5].as_bytes()[..];
                let (run, step_no) = (run as i64, step as i64);
                let t = Instant::now();
                if step < 5 {
                    client
                        .execute(&first, &[&run, &step_no, &hash, &doc.as_bytes()])
                        .await?;
                } else {
                    client.execute(&again, &[&run, &step_no, &hash]).await?;
                }
                io += t.elapsed().as_secs_f64();
            }
            append.append(5)?;
        }
        let steps = (docs.len() * STEPS) as f64;
        took.push(Took {
            io_us: io * 1e6 / steps,
            name_us: name * 1e6 / steps,
            append_us: append.finish(),
        });
        after.push(raw_write(&args.dir, VALUE_BYTES, 100)?);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await?;
    }
    emit_floor(
        "postgres-alone",
        "postgres",
        crate::durability("postgres"),
        docs.len(),
        median(quiet),
        vec![("bytea_one_statement", Took::median(&took))],
        &[("raw_write_fsync_after_us", median(after))],
    );
    Ok(())
}

/// W1's writes on PostgreSQL with nothing of Steadfast's on the path, in one
/// of two layouts, µs per step: for each of `runs` runs, the look for the
/// run that precedes its first step (a missing row), then ten steps of
/// about 100 bytes each, each its own transaction and one statement guarded
/// by the run's version, as a store must guard a save against a stale
/// writer. `one_row`: each step appended to the run's row (one heap-only
/// update a step, as the raw upsert is one); otherwise the run's head
/// updated and the step inserted as a row of its own, in one statement
/// (two writes a step, the store's layout).
async fn pg_w1(client: &tokio_postgres::Client, runs: usize, one_row: bool) -> Res<f64> {
    client
        .batch_execute(
            "DROP TABLE IF EXISTS steadfast_bench_f_steps, steadfast_bench_f_runs;
             CREATE TABLE steadfast_bench_f_runs (id text PRIMARY KEY, version bigint NOT NULL,
                                                  steps text NOT NULL);
             CREATE TABLE steadfast_bench_f_steps (run_id text, n int, body text NOT NULL,
                                                   PRIMARY KEY (run_id, n));",
        )
        .await?;
    let load = client
        .prepare("SELECT version, steps FROM steadfast_bench_f_runs WHERE id = $1")
        .await?;
    let (first, next) = if one_row {
        (
            "INSERT INTO steadfast_bench_f_runs (id, version, steps) VALUES ($1, 1, $3)
             ON CONFLICT (id) DO NOTHING RETURNING $2::int",
            "UPDATE steadfast_bench_f_runs SET version = version + 1, steps = steps || $3
             WHERE id = $1 AND version = $2 RETURNING 1",
        )
    } else {
        (
            "WITH h AS (INSERT INTO steadfast_bench_f_runs (id, version, steps) VALUES ($1, 1, '')
                        ON CONFLICT (id) DO NOTHING RETURNING id)
             INSERT INTO steadfast_bench_f_steps (run_id, n, body) SELECT id, 0, $3 FROM h
             RETURNING $2::int",
            "WITH h AS (UPDATE steadfast_bench_f_runs SET version = version + 1
                        WHERE id = $1 AND version = $2 RETURNING id, version)
             INSERT INTO steadfast_bench_f_steps (run_id, n, body)
             SELECT id, version::int - 1, $3 FROM h RETURNING 1",
        )
    };
    let (first, next) = (client.prepare(first).await?, client.prepare(next).await?);
    let t = Instant::now();
    for r in 0..runs {
        let id = format!("run-{r}");
        if client.query_opt(&load, &[&id]).await?.is_some() {
            return Err(format!("{id} is stored already").into());
        }
        for step in 0..STEPS {
            let body = format!(
                "{{\"name\":\"s{step}\",\"update\":{{\"s{step}\":{step}}},\"at\":\"{r:0>40}\"}}"
            );
            let stmt = if step == 0 { &first } else { &next };
            let version = step as i64;
            let wrote = if step == 0 {
                client.query_opt(stmt, &[&id, &0i32, &body]).await?
            } else {
                client.query_opt(stmt, &[&id, &version, &body]).await?
            };
            if wrote.is_none() {
                return Err(format!("{id} step {step}: the version check failed").into());
            }
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / (runs * STEPS) as f64;
    client
        .batch_execute("DROP TABLE steadfast_bench_f_steps, steadfast_bench_f_runs")
        .await?;
    Ok(us)
}

/// `--workloads W1-floor --stores postgres`: the raw upsert and W1's writes
/// in both layouts (see [`pg_w1`]), interleaved in each of 15 repetitions,
/// each on a worker of the runtime as W1's runs and the ratios' raw upsert
/// are. What the server charges for a step, against the target of 1.1x
/// the raw upsert, before any work of a store or the engine.
async fn pg_w1_floor(args: &Args) -> Res<()> {
    let Some(url) = crate::pg::server() else {
        eprintln!("W1-floor on postgres: skipped; set {}", crate::pg::ENV);
        return Ok(());
    };
    let client = std::sync::Arc::new(crate::pg::connect(&url).await?);
    let reps = if args.quick { 1 } else { args.reps().max(15) };
    let (upserts, runs) = if args.quick { (200, 20) } else { (3_000, 300) };
    let (mut raw, mut one, mut two) = (vec![], vec![], vec![]);
    for _ in 0..reps {
        let c = std::sync::Arc::clone(&client);
        raw.push(
            crate::pg::on_worker(
                upserts,
                async move { crate::pg::raw_upserts(&c, upserts).await },
            )
            .await?
            .0,
        );
        for (one_row, samples) in [(true, &mut one), (false, &mut two)] {
            let c = std::sync::Arc::clone(&client);
            samples.push(
                crate::pg::on_worker(runs * STEPS, async move { pg_w1(&c, runs, one_row).await })
                    .await?
                    .0,
            );
        }
    }
    let (raw, one, two) = (median(raw), median(one), median(two));
    let ratio = |x: f64| (x / raw * 1000.0).round() / 1000.0;
    emit(
        "postgres-alone",
        "postgres",
        "W1-floor",
        crate::durability("postgres"),
        json!({"reps": reps, "runs": runs, "steps": STEPS, "raw_upsert_us": round(raw),
               "one_row_us_per_step": round(one), "one_row_over_raw": ratio(one),
               "head_and_step_row_us_per_step": round(two), "head_and_step_row_over_raw": ratio(two),
               "notes": "W1's writes with nothing of Steadfast's: per run a look for the missing run, then ten ~100-byte steps, each one statement guarded by the run's version (one_row: appended to the run's row; head_and_step_row: the head updated and a step row inserted); raw upsert as in the ratios; interleaved, on a runtime worker, medians"}),
    );
    Ok(())
}

/// `--workloads W7-floor` on the stores asked for (SQLite, PostgreSQL and
/// the file store's layout).
pub async fn measure(args: &Args) -> Res<()> {
    if args.wants("W1-floor") && args.stores.iter().any(|s| s == "postgres") {
        pg_w1_floor(args).await?;
    }
    if !args.wants("W7-floor") {
        return Ok(());
    }
    let runs = if args.quick { 4 } else { 100 };
    let docs = documents(runs);
    if args.stores.iter().any(|s| s == "sqlite") {
        sqlite(args, &docs)?;
    }
    if args.stores.iter().any(|s| s == "file") {
        file(args, &docs)?;
    }
    if args.stores.iter().any(|s| s == "postgres") {
        postgres(args, &docs).await?;
    }
    Ok(())
}
