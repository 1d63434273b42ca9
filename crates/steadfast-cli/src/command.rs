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

use command_fds::{CommandFdExt, FdMapping};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use steadfast::{State, Step, StepCtx, StepError, Update};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

pub use crate::json::parse_json_exact;
pub use crate::update_reader::{parse_update, parse_whole};

/// How much of stderr's end goes into a step's error.
const STDERR_TAIL: usize = 2048;

/// Names, to a step's supervisor and the step, the `steadfast` process
/// they work for (`PID:START`), so that a process taking a run over from a
/// holder that died can find the steps it left.
const SUPERVISED_BY_ENV: &str = "STEADFAST_SUPERVISED_BY";

/// Names, to a step, the process group its supervisor made for it: a
/// process still in that group is the step's, one that left it (a daemon
/// started with `setsid`) is not.
const STEP_GROUP_ENV: &str = "STEADFAST_STEP_GROUP";

/// This process as a supervisor's environment names it.
fn supervised_by() -> &'static str {
    static ME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ME.get_or_init(|| {
        let me = steadfast::current_owner();
        format!("{}:{}", me.pid, me.started)
    })
}

/// How long a step's pipes are read after its command exited, for output a
/// process outside its group might still hold open.
const PIPE_DRAIN: Duration = Duration::from_millis(500);

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
        // Steps never inherit the store's secrets: the encryption keys would
        // let a step read or forge every run, the Cosmos key every item.
        .env_remove(steadfast::seal::KEY_ENV)
        .env_remove(steadfast::seal::KEY_FILE_ENV)
        .env_remove("STEADFAST_COSMOS_KEY")
        .envs(&spec.env)
        // After the flow's own variables, which cannot replace it.
        .env(SUPERVISED_BY_ENV, supervised_by())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // Events: the command writes them as lines to file descriptor 3.
    let (events, events_in) = std::io::pipe().map_err(|e| {
        StepError::retryable(format!(
            "cannot make the events pipe of `{}`: {e}",
            spec.run
        ))
    })?;
    cmd.fd_mappings(vec![FdMapping {
        parent_fd: std::os::fd::OwnedFd::from(events_in),
        child_fd: EVENTS_FD,
    }])
    .map_err(|e| StepError::terminal(format!("cannot give `{}` its events pipe: {e}", spec.run)))?;
    let spawned = cmd.spawn();
    // The command holds our copy of the pipe's writing end, which would keep
    // the pipe from ending: the child has its own now.
    drop(cmd);
    let mut child = spawned.map_err(|e| {
        StepError::retryable(format!(
            "cannot start `{}` in {}: {e}",
            spec.run,
            spec.workdir.display()
        ))
    })?;
    let events_read = read_events(events, ctx.clone());
    let mut guard = GroupGuard(child.id().map(|id| Pid::from_raw(id as i32)));

    let input = serde_json::to_vec(&*state).map_err(|e| StepError::terminal(e.to_string()))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| StepError::terminal("no stdin pipe"))?;
    // Aborted once the command exits: a descendant that keeps the pipe open
    // without reading must not hold the step up.
    let writer = tokio::spawn(async move {
        // A command that does not read its input closes the pipe: not an error.
        let _ = stdin.write_all(&input).await;
        let _ = stdin.shutdown().await;
    });
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| StepError::terminal("no stdout pipe"))?;
    let mut stderr = child
        .stderr
        .take()
        .ok_or_else(|| StepError::terminal("no stderr pipe"))?;
    let limit = spec.output_limit;
    let mut out = Limited::new(limit);
    let mut err = Tail::new(STDERR_TAIL);
    // The step's whole life, the reading of its pipes included, ends at its
    // timeout; after the command exits, its pipes get a short drain and no
    // more (a process that left the group may hold them open for ever).
    let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
    let until_deadline = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    let (status, drained) = {
        let reading = async {
            tokio::join!(out.read_from(&mut stdout), err.read_from(&mut stderr));
        };
        tokio::pin!(reading, until_deadline);
        let mut drained = false;
        let status = loop {
            tokio::select! {
                status = child.wait() => break Some(status),
                () = &mut reading, if !drained => drained = true,
                () = &mut until_deadline => break None,
            }
        };
        if status.is_some() && !drained {
            // Kill what the command left in its group, then drain.
            if let Some(pgid) = guard.0.take() {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            tokio::select! {
                () = &mut reading => drained = true,
                () = tokio::time::sleep(PIPE_DRAIN) => {}
                () = &mut until_deadline => {}
            }
        }
        (status, drained)
    };
    writer.abort();
    let Some(status) = status else {
        drop(guard);
        return Err(StepError::retryable(format!(
            "`{}` timed out after {}; its process group was killed{}",
            spec.run,
            humantime::format_duration(spec.timeout.unwrap_or_default()),
            tail_note(&err.text())
        )));
    };
    // The command is done; anything it left in its group goes with it.
    if let Some(pgid) = guard.0.take() {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    // The events it wrote go into the log before its checkpoint: read to
    // the pipe's end (as briefly bounded as its other pipes).
    if tokio::time::timeout(PIPE_DRAIN, events_read).await.is_err() {
        crate::output::note(format_args!(
            "  note  step {}: a process it started outside its process group still holds file descriptor 3 open; events it writes later are not recorded",
            ctx.step()
        ));
    }
    let status =
        status.map_err(|e| StepError::retryable(format!("waiting for `{}`: {e}", spec.run)))?;
    let tail = err.text();
    if !drained {
        crate::output::note(format_args!(
            "  note  step {} exited, but a process it started outside its process group still holds its output open; that process was not waited for",
            ctx.step()
        ));
    }
    if !status.success() {
        let how = match status.code() {
            Some(code) => format!("exited with code {code}"),
            None => "was killed by a signal".to_string(),
        };
        let message = format!("`{}` {how}{}", spec.run, tail_note(&tail));
        // A failed step may say on stdout when to try again, as its
        // provider asked: `{"retry_after": "30s"}` (or a number of seconds).
        let after = match out.into_output() {
            Output::Complete(Ok(update)) => retry_after_of(&update),
            Output::Complete(Err(_)) | Output::TooLong => None,
        };
        return Err(match after {
            Some(d) => StepError::retry_after(message, d),
            None => StepError::retryable(message),
        });
    }
    match out.into_output() {
        Output::Complete(update) => update
            .map_err(|e| StepError::terminal(format!("`{}`: {e}{}", spec.run, tail_note(&tail)))),
        Output::TooLong => Err(StepError::terminal(format!(
            "`{}` printed more than {} bytes on stdout (the limit)",
            spec.run, limit
        ))),
    }
}

/// The `retry_after` of a failed step's output, if it printed one JSON
/// object with it that reads as an update would: a duration (`"30s"`) or a
/// number of seconds, up to a day.
fn retry_after_of(update: &Update) -> Option<std::time::Duration> {
    let after = match update.get("retry_after")? {
        serde_json::Value::String(s) => humantime::parse_duration(s.trim()).ok()?,
        serde_json::Value::Number(n) => {
            let secs = n.as_f64()?;
            if !(0.0..=86_400.0).contains(&secs) {
                return None;
            }
            std::time::Duration::from_secs_f64(secs)
        }
        _ => return None,
    };
    (after <= std::time::Duration::from_secs(86_400)).then_some(after)
}

/// The file descriptor a command step writes its events to.
pub const EVENTS_FD: i32 = 3;

/// Reads a step's events pipe on a thread of its own: each line is one
/// event, its JSON value (a line that is not JSON is emitted as a string,
/// so nothing written is lost). Empty lines are skipped; a line longer than
/// an event may be is reported on stderr and skipped. Resolves at the
/// pipe's end.
fn read_events(pipe: std::io::PipeReader, ctx: StepCtx) -> tokio::sync::oneshot::Receiver<()> {
    let (done, ended) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let limit = steadfast::store::MAX_EVENT_BYTES as usize;
        let mut reader = std::io::BufReader::new(pipe);
        let mut line = Vec::new();
        let mut refused = false;
        loop {
            line.clear();
            // At most one byte over the limit is kept; the rest of a long
            // line is read and dropped.
            let read =
                std::io::Read::take(&mut reader, limit as u64 + 1).read_until(b'\n', &mut line);
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if line.len() > limit && line.last() != Some(&b'\n') {
                // The rest of the line, dropped as it comes.
                loop {
                    let (used, ended) = match reader.fill_buf() {
                        Ok([]) | Err(_) => break,
                        Ok(buf) => match buf.iter().position(|b| *b == b'\n') {
                            Some(at) => (at + 1, true),
                            None => (buf.len(), false),
                        },
                    };
                    reader.consume(used);
                    if ended {
                        break;
                    }
                }
                crate::output::note(format_args!(
                    "  note  step {}: an event line on file descriptor 3 is longer than {limit} bytes; it was skipped",
                    ctx.step()
                ));
                continue;
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let value = parse_json_exact(text).unwrap_or_else(|_| Value::String(text.to_string()));
            if let Err(e) = ctx.emit(value) {
                if !refused {
                    crate::output::note(format_args!(
                        "  note  step {}: an event it wrote was not recorded: {}",
                        ctx.step(),
                        steadfast::error_chain(&e)
                    ));
                }
                refused = true;
            }
        }
        let _ = done.send(());
    });
    ended
}

