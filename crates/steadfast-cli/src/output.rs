//! What the commands print: aligned tables for people, JSON for programs, and
//! one progress line per step on stderr.

use std::io::Write;

use serde_json::{json, Value};
use steadfast::stuck::Stuck;
use steadfast::{AuditEntry, Checkpoint, Event, RunSummary, StepRecord, Wait};

/// Prints a line on stdout. A closed pipe (`steadfast runs | head`) ends the
/// process quietly instead of panicking.
macro_rules! out {
    () => {
        $crate::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use out;

/// Writes one line to stdout (the `out!` macro calls it). Any other write error (a full
/// disk, an I/O error) ends the process with exit code 1 and one line on
/// stderr: output that did not arrive is not a success.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_fmt(args)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush())
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        note(format_args!(
            "steadfast: cannot write to standard output: {e}"
        ));
        std::process::exit(crate::args::exit::FAILED);
    }
}

/// Text from a store, a step or a user made safe to print on a terminal:
/// control characters (newlines, escape sequences) are shown escaped, so that
/// nothing can fake a line of output or drive the terminal.
///
/// ```
/// assert_eq!(steadfast_cli::output::clean("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
/// ```
pub fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A word as a POSIX shell reads it back: unchanged when it is plain, else
/// in single quotes.
///
/// ```
/// assert_eq!(steadfast_cli::output::shell_quote("run-1"), "run-1");
/// assert_eq!(steadfast_cli::output::shell_quote("a b"), "'a b'");
/// assert_eq!(steadfast_cli::output::shell_quote("it's"), "'it'\\''s'");
/// ```
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+=,".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", clean(&word.replace('\'', "'\\''")))
    }
}

/// Writes one line to stderr. Unlike `eprintln!`, never panics: when stderr
/// itself cannot be written there is nowhere left to report that.
pub fn note(args: std::fmt::Arguments<'_>) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr
        .write_fmt(args)
        .and_then(|()| stderr.write_all(b"\n"));
}

/// The progress line of a run-loop event, on stderr.
pub fn progress(event: &Event<'_>) {
    if let Some(line) = progress_line(event) {
        note(format_args!("{}", clean(&line)));
    }
}

/// [`progress`] for one of several runs at once (a worker's): each line
/// starts with the run's id.
pub fn progress_of(run_id: &str) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
    let run_id = run_id.to_string();
    move |event| {
        if let Some(line) = progress_line(event) {
            note(format_args!("{}", clean(&format!("{run_id}{line}"))));
        }
    }
}

fn progress_line(event: &Event<'_>) -> Option<String> {
    let line = match event {
        Event::Skipped { index, step } => format!("  skip  {index:>3} {step}  (done before)"),
        Event::Started {
            index,
            step,
            attempt,
        } if *attempt > 1 => {
            format!("  run   {index:>3} {step}  (attempt {attempt})")
        }
        Event::Started { index, step, .. } => format!("  run   {index:>3} {step}"),
        Event::Completed {
            index, step, took, ..
        } => format!("  done  {index:>3} {step}  {took:.0?}"),
        Event::Failed {
            index,
            step,
            attempt,
            error,
            retry_in: Some(d),
        } => format!("  fail  {index:>3} {step}  attempt {attempt}: {error}; retry in {d:.0?}"),
        Event::Failed {
            index,
            step,
            attempt,
            error,
            retry_in: None,
        } => format!("  fail  {index:>3} {step}  attempt {attempt}: {error}"),
        _ => return None,
    };
    Some(line)
}

/// Prints rows as columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| clean(c).into_owned()).collect())
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out!("{}", out.trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// `runs`: each run with its stuck label, if it has one.
pub fn runs(runs: &[(RunSummary, Option<Stuck>)], json: bool) {
    if json {
        out!("{}", runs_json(runs));
        return;
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|(r, stuck)| {
            vec![
                r.run_id.clone(),
                r.workflow.clone(),
                r.status.to_string(),
                r.next.to_string(),
                r.updated_at.to_string(),
                r.workflow_version.clone().unwrap_or_default(),
                stuck
                    .as_ref()
                    .map_or(String::new(), |s| format!("{}: {s}", s.label())),
            ]
        })
        .collect();
    table(
        &[
            "RUN", "WORKFLOW", "STATUS", "DONE", "UPDATED", "VERSION", "STUCK",
        ],
        &rows,
    );
}

/// What `runs --json` prints (and `steadfast serve` answers at `/api/runs`).
pub fn runs_json(runs: &[(RunSummary, Option<Stuck>)]) -> Value {
    let list: Vec<Value> = runs
        .iter()
        .map(|(r, stuck)| {
            let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.insert("stuck".into(), stuck_json(stuck.as_ref()));
            }
            v
        })
        .collect();
    Value::Array(list)
}

