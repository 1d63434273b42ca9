//! `steadfast serve`: a web page over the store (runs, a run's timeline, the
//! inbox of gates waiting for a person), and the same data as JSON.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{usage, Ctx, Failure};

/// The variable holding the access token (or use `--token-file`).
pub const TOKEN_ENV: &str = "STEADFAST_SERVE_TOKEN";

/// Arguments of `serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where to listen. Any address but a loopback one needs a token.
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub addr: SocketAddr,
    /// A file holding the access token (else $STEADFAST_SERVE_TOKEN); with a
    /// token, every request must carry it.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// How long a client may take to send a request's headers before the
    /// connection is closed (slow clients cannot hold connections open).
    #[arg(long, default_value = "10s", value_parser = parse_header_timeout)]
    pub header_timeout: Duration,
    /// How long a run may stand still before it is labelled stuck.
    #[arg(long, default_value = "1m", value_parser = super::runs::parse_after)]
    pub stuck_after: Duration,
    /// Flow files: a run of one of their workflows shows what resuming it
    /// with that flow would do (its plan; `steadfast plan`).
    #[arg(long = "flow", value_name = "FLOW")]
    pub flows: Vec<PathBuf>,
}

/// Parses `--header-timeout`: 100 ms to 10 minutes.
fn parse_header_timeout(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(600) {
        return Err("it must be between 100ms and 10m".into());
    }
    Ok(d)
}

/// The largest token file read: a token is a line, not a document.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// Reads a token file: a regular file of this user's (or a link to one)
/// that no one else can read or change, of at most
/// [`MAX_TOKEN_FILE_BYTES`], checked as key files are
/// ([`read_secret_file`](steadfast::local::read_secret_file)).
fn token_file(path: &std::path::Path) -> Result<String, String> {
    steadfast::local::read_secret_file(path, "token file", MAX_TOKEN_FILE_BYTES, true)
}

/// The shortest token accepted: a guessable one would be no lock.
const MIN_TOKEN_BYTES: usize = 16;

/// Serves until interrupted.
pub async fn run(args: ServeArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let token = match &args.token_file {
        Some(path) => Some(
            token_file(path)
                .map_err(|e| usage(format!("--token-file: {e}")))?
                .trim()
                .to_string(),
        ),
        // Unset or empty: no token. A value that is set but unusable (not
        // UTF-8, blank) is an error, never a server without its lock.
        None => match std::env::var(TOKEN_ENV) {
            Ok(t) if t.is_empty() => None,
            Ok(t) => Some(t.trim().to_string()),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(usage(format!("{TOKEN_ENV} is not valid UTF-8")));
            }
        },
    };
    if let Some(t) = &token {
        if t.len() < MIN_TOKEN_BYTES || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(usage(format!(
                "the access token must be at least {MIN_TOKEN_BYTES} visible ASCII characters (no spaces)"
            )));
        }
    }
    if !args.addr.ip().is_loopback() && token.is_none() {
        return Err(usage(format!(
            "serving on {} (not a loopback address) needs an access token: set {TOKEN_ENV} or pass --token-file; refusing to start",
            args.addr
        )));
    }
    let limits = crate::serve::Limits {
        stuck_after: args.stuck_after,
        header_timeout: args.header_timeout,
    };
    let flows = super::runs::load_flows(&args.flows)?;
    crate::serve::serve(ctx, args.addr, token, limits, flows).await?;
    Ok(crate::args::exit::OK)
}
