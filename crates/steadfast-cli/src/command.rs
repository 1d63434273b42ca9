//! Command steps: a shell command gets the state as JSON on stdin and prints its
//! update as one JSON object (or nothing) on stdout.
//!
//! Each command runs in a process group of its own under a small supervisor
//! (this same binary, `__supervise`), which asks the kernel to signal it when
//! `steadfast` dies and then kills the whole group. A timeout, or a run loop
//! that gives the step up, kills the group too. So a resumed run never races
//! a step process left over from a crashed one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use steadfast::{State, Step, StepCtx, StepError, Update};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// How much of stderr's end goes into a step's error.
const STDERR_TAIL: usize = 2048;

/// One command step, as a flow file describes it.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    /// The command, run with `sh -c`.
    pub run: String,
    /// Its working directory.
    pub workdir: PathBuf,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Kill the process group after this long.
    pub timeout: Option<Duration>,
    /// Fail when stdout exceeds this many bytes.
    pub output_limit: usize,
}

impl CommandSpec {
    /// The workflow step that runs this command.
    pub fn into_step(self, name: &str) -> Step {
        let spec = Arc::new(self);
        Step::new(name, move |ctx, state| {
            let spec = Arc::clone(&spec);
            async move { run(&spec, ctx, state).await }
        })
    }
}

/// Kills the process group when dropped, unless disarmed: a step future that
/// is dropped (timeout, lost lease) leaves nothing running.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

async fn run(spec: &CommandSpec, ctx: StepCtx, state: Arc<State>) -> Result<Update, StepError> {
    let exe = std::env::current_exe()
        .map_err(|e| StepError::terminal(format!("cannot find the steadfast binary: {e}")))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("__supervise")
        .arg(&spec.run)
        .current_dir(&spec.workdir)
        .env("STEADFAST_RUN_ID", ctx.run_id())
        .env("STEADFAST_STEP", ctx.step())
        .env("STEADFAST_STEP_INDEX", ctx.index().to_string())
        .env("STEADFAST_ATTEMPT", ctx.attempt().to_string())
        .env("STEADFAST_IDEMPOTENCY_KEY", ctx.idempotency_key())
        .envs(&spec.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        StepError::retryable(format!(
            "cannot start `{}` in {}: {e}",
            spec.run,
            spec.workdir.display()
        ))
    })?;
    let mut guard = GroupGuard(child.id().map(|id| Pid::from_raw(id as i32)));

    let input = serde_json::to_vec(&*state).map_err(|e| StepError::terminal(e.to_string()))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| StepError::terminal("no stdin pipe"))?;
    let writer = tokio::spawn(async move {
        // A command that does not read its input closes the pipe: not an error.
        let _ = stdin.write_all(&input).await;
        let _ = stdin.shutdown().await;
    });
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| StepError::terminal("no stdout pipe"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| StepError::terminal("no stderr pipe"))?;
    let limit = spec.output_limit;
    let out_task = tokio::spawn(read_limited(stdout, limit));
    let err_task = tokio::spawn(read_tail(stderr, STDERR_TAIL));

    let waited = match spec.timeout {
        Some(t) => tokio::time::timeout(t, child.wait()).await.ok(),
        None => Some(child.wait().await),
    };
    let status = match waited {
        Some(status) => {
            status.map_err(|e| StepError::retryable(format!("waiting for `{}`: {e}", spec.run)))?
        }
        None => {
            drop(guard);
            let tail = err_task.await.unwrap_or_default();
            return Err(StepError::retryable(format!(
                "`{}` timed out after {}; its process group was killed{}",
                spec.run,
                humantime::format_duration(spec.timeout.unwrap_or_default()),
                tail_note(&tail)
            )));
        }
    };
    // The command is done; anything it left in its group goes with it.
    if let Some(pgid) = guard.0.take() {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    let _ = writer.await;
    let out = out_task
        .await
        .map_err(|e| StepError::retryable(e.to_string()))?;
    let tail = err_task.await.unwrap_or_default();
    if !status.success() {
        let how = match status.code() {
            Some(code) => format!("exited with code {code}"),
            None => "was killed by a signal".to_string(),
        };
        return Err(StepError::retryable(format!(
            "`{}` {how}{}",
            spec.run,
            tail_note(&tail)
        )));
    }
    let out = match out {
        Output::Complete(bytes) => bytes,
        Output::TooLong => {
            return Err(StepError::terminal(format!(
                "`{}` printed more than {} bytes on stdout (the limit)",
                spec.run, limit
            )))
        }
    };
    parse_update(&out)
        .map_err(|e| StepError::terminal(format!("`{}`: {e}{}", spec.run, tail_note(&tail))))
}

fn tail_note(tail: &str) -> String {
    let t = tail.trim();
    if t.is_empty() {
        String::new()
    } else {
        format!("; stderr ends with: {t}")
    }
}

/// Reads a step's stdout as its update: one JSON object, or nothing.
pub fn parse_update(out: &[u8]) -> Result<Update, String> {
    let text = String::from_utf8_lossy(out);
    if text.trim().is_empty() {
        return Ok(Update::new());
    }
    let quote = || {
        let start: String = text.trim().chars().take(120).collect();
        if text.trim().chars().count() > 120 {
            format!("{start}...")
        } else {
            start
        }
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => steadfast::check_update(&map)
            .map(|()| map)
            .map_err(|p| format!("the value at `{}` cannot be stored: {}", p.path, p.reason)),
        Ok(other) => Err(format!(
            "stdout must be one JSON object (or nothing), got {}: {:?}",
            kind(&other),
            quote()
        )),
        Err(e) => Err(format!(
            "stdout is not JSON ({e}); it starts with {:?}",
            quote()
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

enum Output {
    Complete(Vec<u8>),
    TooLong,
}

/// Reads everything, but stops keeping bytes past `limit` (and keeps reading,
/// so the command is not blocked on a full pipe).
async fn read_limited(mut r: impl AsyncRead + Unpin, limit: usize) -> Output {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut over = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if kept.len() + n > limit {
                    over = true;
                    kept = Vec::new();
                } else if !over {
                    kept.extend_from_slice(&buf[..n]);
                }
            }
        }
    }
    if over {
        Output::TooLong
    } else {
        Output::Complete(kept)
    }
}

/// Reads everything and keeps the last `keep` bytes.
async fn read_tail(mut r: impl AsyncRead + Unpin, keep: usize) -> String {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > keep {
                    tail.drain(..tail.len() - keep);
                }
            }
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

/// The supervisor: asks to be sent SIGTERM when its parent (`steadfast`) dies,
/// runs the command in its process group, and kills the whole group if that
/// signal comes. Returns the command's exit code.
pub fn supervise(command: &str) -> i32 {
    let parent = nix::unistd::getppid();
    if nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).is_err() || nix::unistd::getppid() != parent
    {
        // No way to follow the parent, or it is already gone.
        return 125;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return 125,
    };
    rt.block_on(async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return 125,
            };
        let mut child = match tokio::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("steadfast: cannot start sh: {e}");
                return 127;
            }
        };
        tokio::select! {
            status = child.wait() => match status {
                Ok(s) => s.code().unwrap_or(128),
                Err(_) => 125,
            },
            _ = term.recv() => {
                let _ = killpg(nix::unistd::getpgrp(), Signal::SIGKILL);
                137
            }
        }
    })
}
