//! Flow files: TOML with a name, an optional version and `[[step]]` tables,
//! each a shell command, a gate, a durable timer, a wait for a signal or a
//! child run of another flow. Everything is checked before anything runs;
//! an error names the file, the line and what is wrong.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use steadfast::limits::{self, DurationRange};
use steadfast::{OnTimeout, RetryPolicy, Step, Workflow};
use toml::Spanned;

use crate::command::CommandSpec;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowFile {
    name: Spanned<String>,
    #[serde(default)]
    step: Vec<Spanned<StepSpec>>,
    /// Budgets of the flow's runs: `[budget]` with `usd = 5`, `tokens = 200000`.
    budget: Option<Spanned<BTreeMap<String, f64>>>,
    /// The flow's version, recorded by each run at start; without it, a
    /// digest of the file's text.
    version: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    name: Spanned<String>,
    run: Option<Spanned<String>>,
    gate: Option<Spanned<bool>>,
    sleep: Option<Spanned<String>>,
    wait: Option<Spanned<String>>,
    child: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    retries: Option<Spanned<u32>>,
    backoff: Option<Spanned<String>>,
    on_timeout: Option<Spanned<String>>,
    workdir: Option<Spanned<String>>,
    env: Option<BTreeMap<String, String>>,
    /// A shared limit the step holds while it runs: `KEY` or `KEY:N`.
    limit: Option<Spanned<String>>,
}

/// What a command step runs as, fingerprinted with each completion (see
/// `docs/versions.md`): its command, environment and working directory as
/// digests (a command line may carry a token), its timeout, retries and
/// backoff as the file writes them. The working directory is the file's
/// text, not the resolved path, so moving a checkout changes nothing.
fn definition_of(spec: &StepSpec, retries: u32) -> Result<steadfast::StepVersion, String> {
    use steadfast::StepVersion;
    let mut fields = BTreeMap::new();
    if let Some(run) = &spec.run {
        fields.insert(
            "command".to_string(),
            StepVersion::digest(run.get_ref()).into(),
        );
    }
    if let Some(env) = spec.env.as_ref().filter(|e| !e.is_empty()) {
        let digests: serde_json::Map<String, serde_json::Value> = env
            .iter()
            .map(|(k, v)| (k.clone(), StepVersion::digest(v).into()))
            .collect();
        let each = serde_json::Value::Object(digests);
        // One digest per variable while they fit in a field; else one for
        // the whole table (a plan then says the environment changed).
        let fits = serde_json::to_string(&each)
            .is_ok_and(|t| t.len() <= steadfast::version::MAX_FIELD_BYTES);
        let value = if fits {
            each
        } else {
            let whole: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            StepVersion::digest(&whole.join("\0")).into()
        };
        fields.insert("env".to_string(), value);
    }
    if let Some(w) = &spec.workdir {
        fields.insert(
            "workdir".to_string(),
            StepVersion::digest(w.get_ref()).into(),
        );
    }
    if let Some(t) = &spec.timeout {
        fields.insert("timeout".to_string(), t.get_ref().clone().into());
    }
    fields.insert("retries".to_string(), retries.into());
    if let Some(b) = &spec.backoff {
        fields.insert("backoff".to_string(), b.get_ref().clone().into());
    }
    StepVersion::of_fields(fields)
}

/// A flow file that does not parse or does not make sense.
#[derive(Debug)]
pub struct FlowError(pub String);

impl std::fmt::Display for FlowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlowError {}

/// The largest step output accepted: a value as large as a store takes
/// (1 GiB of JSON text, kept as a blob) and a MiB for the object around it.
pub const DEFAULT_OUTPUT_LIMIT: usize =
    (steadfast::store::blob::MAX_BLOB_BYTES as usize) + (1 << 20);

/// Reads, checks and builds the workflow of the flow file at `path`.
pub fn load(path: &Path) -> Result<Workflow, FlowError> {
    load_with_children(path).map(|(wf, _)| wf)
}

