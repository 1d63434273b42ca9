//! What the CLI's PostgreSQL tests share: a schema per test, worker
//! processes in process groups of their own, and the step log.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use steadfast::postgres::{PgOptions, PgStore};
use steadfast::{ListFilter, RunStatus, Store};

pub const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// The server: `$STEADFAST_TEST_PG`, else the local one CI starts. Never
/// skipped: a test without it fails, naming it.
pub fn server_url() -> String {
    std::env::var("STEADFAST_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A directory, a schema of its own (dropped at the end) and the flow.
pub struct PgEnv {
    pub dir: tempfile::TempDir,
    pub url: String,
    pub rt: tokio::runtime::Runtime,
    pub store: PgStore,
}

impl PgEnv {
    pub fn new() -> Self {
        let base = server_url();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}schema=t_{:016x}", fastrand::u64(..));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let store = rt
            .block_on(PgStore::connect_with(
                &url,
                PgOptions::default().pool_size(2),
            ))
            .unwrap_or_else(|e| panic!("PostgreSQL at {base} (set STEADFAST_TEST_PG): {e}"));
        PgEnv {
            dir: tempfile::tempdir().expect("a temp dir"),
            url,
            rt,
            store,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a flow of `steps` steps, each the logging script `step.sh`,
    /// with `sleeps` giving a step's sleep by name (default 0.02 s).
    pub fn flow(&self, name: &str, steps: usize, sleeps: &[(&str, &str)]) -> PathBuf {
        let script = r#"#!/bin/sh
echo "start $STEADFAST_RUN_ID $STEADFAST_STEP $TAG $(date +%s%N)" >> log
sleep "$1"
echo "end $STEADFAST_RUN_ID $STEADFAST_STEP $TAG $(date +%s%N)" >> log
printf '{"%s": "%s"}\n' "$STEADFAST_STEP" "$TAG"
"#;
        std::fs::write(self.path().join("step.sh"), script).expect("write step.sh");
        let mut text = format!("name = \"{name}\"\n");
        for i in 0..steps {
            let step = format!("s{i}");
            let sleep = sleeps
                .iter()
                .find(|(s, _)| *s == step)
                .map_or("0.02", |(_, d)| d);
            text.push_str(&format!(
                "[[step]]\nname = \"{step}\"\nrun = \"sh step.sh {sleep}\"\ntimeout = \"60s\"\n"
            ));
        }
        let p = self.path().join(format!("{name}.toml"));
        std::fs::write(&p, text).expect("write the flow");
        p
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.current_dir(self.path())
            .arg("--store")
            .arg(&self.url)
            .args(args);
        c
    }

    /// Starts a worker process, tagged `tag`, in a process group of its own,
    /// its stderr in `TAG.err`.
    pub fn worker(&self, tag: &str, flow: &Path, extra: &[&str]) -> Worker {
        use std::os::unix::process::CommandExt;
        let err =
            std::fs::File::create(self.path().join(format!("{tag}.err"))).expect("stderr file");
        let child = self
            .cmd(&["worker", flow.to_str().expect("utf-8 path")])
            .args(extra)
            .env("TAG", tag)
            .stdout(Stdio::null())
            .stderr(err)
            .process_group(0)
            .spawn()
            .expect("spawn a worker");
        Worker {
            child: Some(child),
            tag: tag.to_string(),
        }
    }

    pub fn stderr_of(&self, tag: &str) -> String {
        std::fs::read_to_string(self.path().join(format!("{tag}.err"))).unwrap_or_default()
    }

    /// The step log: one entry per execution.
    pub fn executions(&self) -> Vec<Execution> {
        let text = std::fs::read_to_string(self.path().join("log")).unwrap_or_default();
        let mut open: BTreeMap<(String, String, String), Vec<usize>> = BTreeMap::new();
        let mut out: Vec<Execution> = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let [what, run, step, tag, at] = f[..] else {
                panic!("bad log line {line:?}")
            };
            let at: u128 = at.parse().expect("a time");
            let key = (run.to_string(), step.to_string(), tag.to_string());
            if what == "start" {
                open.entry(key).or_default().push(out.len());
                out.push(Execution {
                    run: run.into(),
                    step: step.into(),
                    tag: tag.into(),
                    start: at,
                    end: None,
                });
            } else if let Some(i) = open.get_mut(&key).and_then(|v| v.pop()) {
                out[i].end = Some(at);
            }
        }
        out
    }

    pub fn count(&self, what: &str) -> usize {
        std::fs::read_to_string(self.path().join("log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(what))
            .count()
    }

    /// Records `n` runs `r000`… of `flow`.
    pub fn start_runs(&self, flow: &Path, n: usize) {
        for i in 0..n {
            let out = self
                .cmd(&[
                    "start",
                    flow.to_str().expect("utf-8"),
                    "--run-id",
                    &format!("r{i:03}"),
                ])
                .output()
                .expect("start");
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Waits until every run has completed (at most `limit`).
    pub fn wait_all_completed(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let runs = self.rt.block_on(
                self.store
                    .list(&ListFilter::new().status(RunStatus::Completed)),
            );
            if let Ok(r) = &runs {
                if r.len() == n {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "not all {n} runs completed in {limit:?}: {runs:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for PgEnv {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.store.drop_schema());
    }
}

/// One execution of a step, from the log (`end` is `None` if it never ended).
#[derive(Clone, Debug)]
pub struct Execution {
    pub run: String,
    pub step: String,
    pub tag: String,
    pub start: u128,
    pub end: Option<u128>,
}

/// A worker process; killed with its group when dropped.
pub struct Worker {
    pub child: Option<Child>,
    pub tag: String,
}

impl Worker {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)
            .expect("signal the worker");
    }

    /// SIGKILLs the worker's whole process group and reaps it.
    pub fn kill_group(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGKILL,
        );
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// SIGTERMs the worker and waits for its exit code.
    pub fn stop(&mut self) -> Option<i32> {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.child
            .take()
            .and_then(|mut c| c.wait().ok())
            .and_then(|s| s.code())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.kill_group();
        }
    }
}

/// Nanoseconds since the Unix epoch, as the step log writes them.
pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}
