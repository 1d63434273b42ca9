//! The disk's limit and a raw SQLite baseline, measured on the same file system
//! as the stores.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use serde_json::json;

use crate::{emit, median, Args};

/// `fsync_200B` and `fdatasync_200B`: a 200-byte write followed by a sync, 2000
/// times; the median latency.
pub fn physical(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let n = if args.quick { 50 } else { 2000 };
    for (name, data_only) in [("fsync_200B", false), ("fdatasync_200B", true)] {
        let us = sync_200b(&args.dir, n, data_only)?;
        emit(
            "physical",
            "disk",
            name,
            if data_only {
                "fdatasync per write"
            } else {
                "fsync per write"
            },
            json!({"runs": 1, "steps": n, "us_per_step": round(us), "steps_per_s": round(1e6 / us)}),
        );
    }
    Ok(())
}

/// The median microseconds of `n` 200-byte writes each followed by an
/// fsync (or an fdatasync), in a scratch file under `dir`: the disk's floor
/// for one durable write.
pub fn sync_200b(
    dir: &std::path::Path,
    n: usize,
    data_only: bool,
) -> Result<f64, Box<dyn std::error::Error>> {
    let path = dir.join("physical.bin");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let block = [7u8; 200];
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        file.write_at(&block, (i % 16 * 200) as u64)?;
        if data_only {
            file.sync_data()?;
        } else {
            file.sync_all()?;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(median(samples))
}

/// 10,000 single-row upserts, each its own transaction, WAL with synchronous=FULL.
pub fn raw_sqlite(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let n = if args.quick { 200 } else { 10_000 };
    let mut per_op = Vec::new();
    for rep in 0..args.reps() {
        let path = args.dir.join(format!("raw-{rep}.db"));
        remove_db(&path);
        let conn = rusqlite::Connection::open(&path)?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "synchronous", "FULL")?;
        let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
        assert_eq!(sync, 2, "synchronous must read back as FULL");
        let t = Instant::now();
        upserts(&conn, n)?;
        per_op.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        drop(conn);
        remove_db(&path);
    }
    let us = median(per_op);
    emit(
        "raw-sqlite",
        "sqlite",
        "upsert",
        "fsync per checkpoint",
        json!({"runs": 1, "steps": n, "us_per_step": round(us), "steps_per_s": round(1e6 / us),
               "notes": "single-row upsert per transaction, WAL, synchronous=FULL"}),
    );
    Ok(())
}

/// `n` single-row upserts over 1000 keys, each its own transaction. Every value
/// differs from the one it replaces: SQLite skips writing a row whose bytes did
/// not change, and a commit with nothing to write does not sync, which would
/// make the baseline faster than the disk.
pub fn upserts(conn: &rusqlite::Connection, n: usize) -> rusqlite::Result<()> {
    upserts_with(conn, n, || {})
}

/// [`upserts`], calling `before` ahead of each one (work between commits).
pub fn upserts_with(
    conn: &rusqlite::Connection,
    n: usize,
    mut before: impl FnMut(),
) -> rusqlite::Result<()> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
    let mut stmt = conn.prepare(
        "INSERT INTO kv (k, v) VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
    )?;
    for i in 0..n {
        before();
        // Autocommit: one transaction, one WAL sync, per statement.
        stmt.execute(rusqlite::params![(i % 1000) as i64, format!("{i:0>200}")])?;
    }
    Ok(())
}

/// Removes a database and its WAL and shared-memory files.
pub fn remove_db(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

/// Rounds to one decimal for printing.
pub fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
