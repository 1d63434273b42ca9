//! Long crash torture, outside CI: thousands of random SIGKILLs of
//! `steadfast run` and `steadfast worker` processes (whole process groups,
//! steps included) on one store, then every run is finished and checked.
//!
//! ```text
//! cargo build --release -p steadfast-cli -p steadfast-bench
//! target/release/torture --store sqlite --kills 2000 [--seed N] [--runs 8] [--steps 6] [--large]
//! target/release/torture --store cosmos --faults 0.05 --kills 2000
//! ```
//!
//! Stores: `file`, `sqlite` (a fresh temporary directory), `postgres`
//! (`$STEADFAST_TEST_PG`, a fresh schema) and `cosmos` (`$STEADFAST_TEST_COSMOS`
//! with `$STEADFAST_TEST_COSMOS_CA` and `$STEADFAST_COSMOS_KEY`, a fresh
//! database). The schedule (which process, when it is killed) comes from the
//! printed seed, so `--seed` replays it (timing still varies). Every step
//! logs its start and end (run, step, attempt, process, time). Checked at the
//! end, per run: it completed with the full state; its steps first ran in
//! order; no step ran again once a later one had run (a checkpointed step is
//! never re-executed); no two executions of a run's steps overlapped;
//! re-executions are at most the kills that hit the run. The judge is the
//! one the fault harnesses share (`faults/history.rs`).
//! One summary line; exit 1 on any violation.
//!
//! `--faults RATE` (cosmos) goes through the fault-injecting proxy
//! (`$STEADFAST_TEST_COSMOS_PROXY`, `ci/cosmos/faultproxy.js`): that share
//! of all requests to items gets a fault (429, 503, 408, a connection
//! dropped before or after the server applied the request, a delay, a lost
//! session token), drawn from the seed, while processes are killed and runs
//! finished. A write that a fault failed or left open counts like a kill of
//! its run (it may cost one re-execution); the final records are read with
//! the faults off. `--lie` is the negative control: the proxy acknowledges
//! writes without making them, and the check must find the loss.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

#[path = "faults/history.rs"]
mod history;

#[derive(Parser, Debug)]
struct Args {
    /// file, sqlite, postgres or cosmos.
    #[arg(long)]
    store: String,
    /// How many processes to kill.
    #[arg(long, default_value_t = 2000)]
    kills: u32,
    /// The schedule's seed (random if not given; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Runs in the store.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1000))]
    runs: u16,
    /// Steps per run.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u16).range(1..=1000))]
    steps: u16,
    /// How long each step sleeps, in milliseconds (so that kills land
    /// inside steps as well as between them).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    step_ms: u64,
    /// Each step also prints one of three 100 KB documents (the same in
    /// every run), stored once as blobs: kills land in saves that write
    /// and share blobs, and the check reads each document back whole.
    #[arg(long)]
    large: bool,
    /// The `steadfast` binary (default: beside this one).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Cosmos only: the share (0 to 1) of requests to items that the fault
    /// proxy faults.
    #[arg(long)]
    faults: Option<f64>,
    /// With --faults: the negative control. The proxy acknowledges that
    /// share of writes without making them (its `fake-ack`), so
    /// acknowledged steps are lost; the check must find violations (exit 1
    /// if it finds none, 0 if it does).
    #[arg(long, requires = "faults")]
    lie: bool,
}

