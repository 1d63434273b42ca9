//! An agent pipeline that crashes in the middle and resumes where it stopped.
//!
//! The example starts itself again as a child process. The child runs the
//! pipeline and dies (`std::process::exit`) inside the `call_tool` step, after
//! `retrieve` and `think` have been checkpointed. The parent then runs the same
//! run id and prints which steps were skipped because they were done and which
//! ran.
//!
//! It uses the embedded default store (`sqlite:.steadfast/runs.db`), so the run
//! can be inspected afterwards with `sqlite3 .steadfast/runs.db`.
//!
//! ```text
//! cargo run --example resume_after_crash
//! ```

use std::process::Command;
use std::time::Duration;

use serde_json::json;
use steadfast::{
    open_store, update, Event, Outcome, RetryPolicy, Runner, Step, StoreExt, Workflow,
    DEFAULT_STORE_URL,
};

const RUN_ID: &str = "research-42";
const CHILD: &str = "STEADFAST_EXAMPLE_CRASH_IN";

fn pipeline(crash_in: Option<String>) -> Result<Workflow, steadfast::Error> {
    let crash = move |name: &str| {
        if crash_in.as_deref() == Some(name) {
            println!("  [child] {name}: the process dies here (exit code 3)");
            std::process::exit(3);
        }
    };
    let (c1, c2, c3) = (crash.clone(), crash.clone(), crash);
    Workflow::builder("research-agent")
        .step("retrieve", |ctx, _state| async move {
            println!("  retrieve: fetching documents (attempt {})", ctx.attempt());
            update(json!({"docs": ["durable execution", "write-ahead logging"]}))
        })
        .step("think", |_ctx, state| async move {
            let n = state["docs"].as_array().map_or(0, |d| d.len());
            println!("  think: the model reads {n} documents");
            update(json!({"plan": "summarize both and cite them"}))
        })
        .push(
            Step::new("call_tool", move |ctx, _state| {
                c1("call_tool");
                async move {
                    println!(
                        "  call_tool: calling the tool with key {}",
                        ctx.idempotency_key()
                    );
                    update(json!({"tool_result": "2 citations"}))
                }
            })
            .retry(RetryPolicy::new(3))
            .timeout(Duration::from_secs(30)),
        )
        .step("write", move |_ctx, state| {
            c2("write");
            async move {
                println!("  write: storing the answer ({})", state["tool_result"]);
                update(json!({"answer": "Checkpoint after every step; resume at the next."}))
            }
        })
        .step("notify", move |_ctx, _state| {
            c3("notify");
            async { update(json!({"notified": true})) }
        })
        .build()
}

fn progress(event: &Event<'_>) {
    match event {
        Event::Skipped { index, step } => println!("  skip {index} {step}: done before the crash"),
        Event::Completed {
            index, step, took, ..
        } => {
            println!("  done {index} {step} in {took:.1?}, checkpoint saved")
        }
        Event::Failed { step, error, .. } => println!("  fail {step}: {error}"),
        _ => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The embedded default store: SQLite in .steadfast/runs.db.
    let store = open_store(DEFAULT_STORE_URL).await?;
    if let Ok(crash_in) = std::env::var(CHILD) {
        let wf = pipeline(Some(crash_in))?;
        Runner::new(&*store)
            .observer(progress)
            .run(RUN_ID, &wf)
            .await?;
        return Ok(());
    }

    store.delete(RUN_ID).await?;
    println!("1) a fresh run of {RUN_ID:?} in a child process, which crashes in call_tool:");
    let status = Command::new(std::env::current_exe()?)
        .env(CHILD, "call_tool")
        .status()?;
    println!("   child exited with {status}");

    let cp = store
        .load(RUN_ID)
        .await?
        .ok_or("no checkpoint after the crash")?;
    println!(
        "2) the store {DEFAULT_STORE_URL} holds {} completed steps: {:?}",
        cp.next, cp.completed
    );

    println!("3) the same run id again, in this process:");
    let wf = pipeline(None)?;
    let outcome = Runner::new(&*store)
        .observer(progress)
        .run(RUN_ID, &wf)
        .await?;
    if let Outcome::Completed(state) = outcome {
        println!("4) completed; final state:");
        println!("{}", serde_json::to_string_pretty(&state)?);
    }
    if let Some(history) = store.history(RUN_ID).await? {
        println!("5) the run's history (one row per step in the steps table):");
        for step in history {
            println!(
                "  {} {:<10} attempt {} at {}",
                step.index, step.name, step.attempt, step.finished_at
            );
        }
    }
    Ok(())
}
