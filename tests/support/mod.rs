//! Helpers for tests that re-run the test binary as a child process.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use steadfast::Store;

/// The environment variable that tells a re-executed test binary which role to play.
pub const ROLE: &str = "STEADFAST_TEST_ROLE";

/// The role this process was started for, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Starts this test binary again, running only `test` (whose body checks
/// [`role`] first), with `role` and extra environment variables.
pub fn spawn_child(test: &str, role: &str, store: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("STEADFAST_TEST_STORE", store)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn the child test process")
}

/// The store URL a child was given.
pub fn child_store_url() -> String {
    std::env::var("STEADFAST_TEST_STORE").expect("STEADFAST_TEST_STORE is set for children")
}

/// The URL of a store of kind `scheme` (`file` or `sqlite`) inside `dir`.
pub fn store_url(scheme: &str, dir: &Path) -> String {
    match scheme {
        "file" => format!("file:{}", dir.join("runs.json").display()),
        "sqlite" => format!("sqlite:{}", dir.join("runs.db").display()),
        other => panic!("no test store for {other}"),
    }
}

/// Opens a store from its URL, panicking with the reason if it cannot. It
/// opens on a thread of its own, so it may be called in or out of a runtime
/// (the file and SQLite stores need none afterwards).
pub fn open(url: &str) -> Arc<dyn Store> {
    std::thread::scope(|s| {
        s.spawn(|| runtime().block_on(steadfast::open_store(url)))
            .join()
            .expect("the opening thread")
    })
    .unwrap_or_else(|e| panic!("open {url}: {e}"))
}

/// A current-thread runtime for a child's or a parent's async part.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The number of iterations a test should use: `default`, or the value of `var`.
pub fn count_from_env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
pub mod simfs;

/// A child process that is killed and reaped when dropped, so a failing test
/// leaves no process behind.
pub struct Reaped(pub Child);

impl Reaped {
    /// Sends SIGKILL and waits for the child.
    pub fn kill(mut self) -> std::io::Result<()> {
        self.0.kill()?;
        self.0.wait().map(drop)
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The PostgreSQL server the tests use: `$STEADFAST_TEST_PG`, else the local
/// one that CI starts. Tests never skip for want of it: they fail, naming it.
pub fn pg_server_url() -> String {
    std::env::var("STEADFAST_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A schema of its own on the test server, dropped with everything in it
/// when the guard is dropped.
pub struct PgSchema {
    /// The store URL naming the schema.
    pub url: String,
}

impl PgSchema {
    /// A fresh, not yet created schema.
    pub fn new() -> Self {
        let base = pg_server_url();
        let sep = if base.contains('?') { '&' } else { '?' };
        PgSchema {
            url: format!("{base}{sep}schema=t_{:016x}", fastrand::u64(..)),
        }
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let url = self.url.clone();
        steadfast_conformance::block_on_own_thread(move || async move {
            let opts = steadfast::postgres::PgOptions::default().create(false);
            if let Ok(s) = steadfast::postgres::PgStore::connect_with(&url, opts).await {
                let _ = s.drop_schema().await;
            }
        });
    }
}

/// The URL of a fresh store of kind `scheme`: in `dir` for `file` and
/// `sqlite`, in a schema of its own (dropped with the guard) for `postgres`.
pub fn fresh_store_url(scheme: &str, dir: &Path) -> (String, Option<PgSchema>) {
    match scheme {
        "postgres" => {
            let schema = PgSchema::new();
            (schema.url.clone(), Some(schema))
        }
        other => (store_url(other, dir), None),
    }
}
