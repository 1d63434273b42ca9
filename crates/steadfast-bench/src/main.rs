//! The Steadfast benchmark harness: the workloads of WORKLOAD.md on every store,
//! the disk's own limit and a raw SQLite baseline, measured in one run and
//! printed as JSON lines.
//!
//! ```text
//! cargo run --release -p steadfast-bench              # everything, 3 repetitions
//! cargo run --release -p steadfast-bench -- --quick   # a smoke run: does it work?
//! cargo run --release -p steadfast-bench -- --syncs   # count fsyncs per save with strace
//! cargo run --release -p steadfast-bench -- --workloads ratios --stores sqlite
//!                                                      # the SQLite targets, interleaved
//! cargo run --release -p steadfast-bench -- --workloads breakdown --stores sqlite,postgres
//!                                  # where a W1 checkpoint's time goes
//! cargo run --release -p steadfast-bench -- --workloads procs --stores sqlite
//!                  # W2 in one process and over two sharing the database
//! STEADFAST_BENCH_PG=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p steadfast-bench -- --workloads events --stores sqlite,postgres
//!                  # events per second with a watcher, emit-to-watch latency
//! STEADFAST_BENCH_PG=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p steadfast-bench -- --workloads ratios --stores postgres
//!                                                      # the PostgreSQL targets
//! STEADFAST_BENCH_COSMOS='cosmos://127.0.0.1:18081?keyfile=K&cafile=C' \
//!   cargo run --release -p steadfast-bench -- --stores cosmos   # Cosmos W1, W2
//!   cargo run --release -p steadfast-bench -- --workloads W1,W2 --stores sqlite,sqlite-sealed
//!                                                # the cost of encryption
//! STEADFAST_BENCH_PG=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p steadfast-bench -- --workloads gc,prune --stores sqlite,postgres
//!                                 # retention on 100,000 runs, prune of a long run
//! STEADFAST_BENCH_PG=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p steadfast-bench -- --workloads W7,W7-floor --stores sqlite,postgres
//!                  # W7 beside the database alone doing W7's writes
//! ```

mod baseline;
mod breakdown;
mod cosmos;
mod events;
mod floor;
mod large;
mod ops;
mod pg;
mod syncs;
mod workloads;

use std::path::PathBuf;

use clap::Parser;
use serde_json::{json, Map, Value};

/// Command-line options.
#[derive(Parser, Debug, Clone)]
#[command(
    about = "Benchmarks of Steadfast's stores against the disk's limit (JSON lines on stdout)"
)]
pub struct Args {
    /// A smoke run: tiny sizes, one repetition; checks that everything works, not how fast.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Stores to measure.
    /// `postgres` is measured on the server `STEADFAST_BENCH_PG` names, and
    /// skipped with a printed reason without it.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,file,sqlite,postgres"
    )]
    pub stores: Vec<String>,
    /// Workloads to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "W1,W2,W3,W4,W5,W7,physical,raw-sqlite,ratios,events"
    )]
    pub workloads: Vec<String>,
    /// Where the stores are written (the disk measured is the one under it).
    #[arg(long, default_value = "target/steadfast-bench")]
    pub dir: PathBuf,
    /// Count fsync/fdatasync calls per acknowledged save with strace instead.
    #[arg(long)]
    pub syncs: bool,
    /// Internal: the role of a re-executed child process.
    #[arg(long, hide = true)]
    pub child: Option<String>,
    /// Internal: the store URL of a child.
    #[arg(long, hide = true)]
    pub child_store: Option<String>,
    /// Internal: how many runs a child does.
    #[arg(long, hide = true, default_value_t = 0)]
    pub child_runs: usize,
}

impl Args {
    fn reps(&self) -> usize {
        if self.quick {
            1
        } else {
            self.reps.max(1)
        }
    }

    fn wants(&self, workload: &str) -> bool {
        self.workloads
            .iter()
            .any(|w| w.eq_ignore_ascii_case(workload))
    }
}

/// One result line.
pub fn emit(lib: &str, store: &str, workload: &str, durability: &str, fields: Value) {
    let mut line = Map::new();
    line.insert("lib".into(), json!(lib));
    line.insert("store".into(), json!(store));
    line.insert("workload".into(), json!(workload));
    line.insert("durability".into(), json!(durability));
    if let Value::Object(extra) = fields {
        line.extend(extra);
    }
    line.entry("notes").or_insert(json!(""));
    println!("{}", Value::Object(line));
}

/// The median of some samples.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// What a store's saves survive, in WORKLOAD.md's words.
pub fn durability(store: &str) -> &'static str {
    match store {
        "memory" => "in memory",
        "file" => "fsync per checkpoint",
        "sqlite" => "group commit (fsync per batch)",
        "postgres" => "commit per batch (synchronous_commit=on, fsync=on)",
        "sqlite-sealed" => "group commit (fsync per batch), AES-256-GCM sealed",
        _ => "unknown",
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(role) = &args.child {
        return workloads::child(role, &args);
    }
    std::fs::create_dir_all(&args.dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.syncs {
        return syncs::measure(&args);
    }
    if args.wants("physical") {
        baseline::physical(&args)?;
    }
    if args.wants("raw-sqlite") {
        baseline::raw_sqlite(&args)?;
    }
    if args.wants("breakdown") {
        if args.stores.iter().any(|s| s == "sqlite") {
            rt.block_on(breakdown::measure(&args))?;
        }
        if args.stores.iter().any(|s| s == "postgres") {
            rt.block_on(pg::breakdown(&args))?;
        }
    }
    if args.wants("ratios") && args.stores.iter().any(|s| s == "sqlite") {
        rt.block_on(workloads::ratios(&args))?;
    }
    if args.wants("W7-floor") || args.wants("W1-floor") {
        rt.block_on(floor::measure(&args))?;
    }
    if args.stores.iter().any(|s| s == "cosmos") {
        rt.block_on(cosmos::measure(&args))?;
    }
    if args.wants("events") {
        for store in &args.stores {
            match store.as_str() {
                "memory" | "sqlite" => rt.block_on(events::measure(store, &args))?,
                "postgres" if pg::server().is_some() => {
                    rt.block_on(events::measure(store, &args))?
                }
                _ => {}
            }
        }
    }
    let wants_pg = args.stores.iter().any(|s| s == "postgres");
    if wants_pg && args.wants("ratios") {
        rt.block_on(pg::measure(&args))?;
    }
    for store in &args.stores {
        if store == "cosmos" {
            continue;
        }
        if store == "postgres" && pg::server().is_none() {
            if !args.wants("ratios") {
                eprintln!(
                    "postgres: skipped; set {} to a PostgreSQL URL to measure it",
                    pg::ENV
                );
            }
            continue;
        }
        rt.block_on(workloads::all(store, &args))?;
    }
    Ok(())
}
