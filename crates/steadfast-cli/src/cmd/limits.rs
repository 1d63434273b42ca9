//! `steadfast limits set KEY [N] [--rate N/PERIOD] [--burst N]` and
//! `steadfast limits list`: shared concurrency and rate limits of a store.

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output::{self, out};

/// Arguments of `limits`.
#[derive(clap::Args, Debug)]
pub struct LimitsArgs {
    /// `set` or `list`.
    #[command(subcommand)]
    pub what: LimitsCommand,
}

/// What `limits` does.
#[derive(clap::Subcommand, Debug)]
pub enum LimitsCommand {
    /// Set a key's size (steps holding it at once) and rate (starts per
    /// period), for every process on the store.
    Set(SetArgs),
    /// List the keys, their settings and who holds their slots.
    List(ListArgs),
}

/// Arguments of `limits set`.
#[derive(clap::Args, Debug)]
pub struct SetArgs {
    /// The key (letters, digits, `_`, `-`, `.`, `/`), as steps name it.
    pub key: String,
    /// How many steps holding the key may run at once (1 to 100000); none
    /// leaves each step's own (`limit = "KEY:N"`).
    pub size: Option<u32>,
    /// At most N starts per period: `500/min`, `10/s`, `2/1h`.
    #[arg(long)]
    pub rate: Option<String>,
    /// Starts allowed at once after a quiet spell (default: one period's).
    #[arg(long, requires = "rate")]
    pub burst: Option<f64>,
    /// Print the limit as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `limits list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `limits set` or `limits list`.
pub async fn run(args: LimitsArgs, ctx: &Ctx) -> Result<i32, Failure> {
    match args.what {
        LimitsCommand::Set(a) => {
            let rate = match &a.rate {
                Some(text) => Some(
                    steadfast::Rate::parse(text, a.burst)
                        .map_err(|reason| super::usage(format!("--rate {text:?}: {reason}")))?,
                ),
                None => None,
            };
            let entry = steadfast::limits_ops::set_limit(&*ctx.store, &a.key, a.size, rate).await?;
            if a.json {
                out!("{}", serde_json::to_value(&entry).unwrap_or_default());
            } else {
                output::note(format_args!(
                    "limit {:?}: {}",
                    entry.key,
                    describe(&entry.doc)
                ));
            }
            Ok(exit::OK)
        }
        LimitsCommand::List(a) => {
            let all = steadfast::limits_ops::list_limits(&*ctx.store).await?;
            if a.json {
                out!("{}", serde_json::to_value(&all).unwrap_or_default());
                return Ok(exit::OK);
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|e| {
                    vec![
                        e.key.clone(),
                        e.doc.size.map_or("(steps')".into(), |n| n.to_string()),
                        e.doc.rate.as_ref().map_or(String::new(), rate_text),
                        e.doc.held.len().to_string(),
                        e.doc.paused_until.map_or(String::new(), |t| t.to_string()),
                    ]
                })
                .collect();
            output::table(&["KEY", "SIZE", "RATE", "HELD", "PAUSED UNTIL"], &rows);
            Ok(exit::OK)
        }
    }
}

fn rate_text(r: &steadfast::Rate) -> String {
    format!(
        "{}/{} (burst {})",
        output::amount(r.tokens),
        humantime::format_duration(std::time::Duration::from_millis(r.per_ms)),
        output::amount(r.burst)
    )
}

fn describe(doc: &steadfast::LimitDoc) -> String {
    let size = doc
        .size
        .map_or("each step's own size".into(), |n| format!("{n} at once"));
    match &doc.rate {
        Some(r) => format!("{size}, at most {}", rate_text(r)),
        None => size,
    }
}
