//! `steadfast serve` in a real browser: headless Chromium driven over
//! WebDriver (chromedriver). Approving and rejecting gates through the forms,
//! hostile values in a run's state, id and error that must not execute, and
//! the access token on a non-loopback address.
//!
//! Needs `chromium` and `chromedriver` (Debian's `chromium` and
//! `chromium-driver`, which `.ci/run` installs). Without them the tests say
//! they were skipped, except under CI, where they fail.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use support::{code, stderr, Env, BIN};

/// One browser at a time: the machines have two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const AGENT_FLOW: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/agent/flow.toml"
);

fn tools() -> Option<(PathBuf, PathBuf)> {
    let find = |var: &str, default: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from(default)))
            .filter(|p| p.exists())
    };
    match (
        find("STEADFAST_CHROMIUM", "/usr/bin/chromium"),
        find("STEADFAST_CHROMEDRIVER", "/usr/bin/chromedriver"),
    ) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var("CI").is_ok_and(|v| !v.is_empty()) => {
            panic!("chromium and chromedriver are needed for the browser tests under CI (.ci/run installs Debian's chromium and chromium-driver)")
        }
        _ => {
            eprintln!("skipped: no chromium or chromedriver (install Debian's chromium and chromium-driver)");
            None
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `steadfast serve` on a store, and the address it listens on.
struct Server {
    _child: Killed,
    base: String,
}

fn serve(env: &Env, addr: &str, token: Option<&str>) -> Server {
    serve_with(env, &["--addr", addr], token)
}

fn serve_with(env: &Env, args: &[&str], token: Option<&str>) -> Server {
    // The store by a relative URL (the working directory is the test's), so
    // that the page header and the screenshots show no machine's path.
    let mut c = Command::new(BIN);
    c.current_dir(env.path())
        .args(["--store", "sqlite:runs.db", "serve"])
        .args(args);
    c.stderr(Stdio::piped()).stdout(Stdio::null());
    c.env_remove("STEADFAST_SERVE_TOKEN");
    if let Some(t) = token {
        c.env("STEADFAST_SERVE_TOKEN", t);
    }
    let mut child = c.spawn().expect("start steadfast serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    lines.read_line(&mut line).expect("the serve banner");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .trim_end_matches('/')
        .to_string();
    // An address like 0.0.0.0 is reached on loopback.
    let port = url.rsplit(':').next().expect("a port").to_string();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = lines.read_to_string(&mut rest);
    });
    Server {
        _child: Killed(child),
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// Headless Chromium over chromedriver.
struct Browser {
    client: Client,
    _driver: Killed,
    _profile: tempfile::TempDir,
}

async fn browser(chromium: &Path, driver: &Path) -> Browser {
    // The WebDriver client speaks plain HTTP to chromedriver, but its TLS
    // library wants a crypto provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let port = free_port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let driver = Killed(child);
    let profile = tempfile::tempdir().expect("a profile dir");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1280,900",
                     format!("--user-data-dir={}", profile.path().display())]
        }),
    );
    let start = Instant::now();
    let client = loop {
        match ClientBuilder::rustls()
            .expect("a TLS config")
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(c) => break c,
            Err(e) if start.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("cannot start a browser session: {e}"),
        }
    };
    Browser {
        client,
        _driver: driver,
        _profile: profile,
    }
}

/// What the page runs that it should not: a global a payload sets, images
/// with the payload's source, inline scripts, an open alert.
async fn assert_nothing_ran(c: &Client, page: &str) {
    let found = c
        .execute(
            "return [typeof window.__xss, document.querySelectorAll('img').length, \
             document.querySelectorAll('script:not([src])').length, \
             Array.from(document.querySelectorAll('*')).filter(function (e) { \
               return Array.from(e.attributes).some(function (a) { return a.name.indexOf('on') === 0; }); \
             }).length];",
            vec![],
        )
        .await
        .expect("run the check");
    assert_eq!(
        found,
        json!(["undefined", 0, 0, 0]),
        "something from a run was executed or injected on {page}"
    );
    assert!(
        c.get_alert_text().await.is_err(),
        "an alert opened on {page}"
    );
}