/// The fault proxy's control endpoint, from the store URL's host.
fn proxy_control(url: &str, path: &str, body: Option<&str>) -> Result<String, String> {
    let ca = std::env::var("STEADFAST_TEST_COSMOS_CA").map_err(|_| "no CA".to_string())?;
    let base = url
        .strip_prefix("cosmos://")
        .and_then(|r| r.split('/').next())
        .ok_or("not a cosmos URL")?;
    let mut cmd = Command::new("curl");
    cmd.args(["-sSf", "--cacert", &ca]);
    if let Some(b) = body {
        cmd.args(["-X", "POST", "-d", b]);
    }
    let out = cmd
        .arg(format!("https://{base}/__proxy/{path}"))
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the fault proxy at {base}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The size of each document of `--large`: over the default blob threshold.
const DOC_BYTES: usize = 100_000;

fn store_url(kind: &str, dir: &Path, seed: u64, faults: bool) -> Result<String, String> {
    let env = |k: &str| std::env::var(k).map_err(|_| format!("{kind} needs ${k}"));
    Ok(match kind {
        "file" => format!("file:{}", dir.join("runs.json").display()),
        "sqlite" => format!("sqlite:{}", dir.join("runs.db").display()),
        "postgres" => {
            let url = env("STEADFAST_TEST_PG")?;
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}schema=torture_{seed}")
        }
        "cosmos" => {
            let url = env(match faults {
                true => "STEADFAST_TEST_COSMOS_PROXY",
                false => "STEADFAST_TEST_COSMOS",
            })?;
            let ca = env("STEADFAST_TEST_COSMOS_CA")?;
            format!("{url}/torture{seed}/runs?cafile={ca}")
        }
        other => return Err(format!("unknown store {other:?}")),
    })
}

fn spawn(bin: &Path, dir: &Path, url: &str, args: &[&str]) -> Child {
    use std::os::unix::process::CommandExt;
    Command::new(bin)
        .current_dir(dir)
        .arg("--store")
        .arg(url)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn steadfast")
}

/// SIGKILLs the child's whole process group (the CLI and the step it runs),
/// with kill(1): this crate forbids `unsafe`, which libc's kill needs.
fn kill_group(child: &mut Child) {
    let group = -(child.id() as i64);
    let _ = Command::new("kill")
        .args(["-KILL", "--", &group.to_string()])
        .status();
    let _ = child.wait();
}