/// What `show --json` prints (and `steadfast serve` answers at `/api/runs/ID`).
pub fn show_json(cp: &Checkpoint, history: Option<&[StepRecord]>, stuck: Option<&Stuck>) -> Value {
    let steps: Vec<Value> = match history {
        Some(h) => h.iter().map(step_json).collect(),
        None => cp
            .completed
            .iter()
            .enumerate()
            .map(|(i, n)| json!({"index": i, "name": n}))
            .collect(),
    };
    json!({
        "run_id": cp.run_id, "workflow": cp.workflow, "status": cp.status, "next": cp.next,
        "steps_done": steps, "state": cp.state, "version": cp.version,
        "created_at": cp.created_at, "updated_at": cp.updated_at, "attempts": cp.attempts,
        "error": cp.error, "wait": cp.wait, "lease": cp.lease, "decisions": cp.decisions,
        "audit": cp.audit.iter().map(audit_json).collect::<Vec<_>>(),
        "stuck": stuck_json(stuck),
        "parent": steadfast::ParentLink::of(&cp.state),
        "children": steadfast::children_of(cp, history),
        "spend": cp.spend,
        "workflow_version": cp.origin.as_ref().and_then(|o| o.version.as_deref()),
        "passed_over": cp.passed_over,
    })
}

/// What `history --json` prints (and `steadfast serve` answers at
/// `/api/runs/ID/history`).
pub fn history_json(records: &[StepRecord], audit: &[AuditEntry]) -> Value {
    let list: Vec<Value> = records
        .iter()
        .map(|r| {
            let mut v = step_json(r);
            v["update"] = Value::Object(r.update.clone());
            v
        })
        .chain(audit.iter().map(|e| json!({"audit": audit_json(e)})))
        .collect();
    Value::Array(list)
}

/// A stuck label as JSON: its short name and its reason, or null.
fn stuck_json(stuck: Option<&Stuck>) -> Value {
    match stuck {
        Some(s) => json!({"label": s.label(), "reason": s.to_string()}),
        None => Value::Null,
    }
}

fn audit_json(e: &AuditEntry) -> Value {
    let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
    v["text"] = Value::String(e.action.describe());
    v
}

fn step_json(r: &StepRecord) -> Value {
    json!({"index": r.index, "name": r.name, "attempt": r.attempt, "started_at": r.started_at,
           "finished_at": r.finished_at,
           "duration_ms": r.finished_at.unix_millis().saturating_sub(r.started_at.unix_millis())})
}