/// The flow at `path` and every flow its `child` steps name, and theirs:
/// the flow first, each file once, with the file's canonical path. Two
/// files of one name are refused, and so are flows that start each other
/// (a cycle nests child runs without end).
pub fn load_family(path: &Path) -> Result<Vec<(PathBuf, Workflow)>, FlowError> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out: Vec<(PathBuf, Workflow, Vec<ChildFile>)> = Vec::new();
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        let key = canonical(&p);
        if out.iter().any(|(k, _, _)| *k == key) {
            continue;
        }
        let (wf, children) = load_with_children(&p)?;
        if let Some((other, _, _)) = out.iter().find(|(_, w, _)| w.name() == wf.name()) {
            return Err(FlowError(format!(
                "{}: flow {:?} is also the name of {}; a flow's children need names of their own",
                p.display(),
                wf.name(),
                other.display()
            )));
        }
        if out.len() >= 1000 {
            return Err(FlowError(format!(
                "{}: more than 1000 flow files are reached through child steps",
                path.display()
            )));
        }
        todo.extend(children.iter().rev().map(|(c, _)| c.clone()));
        let edges = children
            .into_iter()
            .map(|(c, line)| (canonical(&c), line))
            .collect();
        out.push((key, wf, edges));
    }
    // A depth-first walk: an edge back to a flow still on the path closes
    // a cycle.
    let index = |k: &Path| out.iter().position(|(o, _, _)| o == k);
    let mut state = vec![0u8; out.len()]; // 0 new, 1 on the path, 2 done
    let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
    state[0] = 1;
    while let Some(&(at, next)) = stack.last() {
        let edges = &out[at].2;
        if next == edges.len() {
            state[at] = 2;
            stack.pop();
            continue;
        }
        if let Some(top) = stack.last_mut() {
            top.1 += 1;
        }
        let (to, line) = &edges[next];
        let Some(to) = index(to) else { continue };
        match state[to] {
            0 => {
                state[to] = 1;
                stack.push((to, 0));
            }
            1 => {
                return Err(FlowError(format!(
                    "{}:{line}: this child step runs {}, which leads back to this flow: flows that start each other would nest child runs without end",
                    out[at].0.display(),
                    out[to].0.display()
                )))
            }
            _ => {}
        }
    }
    Ok(out.into_iter().map(|(k, wf, _)| (k, wf)).collect())
}