fn tail_note(tail: &str) -> String {
    let t = tail.trim();
    if t.is_empty() {
        String::new()
    } else {
        format!("; stderr ends with: {t}")
    }
}

enum Output {
    Complete(Result<Update, String>),
    TooLong,
}

/// A step's stdout, read as its update as it comes (a string member's
/// bytes are not kept),
/// and whether it went past `limit` bytes.
struct Limited {
    reader: Option<crate::update_reader::UpdateReader>,
    seen: usize,
    limit: usize,
}

impl Limited {
    fn new(limit: usize) -> Self {
        Limited {
            reader: Some(crate::update_reader::UpdateReader::new()),
            seen: 0,
            limit,
        }
    }

    /// Reads to the end, but drops what it read once past the limit (and
    /// keeps reading, so the command is not blocked on a full pipe).
    async fn read_from(&mut self, r: &mut (impl AsyncRead + Unpin)) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.seen = self.seen.saturating_add(n);
                    if self.seen > self.limit {
                        self.reader = None;
                    } else if let Some(reader) = &mut self.reader {
                        reader.feed(&buf[..n]);
                    }
                }
            }
        }
    }

    fn into_output(self) -> Output {
        match self.reader {
            Some(reader) if self.seen <= self.limit => Output::Complete(reader.finish()),
            _ => Output::TooLong,
        }
    }
}

