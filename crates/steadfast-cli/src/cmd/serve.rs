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

/// Reads a token file of at most [`MAX_TOKEN_FILE_BYTES`]; it must be a
/// regular file (or a link to one). It is opened without waiting (a FIFO
/// would wait for a writer forever) and what was opened is checked, so a
/// FIFO put in its place after a look is refused too.
fn token_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "a FIFO, socket or device"
        };
        return Err(std::io::Error::other(format!(
            "it is {what}, not a regular file holding the token"
        )));
    }
    let mut text = String::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "it is over {MAX_TOKEN_FILE_BYTES} bytes; a token file holds one token"
        )));
    }
    Ok(text)
}

/// The shortest token accepted: a guessable one would be no lock.
const MIN_TOKEN_BYTES: usize = 16;

/// Serves until interrupted.
pub async fn run(args: ServeArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let token = match &args.token_file {
        Some(path) => Some(
            token_file(path)
                .map_err(|e| usage(format!("--token-file {}: {e}", path.display())))?
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
    crate::serve::serve(ctx, args.addr, token, limits).await?;
    Ok(crate::args::exit::OK)
}
