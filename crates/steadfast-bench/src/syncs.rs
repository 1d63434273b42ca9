//! Proof that the baselines are honest: count fsync and fdatasync calls with
//! strace while a child process makes a known number of acknowledged saves, and
//! subtract what the same child makes with no saves at all (opening, schema).

use std::process::Command;

use serde_json::json;

use crate::workloads::fresh_url;
use crate::{emit, Args};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The counted cases: (store, child role, runs, saves per run).
const CASES: &[(&str, &str, usize, usize)] = &[
    ("raw-sqlite", "syncs-raw", 3000, 1),
    ("sqlite", "syncs-w1", 100, 10),
    ("sqlite", "syncs-w2", 320, 10),
    ("file", "syncs-w1", 50, 10),
];

pub fn measure(args: &Args) -> Res<()> {
    if Command::new("strace").arg("-V").output().is_err() {
        return Err("strace is not installed (apt-get install strace)".into());
    }
    for &(store, role, runs, per_run) in CASES {
        let kind = if store == "raw-sqlite" {
            "sqlite"
        } else {
            store
        };
        let base = count(args, kind, role, 0)?;
        let with = count(args, kind, role, runs)?;
        let saves = runs * per_run;
        let syncs = with.saturating_sub(base);
        emit(
            if store == "raw-sqlite" {
                "raw-sqlite"
            } else {
                "steadfast"
            },
            kind,
            &format!("syncs/{}", role.trim_start_matches("syncs-")),
            if store == "raw-sqlite" {
                "fsync per checkpoint"
            } else {
                crate::durability(kind)
            },
            json!({"runs": runs, "saves": saves, "syncs": syncs,
                   "syncs_per_save": (syncs as f64 / saves as f64 * 1000.0).round() / 1000.0,
                   "notes": format!("strace -f -c -e trace=fsync,fdatasync; {base} syncs of setup subtracted")}),
        );
    }
    Ok(())
}

fn count(args: &Args, kind: &str, role: &str, runs: usize) -> Res<u64> {
    let url = fresh_url(kind, &args.dir, &format!("syncs-{role}-{runs}"));
    let out_file = args.dir.join("strace.out");
    let status = Command::new("strace")
        .args(["-f", "-c", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&out_file)
        .arg(std::env::current_exe()?)
        .args([
            "--child",
            role,
            "--child-store",
            &url,
            "--child-runs",
            &runs.to_string(),
            "--dir",
        ])
        .arg(&args.dir)
        .status()?;
    if !status.success() {
        return Err(format!("the strace child {role} failed: {status}").into());
    }
    let text = std::fs::read_to_string(&out_file)?;
    // Summary rows: % time, seconds, usecs/call, calls, [errors,] syscall.
    let mut total = 0;
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if let Some(name) = cols.last() {
            if (*name == "fsync" || *name == "fdatasync") && cols.len() >= 5 {
                total += cols[3].parse::<u64>().unwrap_or(0);
            }
        }
    }
    Ok(total)
}

/// The raw baseline's loop, on a fresh database.
pub fn raw_upserts(url: &str, n: usize) -> Res<()> {
    let path = url.trim_start_matches("sqlite:");
    let conn = rusqlite::Connection::open(path)?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    crate::baseline::upserts(&conn, n)?;
    Ok(())
}
