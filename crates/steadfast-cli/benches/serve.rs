//! How long `steadfast serve` takes to answer with 100,000 runs in a SQLite
//! store: the first page of the runs list, a page deep in it, a filtered
//! page, the inbox and the JSON list, each over real HTTP.
//!
//! `cargo bench -p steadfast-cli --bench serve` (STEADFAST_SERVE_BENCH_RUNS
//! changes the number of runs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;

struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A store with `n` runs: one in ten waiting at a gate, one in ten failed,
/// the rest pending and unclaimed (so that each listed run is read again for
/// its stuck label, the list's slowest case).
fn populate(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite:{}/runs.db", dir.path().display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let store = steadfast::open_store(&url).await.expect("the store");
        let gate = std::sync::Arc::new(
            steadfast::Workflow::builder("triage")
                .push(steadfast::Step::gate("review"))
                .build()
                .expect("a workflow"),
        );
        let failing = std::sync::Arc::new(
            steadfast::Workflow::builder("fetch")
                .step("fetch", |_ctx, _state| async {
                    Err(steadfast::StepError::terminal("upstream returned 503"))
                })
                .build()
                .expect("a workflow"),
        );
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let (store, gate, failing) = (store.clone(), gate.clone(), failing.clone());
            tasks.spawn(async move {
                let id = format!("run-{i:06}");
                let input =
                    json!({"ticket": i, "text": "summarize the attached thread and draft a reply"});
                let workflow = if i % 10 == 1 { "fetch" } else { "triage" };
                steadfast::start(&*store, workflow, &id, input, false)
                    .await
                    .expect("start a run");
                match i % 10 {
                    0 => {
                        let out = steadfast::run(&id, &gate, &*store)
                            .await
                            .expect("runs to its gate");
                        assert!(matches!(out, steadfast::Outcome::Waiting { .. }), "{out:?}");
                    }
                    1 => {
                        let failed = steadfast::run(&id, &failing, &*store).await;
                        assert!(failed.is_err(), "the step fails");
                    }
                    _ => {}
                }
            });
            if tasks.len() >= 256 {
                tasks.join_next().await;
            }
        }
        while tasks.join_next().await.is_some() {}
    });
    dir
}

fn serve(dir: tempfile::TempDir) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .current_dir(dir.path())
        .args([
            "--store",
            "sqlite:runs.db",
            "serve",
            "--addr",
            "127.0.0.1:0",
        ])
        .env_remove("STEADFAST_SERVE_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start steadfast serve");
    let mut line = String::new();
    BufReader::new(child.stderr.take().expect("stderr"))
        .read_line(&mut line)
        .expect("the banner");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .expect("an address")
        .trim_end_matches('/')
        .to_string();
    Server {
        child,
        addr,
        _dir: dir,
    }
}

fn get(addr: &str, path: &str) -> usize {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{path}: {}",
        String::from_utf8_lossy(&out[..out.len().min(300)])
    );
    out.len()
}

fn get_body(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

fn bench(c: &mut Criterion) {
    let n: usize = std::env::var("STEADFAST_SERVE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = populate(n);
    let server = serve(dir);
    // The mix is what the figures claim: a tenth waiting, a tenth failed.
    let waiting = get_body(&server.addr, "/api/inbox");
    assert!(
        waiting.contains("\"gate\":\"review\""),
        "runs wait in the inbox"
    );
    let failed = get_body(&server.addr, "/api/runs?status=failed&limit=1");
    assert!(failed.contains("\"status\":\"failed\""), "runs failed");
    let addr = server.addr.clone();
    let deep = format!("/runs?after=run-{:06}", n / 2);
    let mut g = c.benchmark_group(format!("serve@{n}"));
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for (name, path) in [
        ("runs first page", "/runs"),
        ("runs page at the middle", deep.as_str()),
        ("runs filtered by status", "/runs?status=failed"),
        ("inbox", "/inbox"),
        ("api runs", "/api/runs"),
    ] {
        g.bench_function(name, |b| b.iter(|| get(&addr, path)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