/// The last `keep` bytes of a step's stderr.
struct Tail {
    tail: Vec<u8>,
    keep: usize,
}

impl Tail {
    fn new(keep: usize) -> Self {
        Tail {
            tail: Vec::new(),
            keep,
        }
    }

    async fn read_from(&mut self, r: &mut (impl AsyncRead + Unpin)) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.tail.extend_from_slice(&buf[..n]);
                    if self.tail.len() > self.keep {
                        self.tail.drain(..self.tail.len() - self.keep);
                    }
                }
            }
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.tail).into_owned()
    }
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
            .env(STEP_GROUP_ENV, std::process::id().to_string())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                crate::output::note(format_args!("steadfast: cannot start sh: {e}"));
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

/// Kills the step processes that `holder`, a `steadfast` process on this
/// host whose lease on `run_id` this process has just taken over, runs for
/// that run: each of its step supervisors leads a process group of its own,
/// and the whole group is killed when a process in it carries the run's id
/// in its environment. Steps of the holder's other runs (a worker holds
/// many) are left alone.
///
/// A holder still running was stopped or hung past its lease (its claim is
/// already fenced out of the store): its supervisors are its children. A
/// holder that died left supervisors that kill their groups when they hear
/// of it (their parent-death signal), but not at once (the steps could
/// still be going when this process starts the same step), and not if they
/// died first (a group orphaned with a stopped member is hung up by the
/// kernel). The step processes are found by the holder they name
/// (`STEADFAST_SUPERVISED_BY`) and the run, and their groups killed here
/// before anything runs. Nothing is done for a holder on another host.
pub fn stop_steps_of(holder: &steadfast::Owner, run_id: &str) {
    // Without a start time, a later process with the same pid cannot be told
    // apart from the holder: kill nothing.
    if holder.started == 0 {
        return;
    }
    let Some(alive) = steadfast::holder_is_running(holder) else {
        return;
    };
    let mark = format!("{SUPERVISED_BY_ENV}={}:{}", holder.pid, holder.started);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let wanted = format!("STEADFAST_RUN_ID={run_id}");
    // Every process: its state, parent and group, whether it works for the
    // run, and whether it is one of the dead holder's steps still in the
    // group its supervisor made (or that supervisor).
    let mut procs: Vec<(i32, char, u32, i32, bool, bool)> = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name in parentheses: state, ppid, pgrp.
        let Some(after) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        let (Some(state), Some(ppid), Some(pgrp)) = (
            fields.first().and_then(|f| f.chars().next()),
            fields.get(1).and_then(|f| f.parse::<u32>().ok()),
            fields.get(2).and_then(|f| f.parse::<i32>().ok()),
        ) else {
            continue;
        };
        // A process that started before the holder is not its step: its
        // environment is not read (field 22 of stat, the start time).
        let started = fields.get(19).and_then(|f| f.parse::<u64>().ok());
        if !alive && started.is_some_and(|t| t < holder.started) {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let for_run = vars.contains(&wanted.as_bytes());
        let in_group = format!("{STEP_GROUP_ENV}={pgrp}");
        let own_supervisor = pgrp == pid
            && !vars
                .iter()
                .any(|v| v.starts_with(STEP_GROUP_ENV.as_bytes()));
        let named = vars.contains(&mark.as_bytes())
            && (vars.contains(&in_group.as_bytes()) || own_supervisor);
        procs.push((pid, state, ppid, pgrp, for_run, named));
    }
    let mut killed = Vec::new();
    if !alive {
        // Every group a supervisor of the dead holder made for this run's
        // step, with a process still in it. A process a step moved out of
        // its group (a daemon) is left alone, as the supervisor would.
        let own = nix::unistd::getpgrp().as_raw();
        let mut groups: Vec<i32> = procs
            .iter()
            .filter(|p| p.4 && p.5 && p.3 > 1 && p.3 != own)
            .map(|p| p.3)
            .collect();
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
            killed.push(g);
        }
    }
    for &(pid, state, ppid, pgrp, _, _) in procs.iter().filter(|_| alive) {
        if ppid != holder.pid || pgrp != pid {
            continue;
        }
        // A supervisor that already exited (a zombie the stopped holder has
        // not reaped) has no command line left, but its group may still hold
        // what the step started: `steadfast` makes no other child that leads
        // a group of its own.
        let zombie = state == 'Z';
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let supervisor =
            zombie || cmdline.split(|b| *b == 0).nth(1) == Some(b"__supervise".as_slice());
        let for_run = procs.iter().any(|p| p.3 == pid && p.4);
        if supervisor && for_run {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            killed.push(pid);
        }
    }
    if !killed.is_empty() {
        let how = match alive {
            true => "which it held past its lease",
            false => "left behind when it died",
        };
        crate::output::note(format_args!(
            "  note  killed the step processes (groups {killed:?}) of {holder} for run {run_id:?}, {how}"
        ));
    }
}
