//! The OpenTelemetry export: with the standard `OTEL_*` variables naming a
//! collector on 127.0.0.1 (a test collector here, taking OTLP/HTTP JSON),
//! `steadfast run` sends a span for the run, one per step (children of the
//! run's, with step name, index, attempt and outcome) and one per store
//! call; `-v` shows the same spans on stderr.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use support::{code, stderr, Env, TestResult};

/// A collector that keeps every request body sent to `/v1/traces`.
fn collector() -> std::io::Result<(String, Arc<Mutex<Vec<Value>>>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = format!("http://{}", listener.local_addr()?);
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&got);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut line = String::new();
            let mut length = 0usize;
            let mut path = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if path.is_empty() {
                    path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok() && path == "/v1/traces" {
                if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                    keep.lock().unwrap().push(v);
                }
            }
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            );
        }
    });
    Ok((addr, got))
}

/// Every span received: (name, attributes as a JSON object, span id, parent id).
fn spans(bodies: &[Value]) -> Vec<(String, serde_json::Map<String, Value>, String, String)> {
    let mut out = Vec::new();
    for body in bodies {
        for rs in body["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    let mut attrs = serde_json::Map::new();
                    for a in s["attributes"].as_array().into_iter().flatten() {
                        let v = &a["value"];
                        let v = v
                            .get("stringValue")
                            .or_else(|| v.get("intValue"))
                            .or_else(|| v.get("boolValue"))
                            .cloned()
                            .unwrap_or(Value::Null);
                        attrs.insert(a["key"].as_str().unwrap_or("").to_string(), v);
                    }
                    out.push((
                        s["name"].as_str().unwrap_or("").to_string(),
                        attrs,
                        s["spanId"].as_str().unwrap_or("").to_string(),
                        s["parentSpanId"].as_str().unwrap_or("").to_string(),
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn spans_reach_an_otlp_collector_named_by_the_environment() -> TestResult {
    let (addr, got) = collector()?;
    let env = Env::new();
    let f = env.flow(
        "f.toml",
        "name = \"traced\"\n[[step]]\nname = \"one\"\nrun = \"echo '{\\\"a\\\": 1}'\"\n[[step]]\nname = \"two\"\nrun = \"true\"\n",
    );
    let out = env
        .cmd(&["run", f.to_str().ok_or("path")?, "--run-id", "t1"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &addr)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_SERVICE_NAME", "steadfast-test")
        .output()?;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let bodies = got.lock().map_err(|_| "lock")?.clone();
    assert!(!bodies.is_empty(), "the collector received nothing");
    let service = bodies[0]["resourceSpans"][0]["resource"]["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["key"] == "service.name")
        .map(|a| a["value"]["stringValue"].clone());
    assert_eq!(service, Some(Value::from("steadfast-test")));
    let all = spans(&bodies);
    let run: Vec<_> = all.iter().filter(|s| s.0 == "steadfast.run").collect();
    assert_eq!(run.len(), 1, "{all:?}");
    let (_, attrs, run_id, _) = run[0];
    assert_eq!(attrs["run_id"], "t1");
    assert_eq!(attrs["workflow"], "traced");
    assert_eq!(attrs["outcome"], "completed");
    let steps: Vec<_> = all.iter().filter(|s| s.0 == "steadfast.step").collect();
    assert_eq!(steps.len(), 2, "{all:?}");
    for (i, (_, a, _, parent)) in steps.iter().enumerate() {
        assert_eq!(a["step"], ["one", "two"][i]);
        assert_eq!(a["outcome"], "completed");
        assert_eq!(a["attempt"].to_string().trim_matches('"'), "1");
        assert_eq!(parent, run_id, "a step span is not the run's child");
    }
    let stores = all.iter().filter(|s| s.0 == "steadfast.store").count();
    assert!(
        stores >= 3,
        "{stores} store spans: a load and two saves at least"
    );
    Ok(())
}

#[test]
fn verbose_shows_the_spans_on_stderr_and_no_collector_means_none_sent() -> TestResult {
    let env = Env::new();
    let f = env.flow(
        "f.toml",
        "name = \"traced\"\n[[step]]\nname = \"one\"\nrun = \"true\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    let quiet = env.run(&["run", f, "--run-id", "q"]);
    assert!(
        !stderr(&quiet).contains("steadfast.step"),
        "{}",
        stderr(&quiet)
    );
    let out = env.run(&["-v", "run", f, "--run-id", "v"]);
    assert_eq!(code(&out), 0);
    let err = stderr(&out);
    assert!(
        err.contains("steadfast.step{") && err.contains("step=\"one\""),
        "{err}"
    );
    assert!(err.contains("outcome=\"completed\""), "{err}");
    let out = env.run(&["-vv", "show", "v"]);
    assert_eq!(code(&out), 0);
    Ok(())
}

#[test]
fn a_worker_serves_its_counters_and_applies_retention() -> TestResult {
    let env = Env::new();
    let f = env.flow(
        "f.toml",
        "name = \"w\"\n[[step]]\nname = \"one\"\nrun = \"true\"\n[[step]]\nname = \"two\"\nrun = \"true\"\n",
    );
    let f = f.to_str().ok_or("path")?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    assert_eq!(code(&env.run(&["start", f, "--run-id", "m1"])), 0);
    let mut worker = env
        .cmd(&[
            "worker",
            f,
            "--poll",
            "50ms",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--gc-older-than",
            "0s",
            "--gc-every",
            "1s",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let result = (|| -> TestResult {
        // The run completes, then retention deletes it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let shown = env.run(&["show", "m1"]);
            if code(&shown) == 2 {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("run m1 was not collected: {}", stderr(&shown)).into());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut text = String::new();
        conn.read_to_string(&mut text)?;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("steadfast_steps_executed_total 2"), "{text}");
        assert!(text.contains("steadfast_steps_completed_total 2"), "{text}");
        assert!(text.contains("steadfast_conflicts_total 0"), "{text}");
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
        conn.write_all(b"GET /other HTTP/1.1\r\n\r\n")?;
        let mut text = String::new();
        conn.read_to_string(&mut text)?;
        assert!(text.starts_with("HTTP/1.1 404"), "{text}");
        Ok(())
    })();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status();
    let status = worker.wait()?;
    result?;
    assert_eq!(status.code(), Some(0));
    Ok(())
}