async fn fill(c: &Client, form: &str, field: &str, value: &str) {
    let el = c
        .find(Locator::Css(&format!("{form} [name=\"{field}\"]")))
        .await
        .unwrap_or_else(|e| panic!("no field {field} in {form}: {e}"));
    el.send_keys(value).await.expect("type");
}

/// Waits until the text of `css` passes `ok` (the page may be replaced
/// under a lookup by a navigation or a refresh), and returns it.
async fn wait_text(c: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(15) {
        if let Ok(el) = c.find(Locator::Css(css)).await {
            if let Ok(t) = el.text().await {
                if ok(&t) {
                    return t;
                }
                last = t;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{css} never showed what was expected; last seen: {last:?}");
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    std::fs::write(dir.join(name), &png).expect("write screenshot");
    if std::env::var("STEADFAST_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/serve");
        std::fs::create_dir_all(&docs).expect("docs/serve");
        std::fs::write(docs.join(name), &png).expect("write docs screenshot");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Starts the example agent as run `id`; it stops at its review gate.
fn agent_run(env: &Env, id: &str) {
    let out = env.run(&["run", AGENT_FLOW, "--run-id", id]);
    assert_eq!(
        code(&out),
        4,
        "run {id} should wait at its gate: {}",
        stderr(&out)
    );
}

#[test]
fn approve_from_the_inbox_then_the_run_completes_and_reject_from_the_run_page() {
    let Some((chromium, driver)) = tools() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let env = Env::new();
    // A finished run and a failed one beside the three waiting, for the
    // list and the screenshots.
    agent_run(&env, "agent-done");
    let out = env.run(&[
        "approve",
        "agent-done",
        "review",
        "--by",
        "Katherine Johnson",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["run", AGENT_FLOW, "--run-id", "agent-done"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let failing = env.flow(
        "flaky.toml",
        "name = \"flaky-tool\"\n[[step]]\nname = \"fetch\"\nrun = \"echo upstream returned 503 >&2; exit 1\"\nretries = 1\nbackoff = \"10ms\"\n",
    );
    let out = env.run(&[
        "run",
        failing.to_str().expect("path"),
        "--run-id",
        "tool-call-17",
    ]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    for id in ["agent-approve", "agent-reject", "agent-later"] {
        agent_run(&env, id);
    }
    let server = serve(&env, "127.0.0.1:0", None);
    runtime().block_on(async {
        let b = browser(&chromium, &driver).await;
        let c = &b.client;
        c.goto(&format!("{}/runs", server.base))
            .await
            .expect("runs page");
        screenshot(c, "runs.png").await;
        c.goto(&format!("{}/runs/agent-done", server.base))
            .await
            .expect("run page");
        screenshot(c, "run.png").await;
        c.goto(&format!("{}/inbox", server.base))
            .await
            .expect("inbox");
        screenshot(c, "inbox.png").await;
        wait_text(c, "main p.muted", |t| t.starts_with("3 run(s) waiting")).await;

        let form = "form[action=\"/runs/agent-approve/approve\"]";
        fill(c, form, "data", r#"{"note": "ship it"}"#).await;
        fill(c, form, "by", "Ada Lovelace").await;
        c.find(Locator::Css(&format!("{form} button")))
            .await
            .expect("approve button")
            .click()
            .await
            .expect("click");
        // Back in the inbox, the run shows the decision instead of the forms.
        wait_text(c, "main .inbox-item p.decided", |t| {
            t.starts_with("Approved by Ada Lovelace")
        })
        .await;
        assert!(
            c.find(Locator::Css(form)).await.is_err(),
            "the approve form is gone once the gate is decided"
        );

        c.goto(&format!("{}/runs/agent-reject", server.base))
            .await
            .expect("run page");
        let form = "form[action=\"/runs/agent-reject/reject\"]";
        fill(c, form, "reason", "the sources are too old").await;
        fill(c, form, "by", "Grace Hopper").await;
        c.find(Locator::Css(&format!("{form} button")))
            .await
            .expect("reject button")
            .click()
            .await
            .expect("click");
        c.wait()
            .for_element(Locator::Css("span.badge.rejected"))
            .await
            .expect("the run shows rejected");
        b.client.clone().close().await.expect("close the browser");
    });

    // The decisions are recorded exactly as `steadfast approve` records them.
    let approved = env.show("agent-approve");
    let d = &approved["decisions"][0];
    assert_eq!(d["by"], json!("Ada Lovelace"));
    assert_eq!(d["approved"], json!(true));
    assert_eq!(d["data"], json!({"note": "ship it"}));
    let out = env.run(&["run", AGENT_FLOW, "--run-id", "agent-approve"]);
    assert_eq!(
        code(&out),
        0,
        "the approved run completes: {}",
        stderr(&out)
    );
    assert_eq!(env.show("agent-approve")["status"], json!("completed"));

    let rejected = env.show("agent-reject");
    assert_eq!(rejected["status"], json!("rejected"));
    assert_eq!(rejected["decisions"][0]["by"], json!("Grace Hopper"));
    assert_eq!(
        rejected["decisions"][0]["reason"],
        json!("the sources are too old")
    );
    assert_eq!(env.show("agent-later")["status"], json!("waiting"));
}

fn url(s: &str) -> url::Url {
    url::Url::parse(s).expect("a URL")
}

const SCRIPT: &str = "<script>window.__xss=1</script>";
const IMG: &str = "\"><img src=x onerror=window.__xss=2>";

#[test]
fn hostile_values_in_state_id_and_error_are_shown_not_run() {
    let Some((chromium, driver)) = tools() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let env = Env::new();
    let payload = json!({"x": SCRIPT, "y": IMG, "<b>key</b>": "v"}).to_string();
    let flow = env.flow(
        "hostile.toml",
        "name = '<b>hostile</b>'\n\
         [[step]]\nname = '\"><img src=x onerror=window.__xss=6>'\nrun = \"cat payload.json\"\n\
         [[step]]\nname = '\" onfocus=\"window.__xss=7'\ngate = true\n",
    );
    std::fs::write(env.path().join("payload.json"), &payload).expect("payload");
    let failing = env.flow(
        "failing.toml",
        "name = \"failing\"\n[[step]]\nname = \"boom\"\nrun = \"echo '<img src=x onerror=window.__xss=4>' >&2; exit 1\"\nretries = 0\n",
    );
    let hostile_id = "\"><img src=x onerror=window.__xss=3>";
    let out = env.run(&["run", flow.to_str().expect("path"), "--run-id", hostile_id]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let out = env.run(&["run", flow.to_str().expect("path"), "--run-id", "plain-id"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let out = env.run(&[
        "run",
        failing.to_str().expect("path"),
        "--run-id",
        "<script>window.__xss=5</script>",
    ]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));

    let server = serve(&env, "127.0.0.1:0", None);
    runtime().block_on(async {
        let b = browser(&chromium, &driver).await;
        let c = &b.client;
        let seg = |s: &str| {
            s.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect::<String>()
        };
        let pages = [
            "/runs".to_string(),
            "/inbox".to_string(),
            format!("/runs/{}", seg(hostile_id)),
            "/runs/plain-id".to_string(),
            format!("/runs/{}", seg("<script>window.__xss=5</script>")),
        ];
        for p in &pages {
            c.goto(&format!("{}{p}", server.base)).await.expect("page");
            assert_nothing_ran(c, p).await;
        }
        // The values are there, as text.
        c.goto(&format!("{}/runs/plain-id", server.base))
            .await
            .expect("page");
        let state = c
            .find(Locator::Css("#state pre"))
            .await
            .expect("state")
            .text()
            .await
            .expect("text");
        assert!(state.contains("<script>window.__xss=1</script>"), "{state}");
        assert!(
            state.contains("<img src=x onerror=window.__xss=2>"),
            "{state}"
        );
        c.goto(&format!(
            "{}/runs/{}",
            server.base,
            seg("<script>window.__xss=5</script>")
        ))
        .await
        .expect("page");
        let error = c
            .find(Locator::Css("div.error pre"))
            .await
            .expect("error box")
            .text()
            .await
            .expect("text");
        assert!(
            error.contains("<img src=x onerror=window.__xss=4>"),
            "{error}"
        );
        c.goto(&format!("{}/runs", server.base))
            .await
            .expect("page");
        let ids = c
            .find(Locator::Css("table"))
            .await
            .expect("table")
            .text()
            .await
            .expect("text");
        assert!(ids.contains(hostile_id), "{ids}");
        // Refreshing in place (the page fetches itself and swaps its
        // content; a run waiting at a gate changes every time, its gate bar
        // ending now) inserts nothing either.
        c.goto(&format!("{}/runs/plain-id", server.base))
            .await
            .expect("page");
        c.execute(
            "document.querySelector('#content h1').setAttribute('data-old', '1');",
            vec![],
        )
        .await
        .expect("mark the content");
        tokio::time::sleep(Duration::from_secs(4)).await;
        let swapped = c
            .execute(
                "return document.querySelector('#content h1[data-old]') === null;",
                vec![],
            )
            .await
            .expect("look");
        assert_eq!(
            swapped,
            json!(true),
            "the page refreshed its content in place"
        );
        assert_nothing_ran(c, "a run page after a refresh").await;
        b.client.clone().close().await.expect("close the browser");
    });
}

/// A bare HTTP/1.1 request; the status code and body.
fn http(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn a_non_loopback_address_needs_a_token_and_posts_need_the_csrf_token() {
    let Some((chromium, driver)) = tools() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let env = Env::new();
    agent_run(&env, "guarded");

    // Refused without a token.
    let out = env
        .cmd(&["serve", "--addr", "0.0.0.0:0"])
        .env_remove("STEADFAST_SERVE_TOKEN")
        .output()
        .expect("serve");
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("needs an access token"),
        "{}",
        stderr(&out)
    );
    // A short token is no lock.
    let out = env
        .cmd(&["serve", "--addr", "0.0.0.0:0"])
        .env("STEADFAST_SERVE_TOKEN", "short")
        .output()
        .expect("serve");
    assert_eq!(code(&out), 2, "{}", stderr(&out));

    // Without a token, only requests naming a loopback host are served: a
    // page elsewhere pointing its own name at 127.0.0.1 (DNS rebinding) is
    // turned away.
    let open = serve(&env, "127.0.0.1:0", None);
    let port = open.base.rsplit(':').next().expect("port").to_string();
    let rebound = format!("rebind.example:{port}");
    let (status, _) = http(&open.base, "GET", "/api/runs", &[("Host", &rebound)], "");
    assert_eq!(status, 421);
    let local = format!("localhost:{port}");
    let (status, _) = http(&open.base, "GET", "/api/runs", &[("Host", &local)], "");
    assert_eq!(status, 200);
    drop(open);

    let token = "correct-horse-battery-staple-42";
    let server = serve(&env, "0.0.0.0:0", Some(token));
    let (status, body) = http(&server.base, "GET", "/api/runs", &[], "");
    assert_eq!(status, 401, "{body}");
    let (status, _) = http(
        &server.base,
        "GET",
        "/api/runs",
        &[("Authorization", "Bearer wrong-token-wrong-token")],
        "",
    );
    assert_eq!(status, 401);
    let (status, body) = http(
        &server.base,
        "GET",
        "/api/runs",
        &[("Authorization", &format!("Bearer {token}"))],
        "",
    );
    assert_eq!(status, 200);
    let runs: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(runs[0]["run_id"], json!("guarded"));
    // A POST without the page's CSRF token changes nothing.
    let (status, _) = http(
        &server.base,
        "POST",
        "/runs/guarded/approve",
        &[
            ("Authorization", &format!("Bearer {token}")),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "gate=review&by=mallory",
    );
    assert_eq!(status, 403);
    assert_eq!(env.show("guarded")["status"], json!("waiting"));

    runtime().block_on(async {
        let b = browser(&chromium, &driver).await;
        let c = &b.client;
        c.goto(&format!("{}/runs", server.base))
            .await
            .expect("runs");
        c.wait()
            .for_url(&url(&format!("{}/login", server.base)))
            .await
            .expect("sent to the login page");
        fill(c, "form", "token", "not-the-token-at-all").await;
        c.find(Locator::Css("form button"))
            .await
            .expect("button")
            .click()
            .await
            .expect("click");
        wait_text(c, "div.error", |t| t.contains("not the access token")).await;
        fill(c, "form", "token", token).await;
        c.find(Locator::Css("form button"))
            .await
            .expect("button")
            .click()
            .await
            .expect("click");
        c.wait()
            .for_url(&url(&format!("{}/runs", server.base)))
            .await
            .expect("the runs list");
        let table = c
            .find(Locator::Css("table"))
            .await
            .expect("table")
            .text()
            .await
            .expect("text");
        assert!(table.contains("guarded"), "{table}");
        b.client.clone().close().await.expect("close the browser");
    });
}

#[test]
fn a_client_slow_to_send_its_headers_is_cut_off() {
    let env = Env::new();
    agent_run(&env, "slow");
    let server = serve_with(
        &env,
        &["--addr", "127.0.0.1:0", "--header-timeout", "300ms"],
        None,
    );
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // Half a request line, then nothing.
    s.write_all(b"GET /runs HTTP/1.1\r\nHost: ").expect("send");
    let started = Instant::now();
    let mut buf = Vec::new();
    let read = s.read_to_end(&mut buf);
    assert!(
        read.is_ok(),
        "the server closed the connection rather than leaving it open: {read:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed only after {:?}",
        started.elapsed()
    );
    // A client that sends its request is served as before.
    let (status, body) = http(&server.base, "GET", "/api/runs", &[], "");
    assert_eq!(status, 200, "{body}");
    let out = env
        .cmd(&["serve", "--header-timeout", "1ms"])
        .output()
        .expect("serve");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

/// Runs `cmd`, which must exit within 20 s (else it is killed and the test
/// fails naming `what`): its exit code and standard error.
fn exits_within(cmd: &mut Command, what: &str) -> (Option<i32>, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("serve did not exit on {what}: it hung or started serving");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    (status.code(), err)
}

#[test]
fn hostile_requests_get_clear_errors_and_change_nothing() {
    let env = Env::new();
    agent_run(&env, "g1");
    let before = env.show("g1");
    let server = serve(&env, "127.0.0.1:0", None);
    let page = http(&server.base, "GET", "/runs/g1", &[], "").1;
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a CSRF token in the page")
        .to_string();
    let long_id = format!("/runs/{}", "x".repeat(5000));
    for (path, status) in [
        ("/runs/%FF%FE", 400),
        (long_id.as_str(), 409),
        ("/runs?limit=0", 400),
        ("/runs?limit=-1", 400),
        ("/runs?limit=abc", 400),
        ("/runs?limit=99999999999999999999999", 400),
        ("/runs?status=bogus", 400),
        ("/api/runs/%00", 409),
        ("/api/runs/no-such-run", 404),
    ] {
        let (got, body) = http(&server.base, "GET", path, &[], "");
        assert_eq!(got, status, "{path}: {body}");
    }
    // Odd headers: an empty Host is no loopback name (421), nor is a request
    // with none (HTTP/1.0); 150 headers are refused by the connection (431)
    // and the server goes on serving.
    let (got, _) = http(&server.base, "GET", "/runs", &[("Host", "")], "");
    assert_eq!(got, 421);
    // Host names are case-insensitive.
    let port = server.base.rsplit(':').next().expect("port").to_string();
    for host in [format!("LocalHost:{port}"), format!("LOCALHOST:{port}")] {
        let (got, _) = http(&server.base, "GET", "/runs", &[("Host", &host)], "");
        assert_eq!(got, 200, "{host}");
    }
    let names: Vec<String> = (0..150).map(|i| format!("X-Many-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    assert_eq!(http(&server.base, "GET", "/runs", &many, "").0, 431);
    let mut old = TcpStream::connect(server.base.trim_start_matches("http://")).expect("connect");
    old.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    old.write_all(b"GET /runs HTTP/1.0\r\n\r\n").expect("send");
    let mut answer = String::new();
    old.read_to_string(&mut answer).expect("read");
    assert!(answer.starts_with("HTTP/1.0 421"), "{answer}");
    assert_eq!(http(&server.base, "GET", "/runs", &[], "").0, 200);
    let form = |data: &str, by: &str| {
        format!(
            "csrf={csrf}&gate=review&by={by}&data={}",
            data.bytes()
                .map(|b| format!("%{b:02X}"))
                .collect::<String>()
        )
    };
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let long_by = "y".repeat(1000);
    for (body, status, says) in [
        (form(&deep, "x"), 400, "recursion limit"),
        (form("{\"a\": NaN}", "x"), 400, "not JSON"),
        (
            form("{\"a\": 123456789012345678901234567890}", "x"),
            400,
            "64 bits",
        ),
        // A name the engine cannot record is the request's fault: 400.
        (form("{}", &long_by), 400, "limit is 200"),
        (form("{}", "ada%07"), 400, "control character U+0007"),
        (
            form("{}", "x").replace("gate=review", "gate=rev%0Aiew"),
            400,
            "control character U+000A",
        ),
        (form("{}", ""), 400, "your name"),
        (format!("a={}", "x".repeat(3_000_000)), 413, ""),
    ] {
        let (got, text) = http(
            &server.base,
            "POST",
            "/runs/g1/approve",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            &body,
        );
        assert_eq!(
            got,
            status,
            "{}",
            text.chars().take(300).collect::<String>()
        );
        assert!(
            text.contains(says),
            "{says:?} not in {}",
            text.chars().take(300).collect::<String>()
        );
    }
    // Nothing above was recorded.
    assert_eq!(env.show("g1")["decisions"], before["decisions"]);
    assert_eq!(env.show("g1")["version"], before["version"]);

    // Token files: empty, missing, not UTF-8, a directory, too large.
    let files = env.path().join("tokens");
    std::fs::create_dir_all(&files).expect("dir");
    std::fs::write(files.join("empty"), "").expect("write");
    std::fs::write(files.join("binary"), b"\xff\xfe-not-utf8-token-xx").expect("write");
    std::fs::write(files.join("huge"), "t".repeat(1 << 20)).expect("write");
    std::fs::write(files.join("shared"), "a-long-enough-token-0123").expect("write");
    use std::os::unix::fs::PermissionsExt;
    for name in ["empty", "binary", "huge"] {
        std::fs::set_permissions(files.join(name), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
    }
    std::fs::set_permissions(files.join("shared"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    for (name, says) in [
        // Others may read it: refused as a key file is, with the same words.
        (
            "shared",
            "can be read or changed by others (mode 644); chmod 600 it",
        ),
        ("empty", "at least 16"),
        ("missing", "No such file"),
        ("binary", "UTF-8"),
        (".", "directory"),
        ("huge", "over 4096 bytes"),
    ] {
        let path = files.join(name);
        let (status, err) = exits_within(
            env.cmd(&["serve", "--addr", "0.0.0.0:0", "--token-file"])
                .arg(&path),
            name,
        );
        assert_eq!(status, Some(2), "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
    }
    // A FIFO as the token file is refused at once (opening it would wait
    // for a writer forever).
    let fifo = files.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let (status, err) = exits_within(
        env.cmd(&["serve", "--addr", "0.0.0.0:0", "--token-file"])
            .arg(&fifo),
        "a FIFO as the token file",
    );
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    // A token variable that is set but unusable is an error, even on a
    // loopback address: never a server without the lock that was asked for.
    use std::os::unix::ffi::OsStrExt;
    for (value, says) in [
        (
            std::ffi::OsStr::from_bytes(b"\xff\xfe-not-utf8-token-xx"),
            "not valid UTF-8",
        ),
        (std::ffi::OsStr::new("   "), "at least 16"),
    ] {
        let mut cmd = env.cmd(&["serve", "--addr", "127.0.0.1:0"]);
        cmd.env("STEADFAST_SERVE_TOKEN", value);
        let (status, err) = exits_within(&mut cmd, "a token variable that is set but unusable");
        assert_eq!(status, Some(2), "{value:?}: {err}");
        assert!(err.contains(says), "{value:?}: {err}");
    }
    // A second server on the same address is refused, not shared.
    let port = server.base.rsplit(':').next().expect("port").to_string();
    let out = env
        .cmd(&["serve", "--addr", &format!("127.0.0.1:{port}")])
        .output()
        .expect("serve");
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("cannot listen"), "{}", stderr(&out));
}

#[test]
fn a_corrupt_record_is_an_error_naming_the_run_never_an_empty_list() {
    let env = Env::new();
    agent_run(&env, "fine");
    agent_run(&env, "broken");
    let db = env.path().join("runs.db");
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(\"UPDATE runs SET snapshot = '{\\\"a\\\": tru' WHERE run_id = 'broken'\"); c.commit()")
        .arg(&db)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", stderr(&out));
    let server = serve(&env, "127.0.0.1:0", None);
    let (status, body) = http(&server.base, "GET", "/runs/broken", &[], "");
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("broken") && body.contains("corrupt"),
        "{body}"
    );
    let (status, body) = http(&server.base, "GET", "/api/runs/broken", &[], "");
    assert_eq!(status, 500, "{body}");
    let err: Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains("\"broken\"")),
        "{body}"
    );
    // The list and the inbox still show every run, the unreadable one named.
    let (status, body) = http(&server.base, "GET", "/runs", &[], "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(">broken<") && body.contains(">fine<"),
        "{body}"
    );
    let (status, body) = http(&server.base, "GET", "/inbox", &[], "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("cannot be read") && body.contains("broken"),
        "{body}"
    );
    assert!(
        body.contains("/runs/fine/approve"),
        "the readable run keeps its forms"
    );
}

/// A run page shows the run's events as they happen, over Server-Sent
/// Events; when the server goes away and comes back, the browser reconnects
/// with the last event's number and the list goes on without a gap or a
/// repeat.
#[test]
fn a_run_page_streams_events_and_continues_after_a_reconnect() {
    let Some((chromium, driver)) = tools() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let env = Env::new();
    let flow = env.flow(
        "flow.toml",
        r#"name = "streamer"

[[step]]
name = "talk"
run = '''python3 -c 'import os, time
for i in range(40):
    os.write(3, (chr(123) + "\"i\": %d" % i + chr(125) + "\n").encode())
    time.sleep(0.1)
print("{}")' '''

[[step]]
name = "check"
gate = true
"#,
    );
    let mut run = env
        .cmd(&["run", flow.to_str().unwrap(), "--run-id", "live"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the run");
    // The page needs the run: it exists once its first step has begun.
    let start = Instant::now();
    while env.run(&["show", "live"]).status.code() != Some(0) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the run never appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = serve(&env, &addr, None);
    let rt = runtime();
    rt.block_on(async {
        let b = browser(&chromium, &driver).await;
        let c = &b.client;
        c.goto(&format!("{}/runs/live", server.base)).await.expect("open the run page");
        wait_text(c, "#events-state", |t| t == "live").await;
        let count = || async {
            c.execute("return document.querySelectorAll('#event-list li.event').length;", vec![])
                .await
                .expect("count")
                .as_u64()
                .unwrap_or(0)
        };
        let start = Instant::now();
        while count().await < 8 {
            assert!(start.elapsed() < Duration::from_secs(20), "no events arrived");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The server goes away mid-stream and comes back on the same port.
        drop(server);
        let before = count().await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        let again = serve(&env, &addr, None);
        wait_text(c, "#events-state", |t| t == "waiting").await;
        let lines: Vec<String> = c
            .execute(
                "return Array.from(document.querySelectorAll('#event-list li.event')).map(function (l) { return l.textContent; });",
                vec![],
            )
            .await
            .expect("the lines")
            .as_array()
            .expect("a list")
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect();
        let seqs: Vec<u64> = lines
            .iter()
            .map(|l| l[1..].split(' ').next().unwrap().parse().expect("#N"))
            .collect();
        assert_eq!(seqs, (1..=40).collect::<Vec<u64>>(), "{lines:?}");
        assert!(
            before < 40,
            "the server went away after every event had arrived ({before}): no reconnect was tested"
        );
        assert!(lines[39].ends_with(r#"{"i":39}"#), "{}", lines[39]);
        assert_nothing_ran(c, "the run page with events").await;
        screenshot(c, "events.png").await;
        c.clone().close().await.expect("close the browser");

        // What the browser sent on reconnecting, by hand: the events after
        // the number given, the execution not announced again, and the
        // stream's end.
        let (status, body) = http(
            &again.base,
            "GET",
            "/runs/live/events",
            &[("Last-Event-ID", "38")],
            "",
        );
        assert_eq!(status, 200, "{body}");
        let ids: Vec<&str> = body.lines().filter(|l| l.starts_with("id:")).collect();
        assert_eq!(ids, ["id: 39", "id: 40"], "{body}");
        assert!(!body.contains("event: started"), "{body}");
        assert!(body.contains("event: waiting"), "{body}");
        // No stream for a run there is not.
        let (status, body) = http(&again.base, "GET", "/runs/nope/events", &[], "");
        assert_eq!(status, 404, "{body}");
    });
    assert_eq!(run.wait().expect("the run ends").code(), Some(4));
}