fn main() {
    let args = Args::parse();
    let (runs, steps) = (usize::from(args.runs), usize::from(args.steps));
    let seed = args.seed.unwrap_or_else(fastrand_seed);
    let mut rng = Rng(seed.max(1));
    let dir = tempfile::tempdir().expect("a temp dir");
    if args.faults.is_some_and(|r| !(0.0..=1.0).contains(&r))
        || (args.faults.is_some() && args.store != "cosmos")
    {
        eprintln!("torture: --faults takes a share from 0 to 1, on the cosmos store");
        std::process::exit(2);
    }
    let url = match store_url(&args.store, dir.path(), seed, args.faults.is_some()) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("torture: {e}");
            std::process::exit(2);
        }
    };
    let database = format!("torture{seed}");
    let set_faults = |rate: f64| {
        let kinds = if args.lie { r#"["fake-ack"]"# } else { "[]" };
        let body = format!(
            r#"{{"db": "{database}", "rate": {rate}, "seed": "{seed}", "kinds": {kinds}}}"#
        );
        if let Err(e) = proxy_control(&url, "random", Some(&body)) {
            eprintln!("torture: {e}");
            std::process::exit(2);
        }
    };
    let bin = args.bin.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("this binary's path")
            .with_file_name("steadfast")
    });
    let log = dir.path().join("log");
    // The steps log their start and end (the shared judge's log); the
    // update: `{"sI": I}`, or with --large `{"sI": I, "docK": "KKK…"}`.
    let large = args.large;
    let flow = history::flow_named("torture", steps, args.step_ms, &log, &|i| {
        if large {
            let k = i % 3;
            format!(
                r#"printf '{{\"s{i}\": {i}, \"doc{k}\": \"'; head -c {DOC_BYTES} /dev/zero | tr '\\000' {k}; printf '\"}}'"#
            )
        } else {
            format!(r#"echo '{{\"s{i}\": {i}}}'"#)
        }
    });
    std::fs::write(dir.path().join("flow.toml"), flow).unwrap();
    println!(
        "torture: store {} seed {seed}: {} kills, {} runs at a time of {} steps",
        args.store, args.kills, runs, steps
    );
    let start_run = |id: &str| {
        // Under faults a start may fail, or land with its answer lost.
        for _ in 0..20 {
            let st = spawn(
                &bin,
                dir.path(),
                &url,
                &["start", "flow.toml", "--run-id", id],
            )
            .wait();
            if st.is_ok_and(|s| s.success()) || !status_of(&bin, dir.path(), &url, id).is_empty() {
                return;
            }
        }
        panic!("start {id}: failed 20 times");
    };
    if let Some(rate) = args.faults {
        set_faults(rate);
    }
    // The runs being worked on; a completed one is replaced by a new one, so
    // that kills keep landing in unfinished runs.
    let mut live: Vec<String> = (0..runs).map(|i| format!("r{i}")).collect();
    let mut ids: Vec<String> = live.clone();
    for id in &live {
        start_run(id);
    }
    let started = Instant::now();
    let mut kills_per_run: HashMap<String, u32> = HashMap::new();
    let mut worker_kills = 0u32;
    for k in 0..args.kills {
        // A run process on one run, or a worker on all of them.
        let worker = rng.below(4) == 0;
        let mut child = if worker {
            spawn(
                &bin,
                dir.path(),
                &url,
                &[
                    "worker",
                    "flow.toml",
                    "--concurrency",
                    "4",
                    "--poll",
                    "20ms",
                    "--lease",
                    "2s",
                ],
            )
        } else {
            let id = &live[rng.below(live.len() as u64) as usize];
            *kills_per_run.entry(id.clone()).or_default() += 1;
            spawn(
                &bin,
                dir.path(),
                &url,
                &["run", "flow.toml", "--run-id", id, "--lease", "2s"],
            )
        };
        let wait = Duration::from_millis(rng.below(250));
        std::thread::sleep(wait);
        kill_group(&mut child);
        if worker {
            worker_kills += 1;
        }
        if k % 25 == 24 {
            for slot in live.iter_mut() {
                if status_of(&bin, dir.path(), &url, slot) == "completed" {
                    let id = format!("r{}", ids.len());
                    start_run(&id);
                    ids.push(id.clone());
                    *slot = id;
                }
            }
        }
        if k % 500 == 499 {
            eprintln!("torture: {} kills, {:.0?}", k + 1, started.elapsed());
        }
    }
    // Finish everything: leases of killed holders lapse after 2 s.
    std::thread::sleep(Duration::from_millis(2_200));
    // Held by a lease that has not lapsed yet, or a store hiccup (a fault
    // that failed a save leaves the run under its lease): again, a few times.
    let tries = if args.faults.is_some() { 10 } else { 2 };
    for id in &ids {
        let mut done = false;
        for t in 0..tries {
            if t > 0 {
                std::thread::sleep(Duration::from_millis(2_200));
            }
            let ok = spawn(
                &bin,
                dir.path(),
                &url,
                &["run", "flow.toml", "--run-id", id],
            )
            .wait();
            if ok.is_ok_and(|s| s.success()) {
                done = true;
                break;
            }
        }
        if !done {
            println!("torture: VIOLATION seed {seed}: run {id} did not complete");
            if args.lie {
                println!("torture: negative control: the check caught the writes acknowledged and not made");
            }
            std::process::exit(i32::from(!args.lie));
        }
    }
    // Writes that a fault failed or left open, by run; then the judge reads
    // the final records with the faults off.
    let mut fault_hits: HashMap<String, u32> = HashMap::new();
    if args.faults.is_some() {
        set_faults(0.0);
        let text =
            proxy_control(&url, &format!("faults?db={database}"), None).unwrap_or_else(|e| {
                eprintln!("torture: {e}");
                std::process::exit(2);
            });
        let by_pk: HashMap<String, u32> = serde_json::from_str(&text).unwrap_or_default();
        for (pk, n) in by_pk {
            // The partition key is the run's encoded id, as a JSON list; the
            // torture's ids (r0, r1, ...) encode to themselves.
            let id: Vec<String> = serde_json::from_str(&pk).unwrap_or_default();
            if let Some(id) = id.into_iter().next() {
                *fault_hits.entry(id).or_default() += n;
            }
        }
    }
    for (id, n) in &fault_hits {
        *kills_per_run.entry(id.clone()).or_default() += n;
    }
    let violations = check(
        &bin,
        dir.path(),
        &url,
        &ids,
        (steps, args.large),
        &log,
        &kills_per_run,
        worker_kills,
    );
    let total_execs: usize = history::read_log(&log).iter().filter(|e| e.start).count();
    let faulted = match args.faults {
        Some(rate) => format!(
            " through the fault proxy ({rate} of requests; {} writes failed or left open)",
            fault_hits.values().sum::<u32>()
        ),
        None => String::new(),
    };
    println!(
        "torture: store {}{faulted} seed {seed}: {} kills ({} of workers) in {:.0?}, {} runs completed, {} step executions for {} steps ({} re-executions), {} violations",
        args.store,
        args.kills,
        worker_kills,
        started.elapsed(),
        ids.len(),
        total_execs,
        ids.len() * steps,
        total_execs.saturating_sub(ids.len() * steps),
        violations.len()
    );
    for v in violations
        .iter()
        .take(if args.lie { 5 } else { usize::MAX })
    {
        println!("torture: VIOLATION seed {seed}: {v}");
    }
    if args.store == "postgres" {
        let _ = Command::new("psql")
            .arg(std::env::var("STEADFAST_TEST_PG").unwrap_or_default())
            .args([
                "-qc",
                &format!("DROP SCHEMA IF EXISTS torture_{seed} CASCADE"),
            ])
            .status();
    }
    if args.lie {
        println!(
            "torture: negative control: the check {} the writes acknowledged and not made",
            if violations.is_empty() {
                "MISSED"
            } else {
                "caught"
            }
        );
        std::process::exit(i32::from(violations.is_empty()));
    }
    std::process::exit(i32::from(!violations.is_empty()));
}

