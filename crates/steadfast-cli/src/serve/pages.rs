//! The pages, as maud templates: every value spliced in is escaped.

use maud::{html, Markup, DOCTYPE};
use serde_json::Value;
use steadfast::stuck::Stuck;
use steadfast::{Checkpoint, RunStatus, RunSummary, StepRecord, Timestamp, Wait};

use super::RunsQuery;

/// How often (seconds) a page fetches itself again to show changes.
const REFRESH_SECS: u32 = 3;

/// A run id (or any text) as one URL path segment: every byte but the
/// unreserved ones percent-encoded, so that `/`, `?`, `#` and quotes in an id
/// stay in the segment.
pub(crate) fn seg(text: &str) -> String {
    // `.` and `..` alone would be taken as "this" and "the parent" folder.
    if text == "." || text == ".." {
        return "%2E".repeat(text.len());
    }
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The same, for a query value.
fn query(text: &str) -> String {
    seg(text)
}

fn layout(title: &str, store: &str, here: &str, refresh: bool, body: Markup) -> Markup {
    layout_with(title, store, here, refresh, body, None)
}

/// [`layout`], with a run's live events under the page when `events` names
/// their stream and the run's status as the page shows it: outside the part
/// that refreshes, so that what arrived stays.
fn layout_with(
    title: &str,
    store: &str,
    here: &str,
    refresh: bool,
    body: Markup,
    events: Option<(&str, RunStatus)>,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · steadfast" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/app.js" defer {}
            }
            body data-refresh=(if refresh { REFRESH_SECS } else { 0 }) {
                header {
                    span.brand { "steadfast" }
                    a.here[here == "runs"] href="/runs" { "Runs" }
                    a.here[here == "inbox"] href="/inbox" { "Inbox" }
                    span.store { (store) }
                }
                main #content { (body) }
                @if let Some((src, status)) = events {
                    section #events data-src=(src) data-status=(status) {
                        h2 { "Events " span #events-state.muted { "connecting" } }
                        ol #event-list {}
                    }
                }
            }
        }
    }
}

fn badge(status: RunStatus) -> Markup {
    let s = status.to_string();
    html! { span class={ "badge " (s) } { (s) } }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn stuck_label(s: Option<&Stuck>) -> Markup {
    html! {
        @if let Some(s) = s {
            span.stuck title=(s.to_string()) { (s.label()) }
        }
    }
}

/// An error page: what failed (naming the run) and why.
pub(crate) fn error(title: &str, detail: &str) -> Markup {
    layout(
        title,
        "",
        "",
        false,
        html! {
            h1 { (title) }
            div.box.error { pre { (detail) } }
            p { a href="/runs" { "Back to the runs" } }
        },
    )
}

/// The runs list, filtered and paged.
pub(crate) fn runs(
    store: &str,
    q: &RunsQuery,
    rows: &[(RunSummary, Option<Stuck>)],
    limit: usize,
) -> Markup {
    let statuses = [
        "pending",
        "running",
        "waiting",
        "sleeping",
        "completed",
        "failed",
        "rejected",
        "cancelled",
    ];
    let status = q.status.as_deref().unwrap_or("");
    let workflow = q.workflow.as_deref().unwrap_or("");
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|(r, _)| r.run_id.clone()))
        .flatten();
    layout(
        "Runs",
        store,
        "runs",
        true,
        html! {
            h1 { "Runs" }
            form.filters method="get" action="/runs" {
                label { "Status"
                    select name="status" {
                        option value="" selected[status.is_empty()] { "any" }
                        @for s in statuses {
                            option value=(s) selected[status == s] { (s) }
                        }
                    }
                }
                label { "Workflow" input name="workflow" value=(workflow) placeholder="any"; }
                button type="submit" { "Filter" }
            }
            @if rows.is_empty() {
                p.muted { "No runs match." }
            } @else {
                table {
                    thead { tr { th { "Run" } th { "Workflow" } th { "Status" } th { "Steps done" } th { "Updated" } th { "Spent" } th { "Stuck" } } }
                    tbody {
                        @for (r, s) in rows {
                            tr {
                                td.id { a href={ "/runs/" (seg(&r.run_id)) } { (r.run_id) } }
                                td { (r.workflow) }
                                td { (badge(r.status)) }
                                td { (r.next) }
                                td { (r.updated_at.to_string()) }
                                td.spend { (r.spend.as_ref().map(crate::output::spend_text).unwrap_or_default()) }
                                td { (stuck_label(s.as_ref())) }
                            }
                        }
                    }
                }
            }
            @if let Some(after) = next {
                p.pager {
                    a href={ "/runs?status=" (query(status)) "&workflow=" (query(workflow)) "&limit=" (limit) "&after=" (query(&after)) } { "Next page →" }
                }
            }
        },
    )
}