/// The text of the flow file at `path`, read with its checks.
fn read_flow(path: &Path) -> Result<String, FlowError> {
    use std::io::Read;
    let fail = |what: String| FlowError(format!("{}: {what}", path.display()));
    let file =
        std::fs::File::open(path).map_err(|e| fail(format!("cannot read the flow file: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| fail(format!("cannot read the flow file: {e}")))?;
    if !meta.is_file() {
        return Err(fail("the flow file is not a regular file".into()));
    }
    let limit = steadfast::limits::MAX_FLOW_BYTES;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read the flow file: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(fail(format!("the flow file is larger than {limit} bytes")));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        fail(format!(
            "the flow file is not UTF-8 (an invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    Ok(text)
}

/// A flow file a child step runs, and the line of that step.
type ChildFile = (PathBuf, usize);

/// The flow at `path` and the paths of the flows its child steps run, each
/// with the line of its step.
fn load_with_children(path: &Path) -> Result<(Workflow, Vec<ChildFile>), FlowError> {
    let text = read_flow(path)?;
    parse_with_children(&text, path)
}

/// The name of the flow file at `path`, which a child step runs.
fn flow_name(path: &Path) -> Result<String, FlowError> {
    #[derive(Deserialize)]
    struct Named {
        name: String,
    }
    let text = read_flow(path)?;
    let named: Named = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| {
                format!(
                    ":{}",
                    text[..s.start.min(text.len())].matches('\n').count() + 1
                )
            })
            .unwrap_or_default();
        FlowError(format!("{}{line}: {}", path.display(), e.message()))
    })?;
    Ok(named.name.trim().to_string())
}

/// Checks and builds a workflow from flow-file text; `path` names it in errors
/// and anchors relative working directories.
pub fn parse(text: &str, path: &Path) -> Result<Workflow, FlowError> {
    parse_with_children(text, path).map(|(wf, _)| wf)
}

fn parse_with_children(text: &str, path: &Path) -> Result<(Workflow, Vec<ChildFile>), FlowError> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let at = |offset: usize, what: String| {
        FlowError(format!("{}:{}: {what}", path.display(), line_of(offset)))
    };
    let flow: FlowFile = toml::from_str(text).map_err(|e| match e.span() {
        Some(span) => at(span.start, e.message().to_string()),
        None => FlowError(format!("{}: {}", path.display(), e.message())),
    })?;
    let name = flow.name.get_ref().trim();
    if name.is_empty() {
        return Err(at(
            flow.name.span().start,
            "the flow's name is empty".into(),
        ));
    }
    if flow.step.is_empty() {
        return Err(FlowError(format!(
            "{}: the flow has no [[step]]",
            path.display()
        )));
    }
    let base = flow_dir(path);
    let mut seen = HashSet::new();
    let mut steps = Vec::new();
    let mut children = Vec::new();
    for (i, spanned) in flow.step.iter().enumerate() {
        let spec = spanned.get_ref();
        let step_at = |what: String| {
            at(
                spanned.span().start,
                format!("step {} ({:?}): {what}", i + 1, spec.name.get_ref()),
            )
        };
        let step_name = spec.name.get_ref();
        if step_name.trim().is_empty() {
            return Err(at(
                spec.name.span().start,
                format!("step {} has an empty name", i + 1),
            ));
        }
        if !seen.insert(step_name.clone()) {
            return Err(at(
                spec.name.span().start,
                format!("step name {step_name:?} is used twice"),
            ));
        }
        let kinds = [
            spec.run.is_some(),
            spec.gate.is_some(),
            spec.sleep.is_some(),
            spec.wait.is_some(),
            spec.child.is_some(),
        ];
        match kinds.iter().filter(|k| **k).count() {
            0 => {
                return Err(step_at(
                    "needs one of run, gate, sleep, wait or child".into(),
                ))
            }
            1 => {}
            _ => {
                return Err(step_at(
                    "has more than one of run, gate, sleep, wait and child".into(),
                ))
            }
        }
        let duration = |field: &Option<Spanned<String>>,
                        key: &str,
                        range: DurationRange|
         -> Result<Option<Duration>, FlowError> {
            match field {
                None => Ok(None),
                Some(s) => {
                    let d = humantime::parse_duration(s.get_ref())
                        .map_err(|e| at(s.span().start, format!("{key} = {:?} is not a duration ({e}); write e.g. \"30s\" or \"10m\"", s.get_ref())))?;
                    range
                        .check(key, d)
                        .map(Some)
                        .map_err(|e| at(s.span().start, format!("{key} = {:?}: {e}", s.get_ref())))
                }
            }
        };
        let timeout_range = if spec.gate.is_some() || spec.wait.is_some() {
            limits::GATE_TIMEOUT
        } else {
            limits::STEP_TIMEOUT
        };
        let timeout = duration(&spec.timeout, "timeout", timeout_range)?;
        let only_for = |field: bool, key: &str, kind: &str| -> Result<(), FlowError> {
            if field {
                let verb = if key.contains(" and ") {
                    "apply"
                } else {
                    "applies"
                };
                Err(step_at(format!("{key} {verb} only to {kind} steps")))
            } else {
                Ok(())
            }
        };
        if spec.run.is_none() {
            // Options of command steps, on a gate or a timer.
            if spec.child.is_some() {
                only_for(spec.backoff.is_some(), "backoff", "run")?;
            } else {
                only_for(
                    spec.retries.is_some() || spec.backoff.is_some(),
                    "retries and backoff",
                    "run",
                )?;
            }
            only_for(
                spec.workdir.is_some() || spec.env.is_some(),
                "workdir and env",
                "run",
            )?;
            only_for(spec.limit.is_some(), "limit", "run")?;
        }
        let step = if let Some(run) = &spec.run {
            only_for(spec.on_timeout.is_some(), "on_timeout", "gate")?;
            for (key, value) in spec.env.iter().flatten() {
                if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                    return Err(step_at(format!(
                        "env {key:?}: a variable's name must be non-empty without '=' or NUL, and its value without NUL"
                    )));
                }
            }
            if run.get_ref().trim().is_empty() {
                return Err(at(run.span().start, "run is empty".into()));
            }
            let backoff = duration(&spec.backoff, "backoff", limits::BACKOFF)?;
            // A flow step without `retries` runs once: a shell command is
            // not taken to be safe to repeat unless the flow says so.
            let retries = spec.retries.as_ref().map_or(0, |r| *r.get_ref());
            let policy = RetryPolicy::from_options(Some(i64::from(retries)), backoff, None)
                .map_err(|e| at(spec.retries.as_ref().map_or(0, |r| r.span().start), e))?;
            let workdir = spec
                .workdir
                .as_ref()
                .map_or_else(|| base.clone(), |w| base.join(w.get_ref()));
            let command = CommandSpec {
                run: run.get_ref().clone(),
                workdir,
                env: spec.env.clone().unwrap_or_default(),
                timeout,
                output_limit: DEFAULT_OUTPUT_LIMIT,
            };
            let definition = definition_of(spec, retries)
                .map_err(|e| step_at(format!("its definition: {e}")))?;
            let step = command
                .into_step(step_name)
                .retry(policy)
                .defined_as(definition);
            match &spec.limit {
                Some(l) => {
                    step.limit(steadfast::LimitSpec::parse(l.get_ref()).map_err(|e| {
                        at(l.span().start, format!("limit = {:?}: {e}", l.get_ref()))
                    })?)
                }
                None => step,
            }
        } else if let Some(gate) = &spec.gate {
            if !gate.get_ref() {
                return Err(at(
                    gate.span().start,
                    "gate must be true (remove the step to drop the gate)".into(),
                ));
            }
            let on_timeout = match &spec.on_timeout {
                None => OnTimeout::default(),
                Some(o) => o
                    .get_ref()
                    .parse::<OnTimeout>()
                    .map_err(|e| at(o.span().start, e))?,
            };
            if spec.on_timeout.is_some() && timeout.is_none() {
                return Err(step_at("on_timeout needs a timeout".into()));
            }
            match timeout {
                Some(t) => Step::gate(step_name.as_str()).gate_timeout(t, on_timeout),
                None => Step::gate(step_name.as_str()),
            }
        } else if let Some(child) = &spec.child {
            only_for(
                spec.timeout.is_some() || spec.on_timeout.is_some(),
                "timeout and on_timeout",
                "run, gate and wait",
            )?;
            let file = base.join(child.get_ref());
            let name = flow_name(&file).map_err(|e| {
                at(
                    child.span().start,
                    format!("child = {:?}: {}", child.get_ref(), e.0),
                )
            })?;
            if let Err(e) = steadfast::check_step_name(&name) {
                return Err(at(
                    child.span().start,
                    format!("child = {:?}: its flow's name: {e}", child.get_ref()),
                ));
            }
            // Retries of a child step retry its child run when it fails;
            // without them, its failure fails this step at once.
            let retries = spec.retries.as_ref().map_or(0, |r| *r.get_ref());
            let retries_at = spec.retries.as_ref().map_or(0, |r| r.span().start);
            let most = steadfast::MAX_CHILD_ATTEMPTS;
            if retries >= most {
                return Err(at(
                    retries_at,
                    format!("retries = {retries}: a child is tried at most {most} times, so at most {} retries", most - 1),
                ));
            }
            let policy = RetryPolicy::from_options(Some(i64::from(retries)), None, None)
                .map_err(|e| at(retries_at, e))?;
            children.push((file, line_of(child.span().start)));
            Step::child(step_name.as_str(), name).retry(policy)
        } else if let Some(wait) = &spec.wait {
            only_for(spec.on_timeout.is_some(), "on_timeout", "gate")?;
            if let Err(e) = steadfast::check_step_name(wait.get_ref()) {
                return Err(at(
                    wait.span().start,
                    format!("wait = {:?}: the signal's name: {e}", wait.get_ref()),
                ));
            }
            let step = Step::wait_for(step_name.as_str(), wait.get_ref().as_str());
            match timeout {
                Some(t) => step.signal_timeout(t),
                None => step,
            }
        } else {
            only_for(
                spec.timeout.is_some() || spec.on_timeout.is_some(),
                "timeout and on_timeout",
                "run, gate and wait",
            )?;
            let d = duration(&spec.sleep, "sleep", limits::SLEEP)?.unwrap_or_default();
            Step::sleep(step_name.as_str(), d)
        };
        steps.push(step);
    }
    let mut wf =
        Workflow::new(name, steps).map_err(|e| FlowError(format!("{}: {e}", path.display())))?;
    if let Some(budget) = &flow.budget {
        wf = wf
            .with_budget(budget.get_ref().clone())
            .map_err(|e| at(budget.span().start, format!("[budget]: {e}")))?;
    }
    // A run resumes only under the version it was started with: the one
    // declared, else the file's digest (any edit makes a new version).
    wf = match &flow.version {
        Some(v) => wf
            .with_version(v.get_ref().as_str())
            .map_err(|e| at(v.span().start, format!("version: {e}")))?,
        // A checkout that turns line endings into `\r\n` is the same file.
        None => wf
            .with_version(steadfast::StepVersion::digest(&text.replace("\r\n", "\n")))
            .map_err(|e| FlowError(format!("{}: {e}", path.display())))?,
    };
    Ok((wf, children))
}

/// Where a flow file's relative paths point: its directory.
pub fn flow_dir(flow: &Path) -> std::path::PathBuf {
    match flow.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    }
}