fn status_of(bin: &Path, dir: &Path, url: &str, id: &str) -> String {
    let out = Command::new(bin)
        .current_dir(dir)
        .args(["--store", url, "show", id, "--json"])
        .output()
        .expect("show");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["status"].as_str().unwrap_or("").to_string()
}

/// The shared judge (faults/history.rs) over the steps' log and the final
/// records: every run completed with its full state; no two executions of
/// a run's steps overlapped; its steps first ran in order and none ran
/// again once a later one had; re-executions at most the kills (and
/// faulted writes) that could hit the run. With `--large`, each document
/// reads back whole.
#[allow(clippy::too_many_arguments)]
fn check(
    bin: &Path,
    dir: &Path,
    url: &str,
    ids: &[String],
    (steps, large): (usize, bool),
    log: &Path,
    kills: &HashMap<String, u32>,
    worker_kills: u32,
) -> Vec<String> {
    let execs = history::read_log(log);
    let mut out = history::check_final(bin, dir, url, ids, steps, &execs);
    out.extend(history::check_order(&execs));
    let again = history::reexecutions(&execs);
    for id in ids {
        let n = again.get(id).copied().unwrap_or(0) as u32;
        let allowed = kills.get(id).copied().unwrap_or(0) + worker_kills;
        if n > allowed {
            out.push(format!(
                "run {id}: {n} re-executions for {allowed} kills that could hit it"
            ));
        }
    }
    for id in ids.iter().filter(|_| large) {
        let shown = Command::new(bin)
            .current_dir(dir)
            .args(["--store", url, "show", id, "--json"])
            .output()
            .expect("show");
        let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap_or_default();
        for k in 0..steps.min(3) {
            let doc = v["state"][format!("doc{k}")].as_str().unwrap_or_default();
            if doc.len() != DOC_BYTES || doc.bytes().any(|b| b != b'0' + k as u8) {
                out.push(format!(
                    "run {id}: doc{k} did not read back whole ({} bytes)",
                    doc.len()
                ));
            }
        }
    }
    out
}

/// xorshift64*: the schedule's random numbers, from the seed alone.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn fastrand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id())
}