/// One bar of the timeline.
struct Bar<'a> {
    name: &'a str,
    start: u64,
    end: u64,
    class: &'static str,
    note: String,
}

fn timeline(cp: &Checkpoint, hist: &[StepRecord], now: Timestamp) -> Markup {
    let mut bars: Vec<Bar> = hist
        .iter()
        .map(|r| {
            let runs = hist.iter().filter(|o| o.name == r.name).count();
            let took = r
                .finished_at
                .unix_millis()
                .saturating_sub(r.started_at.unix_millis());
            let mut note = format!("{took} ms");
            if r.attempt > 1 {
                note.push_str(&format!(", attempt {}", r.attempt));
            }
            if runs > 1 {
                note.push_str(&format!(", recorded {runs} times"));
            }
            Bar {
                name: &r.name,
                start: r.started_at.unix_millis(),
                end: r.finished_at.unix_millis(),
                class: if r.attempt > 1 { "bar retried" } else { "bar" },
                note,
            }
        })
        .collect();
    if let Some(f) = &cp.error {
        bars.push(Bar {
            name: &f.step,
            start: f.at.unix_millis(),
            end: f.at.unix_millis(),
            class: "bar failed",
            note: format!(
                "failed (attempt {}){}",
                f.attempt,
                if f.terminal { ", terminal" } else { "" }
            ),
        });
    }
    if let Some(Wait::Gate { step, since, .. }) = &cp.wait {
        bars.push(Bar {
            name: step,
            start: since.unix_millis(),
            end: now.unix_millis().max(since.unix_millis()),
            class: "bar gate",
            note: "waiting for a decision".into(),
        });
    }
    if bars.is_empty() {
        return html! { p.muted { "No step has run yet." } };
    }
    let t0 = bars.iter().map(|b| b.start).min().unwrap_or(0);
    let t1 = bars.iter().map(|b| b.end).max().unwrap_or(t0).max(t0 + 1);
    let span = (t1 - t0) as f64;
    let (label_w, chart_w, row_h) = (260.0, 740.0, 24.0);
    let height = bars.len() as f64 * row_h + 8.0;
    html! {
        div.timeline {
            svg viewBox={ "0 0 1000 " (height) } role="img" aria-label="step timeline" {
                @for (i, b) in bars.iter().enumerate() {
                    @let y = 4.0 + i as f64 * row_h;
                    @let x = label_w + (b.start - t0) as f64 / span * chart_w;
                    @let w = ((b.end - b.start) as f64 / span * chart_w).max(3.0);
                    text x="6" y=(y + 16.0) { (b.name) }
                    rect class=(b.class) x=(format!("{x:.1}")) y=(y + 3.0) width=(format!("{w:.1}")) height="16" rx="2" {
                        title { (b.name) ": " (b.note) }
                    }
                    @let inside = x + w > 820.0;
                    @let tx = if inside { x + 6.0 } else { x + w + 6.0 };
                    text.dim x=(format!("{tx:.1}")) y=(y + 16.0) { (b.note) }
                }
            }
            p.muted { "From " (Timestamp::from_unix_millis(t0).to_string()) " to " (Timestamp::from_unix_millis(t1).to_string()) }
        }
    }
}

fn hidden(csrf: &str, back: &str) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(csrf);
        input type="hidden" name="back" value=(back);
    }
}

/// The decision already recorded for the gate the run waits at, if any:
/// the run takes it when it is run again.
fn decided<'a>(
    cp: &'a Checkpoint,
    gate: &str,
    since: Timestamp,
) -> Option<&'a steadfast::Decision> {
    cp.decisions
        .iter()
        .rev()
        .find(|d| d.gate == gate && d.at >= since)
}

