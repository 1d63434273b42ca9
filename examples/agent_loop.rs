//! An agent loop as a durable function: a scripted stand-in model chooses
//! tools, some run in parallel, an approval gate guards the answer, and the
//! process is killed in the middle of a loop iteration.
//!
//! The example starts itself again as a child process, which dies while a tool
//! of the second iteration is running (after its sibling tools finished). The
//! parent then runs the same run id: the recorded steps come back from the
//! record without running, the unfinished tool runs live, the run stops at the
//! gate, is approved, and finishes.
//!
//! ```text
//! cargo run --example agent_loop
//! ```

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use steadfast::{
    approve, open_store, DurableCtx, Error, Event, Outcome, Runner, StepError, Store, SystemClock,
    DEFAULT_STORE_URL,
};

const RUN_ID: &str = "agent-loop-demo";
const CHILD: &str = "STEADFAST_EXAMPLE_CRASH";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct ToolCall {
    id: String,
    tool: String,
    arg: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    done: bool,
    answer: String,
    tool_calls: Vec<ToolCall>,
}

/// The stand-in model: a fixed script, so every run makes the same choices.
async fn model(turn: u32, seen: usize) -> Result<Reply, StepError> {
    tokio::time::sleep(Duration::from_millis(20)).await;
    let call = |id: &str, tool: &str, arg: &str| ToolCall {
        id: id.into(),
        tool: tool.into(),
        arg: arg.into(),
    };
    Ok(match turn {
        0 => Reply {
            done: false,
            answer: String::new(),
            tool_calls: vec![call("t0-search", "search", "durable execution")],
        },
        1 => Reply {
            done: false,
            answer: String::new(),
            tool_calls: vec![
                call("t1-search", "search", "write-ahead log"),
                call("t1-fetch", "fetch", "https://example.invalid/paper"),
                call("t1-calc", "calc", "2 * 21"),
            ],
        },
        _ => Reply {
            done: true,
            answer: format!("checkpoint every step; {seen} tool results considered"),
            tool_calls: vec![],
        },
    })
}

/// The tools. In the child, `fetch` takes long enough to be killed in.
async fn call_tool(call: ToolCall, crash: bool) -> Result<String, StepError> {
    if call.tool == "fetch" && crash {
        tokio::time::sleep(Duration::from_millis(300)).await;
        println!("  [child] killed while running {}", call.id);
        std::process::exit(9);
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    Ok(format!("{}({}) -> ok", call.tool, call.arg))
}

async fn agent(ctx: DurableCtx<'static, Arc<dyn Store>>, crash: bool) -> Result<String, Error> {
    let docs: Vec<String> = ctx
        .step("retrieve", || async {
            Ok::<_, StepError>(vec!["notes.txt".to_string(), "paper.pdf".to_string()])
        })
        .await?;
    let mut results: Vec<String> = Vec::new();
    let mut turn = 0;
    let answer = loop {
        let seen = results.len();
        let reply: Reply = ctx
            .step(ctx.numbered("think"), || model(turn, seen))
            .await?;
        if reply.done {
            break reply.answer;
        }
        let calls = reply
            .tool_calls
            .into_iter()
            .map(|c| (c.id.clone(), call_tool(c, crash)));
        results.extend(ctx.parallel(calls).await?);
        turn += 1;
    };
    ctx.gate("approve-answer").await?;
    ctx.step("publish", || async { Ok::<_, StepError>(()) })
        .await?;
    Ok(format!("{answer} (from {} documents)", docs.len()))
}

fn progress(event: &Event<'_>) {
    match event {
        Event::Skipped { step, .. } => println!("  replayed {step:<16} from the record"),
        Event::Completed { step, took, .. } => println!("  ran      {step:<16} live, {took:.0?}"),
        _ => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = open_store(DEFAULT_STORE_URL).await?;
    if std::env::var(CHILD).is_ok() {
        let _ = Runner::new(&store)
            .observer(progress)
            .durable(RUN_ID, "research-agent-loop", |ctx| agent(ctx, true))
            .await;
        return Ok(());
    }

    store.delete(RUN_ID).await?;
    println!("1) a child process runs the agent and is killed during a tool call of turn 1:");
    let status = Command::new(std::env::current_exe()?)
        .env(CHILD, "1")
        .status()?;
    println!("   child exited with {status}");

    println!("2) the same run id again, in this process:");
    let runner = Runner::new(&store).observer(progress);
    let outcome = runner
        .durable(RUN_ID, "research-agent-loop", |ctx| agent(ctx, false))
        .await?;
    if let Outcome::Waiting { gate } = &outcome {
        println!("   stopped at gate {gate:?}; approving it");
        approve(&store, RUN_ID, gate, None, "example", &SystemClock).await?;
    }
    println!("3) once more, past the gate:");
    let outcome = runner
        .durable(RUN_ID, "research-agent-loop", |ctx| agent(ctx, false))
        .await?;
    if let Outcome::Completed(answer) = outcome {
        println!("4) completed: {answer}");
    }
    Ok(())
}