/// What a run spent, for people: `tokens 1234 of 200000, usd 0.62 of 5`
/// (a name with a budget but no spend shows 0), `OVER` after a name past
/// its budget.
pub fn spend_text(s: &steadfast::Spend) -> String {
    let names: std::collections::BTreeSet<&String> =
        s.spent.keys().chain(s.budget.keys()).collect();
    names
        .into_iter()
        .map(|name| {
            let spent = s.spent.get(name).copied().unwrap_or(0.0);
            match s.budget.get(name) {
                Some(limit) if spent > *limit => {
                    format!("{name} {} of {} OVER", amount(spent), amount(*limit))
                }
                Some(limit) => format!("{name} {} of {}", amount(spent), amount(*limit)),
                None => format!("{name} {}", amount(spent)),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// An amount: whole numbers without a point, others to six significant
/// places at most (sums of fractions such as 0.1 + 0.2 show as 0.3).
pub fn amount(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{v:.0}");
    }
    let text = format!("{v:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A size in bytes for people: `512 B`, `1.5 KiB`, `20.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `show`; `usage` is what the run stores, on a store with blobs.
pub fn show(
    cp: &Checkpoint,
    history: Option<&[StepRecord]>,
    stuck: Option<&Stuck>,
    usage: Option<&steadfast::Usage>,
    json: bool,
) {
    if json {
        let mut v = show_json(cp, history, stuck);
        if let Some(u) = usage {
            v["stored"] = json!(u);
        }
        out!("{v}");
        return;
    }
    out!("run       {}", clean(&cp.run_id));
    match cp.origin.as_ref().and_then(|o| o.version.as_deref()) {
        Some(v) => out!("workflow  {} (version {})", clean(&cp.workflow), clean(v)),
        None => out!("workflow  {}", clean(&cp.workflow)),
    }
    out!("status    {}", cp.status);
    out!("next      step {}", cp.next);
    out!("updated   {}", cp.updated_at);
    if let Some(u) = usage {
        let shared = if u.shared_bytes > 0 {
            format!(", {} of them shared with other runs", bytes(u.shared_bytes))
        } else {
            String::new()
        };
        out!(
            "stored    {} ({} in the record, {} in {} blob(s){shared})",
            bytes(u.record_bytes.saturating_add(u.blob_bytes)),
            bytes(u.record_bytes),
            bytes(u.blob_bytes),
            u.blobs
        );
    }
    match &cp.wait {
        Some(Wait::Gate {
            step,
            since,
            timeout_at,
            on_timeout,
        }) => {
            let decides = match on_timeout {
                steadfast::OnTimeout::Approve => "approve",
                steadfast::OnTimeout::Reject => "reject",
            };
            let t = timeout_at
                .map(|t| format!(", decides {decides} at {t}"))
                .unwrap_or_default();
            out!("waiting   at gate {} since {since}{t}", clean(step));
        }
        Some(Wait::Timer { step, until }) => out!("sleeping  at {} until {until}", clean(step)),
        Some(Wait::Limit { step, key, until }) => out!(
            "waiting   at {} for a slot of limit {} (looks again at {until})",
            clean(step),
            clean(key)
        ),
        Some(Wait::Signal {
            step,
            signal,
            since,
            timeout_at,
            arrived,
            ..
        }) => {
            let t = timeout_at
                .map(|t| format!(", gives up at {t}"))
                .unwrap_or_default();
            let arrived = if *arrived {
                " (it was sent: run it again to take it)"
            } else {
                ""
            };
            out!(
                "waiting   at {} for signal {} since {since}{t}{arrived}",
                clean(step),
                clean(signal)
            );
        }
        Some(Wait::Children {
            step,
            runs,
            since,
            arrived,
            ..
        }) => {
            let arrived = if *arrived {
                " (one ended: run it again to take it)"
            } else {
                ""
            };
            out!(
                "waiting   at {} for {} child run(s) since {since}{arrived}",
                clean(step),
                runs.len()
            );
        }
        Some(_) | None => {}
    }
    if let Some(spend) = cp.spend.as_ref().filter(|s| !s.is_empty()) {
        out!("spent     {}", spend_text(spend));
    }
    if let Some(p) = steadfast::ParentLink::of(&cp.state) {
        out!("parent    {} (step {})", clean(&p.run), clean(&p.step));
    }
    for c in steadfast::children_of(cp, history) {
        let how = if c.recorded { "done" } else { "under way" };
        out!("child     {}: {} ({how})", clean(&c.step), clean(&c.run));
    }
    if let Some(l) = &cp.lease {
        let gone = match steadfast::holder_is_running(&l.owner) {
            Some(false) => "  (that process is gone: the next run takes the lease over)",
            _ => "",
        };
        out!(
            "lease     {} until {}{gone}",
            clean(&l.owner.to_string()),
            l.until
        );
    }
    if let Some(e) = &cp.error {
        out!(
            "error     step {} ({}) attempt {}: {}",
            e.index,
            clean(&e.step),
            e.attempt,
            clean(&e.message)
        );
    }
    for d in &cp.decisions {
        let what = if d.approved { "approved" } else { "rejected" };
        let extra = d
            .reason
            .clone()
            .or_else(|| d.data.as_ref().map(|v| v.to_string()))
            .map(|x| format!(": {}", clean(&x)))
            .unwrap_or_default();
        out!(
            "decision  {} {what} by {} at {}{extra}",
            clean(&d.gate),
            clean(&d.by),
            d.at
        );
    }
    for e in &cp.audit {
        out!(
            "audit     {} by {} at {}",
            clean(&e.action.describe()),
            clean(&e.by),
            e.at
        );
    }
    if let Some(s) = stuck {
        out!("stuck     {}: {}", s.label(), clean(&s.to_string()));
    }
    out!();
    match history {
        Some(h) => {
            let rows: Vec<Vec<String>> = h
                .iter()
                .map(|r| {
                    vec![
                        r.index.to_string(),
                        r.name.clone(),
                        r.attempt.to_string(),
                        r.started_at.to_string(),
                        r.finished_at.to_string(),
                        format!(
                            "{}ms",
                            r.finished_at
                                .unix_millis()
                                .saturating_sub(r.started_at.unix_millis())
                        ),
                    ]
                })
                .collect();
            table(
                &["#", "STEP", "ATTEMPTS", "STARTED", "FINISHED", "TOOK"],
                &rows,
            );
        }
        None => {
            let rows: Vec<Vec<String>> = cp
                .completed
                .iter()
                .enumerate()
                .map(|(i, n)| vec![i.to_string(), n.clone()])
                .collect();
            table(&["#", "STEP"], &rows);
        }
    }
    out!();
    out!("state");
    out!(
        "{}",
        serde_json::to_string_pretty(&cp.state)
            .unwrap_or_else(|e| format!("(cannot print the state: {e})"))
    );
}

/// `history`: the step records, then the audit entries (with `--json`,
/// as elements `{"audit": …}` after the steps).
pub fn history(records: &[StepRecord], audit: &[AuditEntry], json: bool) {
    if json {
        out!("{}", history_json(records, audit));
        return;
    }
    for e in audit {
        out!(
            "audit  {} by {} at {}",
            clean(&e.action.describe()),
            clean(&e.by),
            e.at
        );
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.index.to_string(),
                r.name.clone(),
                r.attempt.to_string(),
                r.finished_at.to_string(),
                Value::Object(r.update.clone()).to_string(),
            ]
        })
        .collect();
    table(&["#", "STEP", "ATTEMPTS", "FINISHED", "UPDATE"], &rows);
}