/// The approve and reject forms of a run waiting at `gate`, or the decision
/// made already.
fn decide(csrf: &str, cp: &Checkpoint, gate: &str, since: Timestamp, back: &str) -> Markup {
    let id = seg(&cp.run_id);
    if let Some(d) = decided(cp, gate, since) {
        return html! {
            p.decided {
                strong { @if d.approved { "Approved" } @else { "Rejected" } }
                " by " (d.by) " at " (d.at.to_string()) "; the run goes on when it is run again."
            }
        };
    }
    html! {
        form.action method="post" action={ "/runs/" (id) "/approve" } {
            (hidden(csrf, back))
            input type="hidden" name="gate" value=(gate);
            input type="hidden" name="since" value=(since.unix_millis());
            label { "Data (JSON, optional)" textarea name="data" placeholder="{\"note\": \"looks good\"}" {} }
            label { "Your name" input name="by" required; }
            button.approve type="submit" { "Approve" }
        }
        form.action method="post" action={ "/runs/" (id) "/reject" } {
            (hidden(csrf, back))
            input type="hidden" name="gate" value=(gate);
            input type="hidden" name="since" value=(since.unix_millis());
            label { "Reason" input name="reason" size="40"; }
            label { "Your name" input name="by" required; }
            button.reject type="submit" { "Reject" }
        }
    }
}

/// Cancel, retry, rewind and fork, each confirmed before it is sent.
fn operations(csrf: &str, cp: &Checkpoint) -> Markup {
    let id = seg(&cp.run_id);
    let finished = matches!(
        cp.status,
        RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
    );
    html! {
        h2 { "Operations" }
        @if !finished {
            form.action method="post" action={ "/runs/" (id) "/cancel" } data-confirm="Cancel this run? A cancelled run does not run again." {
                (hidden(csrf, "run"))
                label { "Reason" input name="reason"; }
                label { "Your name" input name="by" required; }
                button.danger type="submit" { "Cancel run" }
            }
        }
        @if cp.status == RunStatus::Failed {
            form.action method="post" action={ "/runs/" (id) "/retry" } data-confirm="Retry the failed step with a fresh budget of attempts?" {
                (hidden(csrf, "run"))
                label { "Your name" input name="by" required; }
                button type="submit" { "Retry" }
            }
        }
        @if !cp.completed.is_empty() {
            form.action method="post" action={ "/runs/" (id) "/rewind" } data-confirm="Rewind this run? The steps from the one chosen on run again." {
                (hidden(csrf, "run"))
                label { "To step" select name="to" { @for s in &cp.completed { option value=(s) { (s) } } } }
                label { "Your name" input name="by" required; }
                button type="submit" { "Rewind" }
            }
            form.action method="post" action={ "/runs/" (id) "/fork" } data-confirm="Fork a new run from this one?" {
                (hidden(csrf, "run"))
                label { "At step" select name="at" { @for s in &cp.completed { option value=(s) { (s) } } } }
                label { "New run id" input name="new_id" required; }
                label { "Your name" input name="by" required; }
                button type="submit" { "Fork" }
            }
        }
    }
}

/// One run: facts, the gate's forms, the timeline, state, decisions, audit.
pub(crate) fn run(
    store: &str,
    csrf: &str,
    cp: &Checkpoint,
    hist: Option<&[StepRecord]>,
    stuck: Option<&Stuck>,
    plan: Option<&steadfast::ops::plan::ResumePlan>,
    now: Timestamp,
) -> Markup {
    let state = Value::Object(cp.state.clone());
    let events = format!("/runs/{}/events", seg(&cp.run_id));
    layout_with(
        &cp.run_id,
        store,
        "runs",
        true,
        html! {
            h1 { "Run " span.id { (cp.run_id) } }
            dl.facts.box {
                dt { "Workflow" } dd { (cp.workflow) }
                @if let Some(v) = cp.origin.as_ref().and_then(|o| o.version.as_deref()) {
                    dt { "Workflow version" } dd { (v) }
                }
                dt { "Status" } dd { (badge(cp.status)) " " (stuck_label(stuck)) }
                dt { "Steps done" } dd { (cp.next) }
                dt { "Version" } dd { (cp.version) }
                dt { "Created" } dd { (cp.created_at.to_string()) }
                dt { "Updated" } dd { (cp.updated_at.to_string()) }
                @if let Some(l) = &cp.lease {
                    dt { "Held by" } dd { (l.owner.to_string()) " until " (l.until.to_string()) }
                }
                @if let Some(s) = stuck {
                    dt { "Stuck" } dd.stuck { (s.to_string()) }
                }
                @if let Some(sp) = cp.spend.as_ref().filter(|sp| !sp.is_empty()) {
                    dt { "Spent" } dd.spend { (crate::output::spend_text(sp)) }
                }
                @if let Some(p) = steadfast::ParentLink::of(&cp.state) {
                    dt { "Parent" } dd { a.parent href={ "/runs/" (seg(&p.run)) } { (p.run) } " (step " (p.step) ")" }
                }
                @let children = steadfast::children_of(cp, hist);
                @if !children.is_empty() {
                    dt { "Children" }
                    dd {
                        ul.children {
                            @for c in &children {
                                li {
                                    a.child href={ "/runs/" (seg(&c.run)) } { (c.run) }
                                    @if !c.step.is_empty() { " (step " (c.step) ")" }
                                    @if c.recorded { " done" } @else { " under way" }
                                }
                            }
                        }
                    }
                }
            }
            @match &cp.wait {
                Some(Wait::Gate { step, since, timeout_at, .. }) => {
                    div.box {
                        strong { "Waiting at gate " (step) } " since " (since.to_string())
                        @if let Some(t) = timeout_at { " (decides by itself at " (t.to_string()) ")" }
                        @if cp.status == RunStatus::Waiting { (decide(csrf, cp, step, *since, "run")) }
                    }
                }
                Some(Wait::Timer { step, until }) => {
                    div.box { "Sleeping at " (step) " until " (until.to_string()) }
                }
                Some(Wait::Limit { step, key, until }) => {
                    div.box.slot {
                        strong { "Waiting for a slot of limit " (key) } " before step " (step)
                        "; it looks again at " (until.to_string())
                    }
                }
                Some(Wait::Signal { step, signal, since, timeout_at, arrived, .. }) => {
                    div.box {
                        strong { "Waiting at " (step) " for signal " (signal) } " since " (since.to_string())
                        @if let Some(t) = timeout_at { " (gives up at " (t.to_string()) ")" }
                        @if *arrived { "; it was sent, and the run takes it when it runs next" }
                        p.muted { "Send it with " code { "steadfast signal " (cp.run_id) " " (signal) " --data JSON" } }
                    }
                }
                Some(Wait::Children { step, runs, since, arrived, .. }) => {
                    div.box {
                        strong { "Waiting at " (step) " for " (runs.len()) " child run(s)" } " since " (since.to_string())
                        @if *arrived { "; one ended, and the run takes its result when it runs next" }
                    }
                }
                _ => {}
            }
            @if let Some(f) = &cp.error {
                div.box.error {
                    strong { "Step " (f.index) " (" (f.step) ") failed" } " at " (f.at.to_string()) ", attempt " (f.attempt)
                    @if f.terminal { " (terminal)" }
                    pre { (f.message) }
                }
            }
            @if let Some(p) = plan {
                (resume_plan(p))
            }
            h2 { "Timeline" }
            @match hist {
                Some(h) => { (timeline(cp, h, now)) }
                None => { p.muted { "This store keeps no per-step history." } }
            }
            @if let Some(h) = hist {
                @if !h.is_empty() {
                    h2 { "Steps" }
                    table {
                        thead { tr { th { "#" } th { "Step" } th { "Attempt" } th { "Started" } th { "Took" } th { "Update" } } }
                        tbody {
                            @for r in h {
                                tr {
                                    td { (r.index) }
                                    td { (r.name) }
                                    td { (r.attempt) }
                                    td { (r.started_at.to_string()) }
                                    td { (r.finished_at.unix_millis().saturating_sub(r.started_at.unix_millis())) " ms" }
                                    td { details { summary { (r.update.len()) " key(s)" } pre { (pretty(&Value::Object(r.update.clone()))) } } }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "State" }
            details #state open { summary { (cp.state.len()) " key(s)" } pre { (pretty(&state)) } }
            @if !cp.decisions.is_empty() {
                h2 { "Decisions" }
                table {
                    thead { tr { th { "Gate" } th { "Decision" } th { "By" } th { "At" } th { "Data or reason" } } }
                    tbody {
                        @for d in &cp.decisions {
                            tr {
                                td { (d.gate) }
                                td { @if d.approved { "approved" } @else { "rejected" } }
                                td { (d.by) }
                                td { (d.at.to_string()) }
                                td {
                                    @if let Some(data) = &d.data { pre { (pretty(data)) } }
                                    @if let Some(r) = &d.reason { (r) }
                                }
                            }
                        }
                    }
                }
            }
            @if !cp.audit.is_empty() {
                h2 { "Audit" }
                table {
                    thead { tr { th { "What" } th { "By" } th { "At" } } }
                    tbody {
                        @for e in &cp.audit {
                            tr { td { (e.action.describe()) } td { (e.by) } td { (e.at.to_string()) } }
                        }
                    }
                }
            }
            (operations(csrf, cp))
        },
        Some((&events, cp.status)),
    )
}

/// The runs waiting at a gate, oldest first, each with its forms.
pub(crate) fn inbox(store: &str, csrf: &str, inbox: &super::Inbox) -> Markup {
    let (items, total) = (&inbox.items, inbox.total);
    layout(
        "Inbox",
        store,
        "inbox",
        true,
        html! {
            h1 { "Inbox" }
            p.muted {
                @if !inbox.exact { "up to " }
                (total) " run(s) waiting at a gate"
                @if total > items.len() { "; the oldest " (items.len()) " are shown" }
                "."
            }
            @for (id, why) in &inbox.unreadable {
                div.box.error { "Run " span.id { (id) } " cannot be read: " (why) }
            }
            @for w in items {
                div.inbox-item {
                    div {
                        a.id href={ "/runs/" (seg(&w.cp.run_id)) } { (w.cp.run_id) }
                        " · " (w.cp.workflow) " · gate " strong { (w.gate) }
                        " · waiting since " (w.since.to_string())
                    }
                    details { summary { "State it waits on (" (w.cp.state.len()) " key(s))" } pre { (pretty(&Value::Object(w.cp.state.clone()))) } }
                    (decide(csrf, &w.cp, &w.gate, w.since, "inbox"))
                }
            }
        },
    )
}

/// The login form, for a server with an access token.
pub(crate) fn login(store: &str, problem: Option<&str>) -> Markup {
    layout(
        "Log in",
        store,
        "",
        false,
        html! {
            h1 { "Access token" }
            @if let Some(p) = problem { div.box.error { (p) } }
            form.action method="post" action="/login" {
                label { "Token" input type="password" name="token" required autofocus; }
                button type="submit" { "Log in" }
            }
        },
    )
}

/// What resuming the run with the flow given to `serve` would do.
fn resume_plan(p: &steadfast::ops::plan::ResumePlan) -> Markup {
    use steadfast::ops::plan::StepAction;
    let word = |a: StepAction| match a {
        StepAction::Skip => "skip",
        StepAction::Changed => "changed",
        StepAction::Removed => "removed",
        StepAction::Renamed => "renamed",
        StepAction::Added => "added",
        StepAction::Moved => "moved",
        StepAction::Run => "run",
    };
    let shown = |v: &Option<Value>| match v {
        None => "(none)".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    html! {
        section.plan.box {
            h2 { "Resume plan with the flow given" }
            p {
                @if p.clean { strong.clean { "Clean" } ": a resume skips what is recorded and runs the rest." }
                @else { strong.changed { "Changed" } ": the flow differs from what the run recorded." }
            }
            table {
                thead { tr { th { "#" } th { "Step" } th { "Action" } th { "Details" } } }
                tbody {
                    @for s in &p.steps {
                        tr.{ "plan-" (word(s.action)) } {
                            td { @if let Some(i) = s.index { (i) } @else { "-" } }
                            td { (s.name) }
                            td { (word(s.action)) }
                            td {
                                @if let Some(old) = &s.recorded_name { "was " (old) " " }
                                @if let (StepAction::Moved | StepAction::Removed, Some(i)) = (s.action, s.recorded_index) { "recorded as step " (i) " " }
                                @for c in &s.changes { (c.field) ": " (shown(&c.was)) " → " (shown(&c.now)) "; " }
                            }
                        }
                    }
                }
            }
            @for n in &p.notes { p.muted { (n) } }
            @if let Some(stop) = &p.stops_at {
                p.error {
                    "A resume stops at step " (stop.at) " (workflow changed): the record has "
                    (stop.recorded.as_deref().unwrap_or("nothing")) " where the flow has "
                    (stop.given.as_deref().unwrap_or("nothing")) "."
                }
            }
            @if let Some(a) = &p.accept {
                p.muted {
                    "With --accept-changed-workflow: " (a.kept) " recorded step(s) count"
                    @for (was, now) in &a.relabelled { "; " (was) " counts as " (now) }
                    @if !a.dropped.is_empty() { "; no longer counted: " (a.dropped.join(", ")) }
                    @if let Some(r) = &a.resumes_at { "; goes on at " (r) }
                    "."
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode(s: &str) -> Vec<u8> {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).expect("hex");
                out.push(u8::from_str_radix(hex, 16).expect("hex"));
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        out
    }

    proptest! {
        /// An id is always one path segment of safe characters, and decodes
        /// back to itself.
        #[test]
        fn seg_is_one_safe_segment(s in any::<String>()) {
            let e = seg(&s);
            prop_assert!(e.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
            prop_assert_eq!(decode(&e), s.as_bytes());
            prop_assert!(e != "." && e != "..", "{e:?} is a dot segment");
        }

        /// Tag-shaped text in a run's id, workflow, state and error never
        /// reaches the page as markup.
        #[test]
        fn a_run_page_shows_tags_as_text(
            tag in "<[a-z]{1,6} [a-z]{2,8}=\"?[a-z0-9()=.]{1,12}\"?>",
            key in "[a-z<>\"']{1,8}",
        ) {
            let now = Timestamp::from_unix_millis(1_800_000_000_000);
            let mut cp = Checkpoint::new(format!("run{tag}"), format!("wf{tag}"), now);
            cp.state.insert(key.clone(), serde_json::json!({"v": tag.clone()}));
            cp.state.insert(tag.clone(), serde_json::json!(1));
            cp.status = RunStatus::Waiting;
            cp.wait = Some(Wait::Gate {
                step: format!("gate{tag}"),
                since: now,
                timeout_at: None,
                on_timeout: Default::default(),
            });
            let page = run("store", "csrf", &cp, Some(&[]), None, None, now).0;
            prop_assert!(!page.contains(&tag), "{tag} appears as markup");
            let listed = runs(
                "store",
                &RunsQuery::default(),
                &[(RunSummary::from(&cp), None)],
                50,
            )
            .0;
            prop_assert!(!listed.contains(&tag), "{tag} appears as markup in the list");
        }
    }

    /// A parent's page links its children, done and under way, and says
    /// what it waits for; a child's page links its parent.
    #[test]
    fn run_pages_link_parents_and_children() {
        let now = Timestamp::from_unix_millis(1_800_000_000_000);
        let mut cp = Checkpoint::new("p/1", "writer", now);
        cp.status = RunStatus::Waiting;
        cp.completed.push("a".into());
        cp.next = 1;
        let mut update = steadfast::Update::new();
        update.insert("a".into(), serde_json::json!("result"));
        update.insert(
            steadfast::CHILD_KEY.into(),
            serde_json::json!(steadfast::child_id("p/1", "a")),
        );
        let records = [StepRecord::new(0, "a", update, 1, now, now)];
        cp.wait = Some(Wait::Children {
            step: "b".into(),
            runs: vec![steadfast::child_id("p/1", "b")],
            since: now,
            arrived: false,
            recheck_at: None,
        });
        let page = run("store", "csrf", &cp, Some(&records), None, None, now).0;
        assert!(page.contains("href=\"/runs/p%2F1~a\""), "{page}");
        assert!(page.contains("href=\"/runs/p%2F1~b\""), "{page}");
        assert!(page.contains("Waiting at b for 1 child run(s)"), "{page}");
        assert!(page.contains(" (step b) under way"), "{page}");
        let mut child = Checkpoint::new("p/1~a", "researcher", now);
        child.state.insert(
            steadfast::PARENT_KEY.into(),
            steadfast::ParentLink::new("p/1", "a", now).to_value(),
        );
        let page = run("store", "csrf", &child, Some(&[]), None, None, now).0;
        assert!(page.contains("href=\"/runs/p%2F1\""), "{page}");
        assert!(page.contains("(step a)"), "{page}");
    }
}
