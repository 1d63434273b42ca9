//! `steadfast serve`: an HTTP server over any store, with pages for people
//! (runs, a run's timeline, the inbox of gates) and the same data as JSON
//! under `/api/` for programs.
//!
//! Safe by default: it listens on a loopback address unless told otherwise,
//! and then only with an access token; every change is a POST carrying the
//! page's CSRF token; every value from a run is escaped by the templates
//! (maud) and no inline script may run (Content-Security-Policy).

mod pages;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;
use steadfast::stuck::{diagnose, Stuck};
use steadfast::{Checkpoint, Error, ListFilter, RunStatus, RunSummary, StepRecord, Store};

use crate::cmd::{Ctx, Failure};
use steadfast::StoreExt as _;

/// Runs on one page of the list, unless the request asks for fewer.
const PAGE: usize = 50;
/// The most runs one page or API call lists.
const MAX_PAGE: usize = 500;
/// Waiting runs the inbox shows, oldest first.
const INBOX: usize = 50;
/// The cookie that marks a browser that gave the access token.
const SESSION_COOKIE: &str = "steadfast_session";

/// What every handler shares.
pub(crate) struct App {
    store: Arc<dyn Store>,
    clock: Arc<dyn steadfast::Clock>,
    /// Put in every form and checked on every POST.
    csrf: String,
    token: Option<String>,
    /// What the login cookie carries: a random value of this process, not
    /// the token (a cookie goes to every port of the host).
    session: String,
    /// The port it listens on: without a token, only requests naming a
    /// loopback host with this port are served (no DNS rebinding).
    port: u16,
    stuck_after: Duration,
    /// The store's URL without its password, shown in the header.
    url: String,
    /// One permit per open event stream (at most [`MAX_STREAMS`]).
    streams: Arc<tokio::sync::Semaphore>,
    /// Flows given with `--flow`: a run of one of their workflows shows
    /// its resume plan.
    flows: Vec<steadfast::Workflow>,
}

type Shared = State<Arc<App>>;

/// The most connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;

/// The most event streams open at once (each holds a connection and polls
/// the store); more are answered 503 and the browser tries again later.
const MAX_STREAMS: usize = 64;

/// The server's bounds.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long a run may stand still before it is labelled stuck.
    pub stuck_after: Duration,
    /// How long a client may take to send a request's headers.
    pub header_timeout: Duration,
}

/// Serves the pages on `addr` until interrupted.
pub async fn serve(
    ctx: &Ctx,
    addr: SocketAddr,
    token: Option<String>,
    limits: Limits,
    flows: Vec<steadfast::Workflow>,
) -> Result<(), Failure> {
    let stuck_after = limits.stuck_after;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().unwrap_or(addr);
    let app = Arc::new(App {
        store: Arc::clone(&ctx.store),
        clock: ctx.clock(),
        csrf: random_token()?,
        token,
        session: random_token()?,
        port: bound.port(),
        stuck_after,
        url: ctx.url.clone(),
        streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        flows,
    });
    crate::output::note(format_args!(
        "serving {} on http://{bound}/{}",
        ctx.url,
        if app.token.is_some() {
            " (access token required)"
        } else {
            ""
        }
    ));
    accept(listener, router(app), limits.header_timeout).await
}

/// Accepts connections until interrupted: at most [`MAX_CONNECTIONS`] at
/// once, each closed when its client is slower than `header_timeout` to send
/// a request's headers.
async fn accept(
    listener: tokio::net::TcpListener,
    app: Router,
    header_timeout: Duration,
) -> Result<(), Failure> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            _ = &mut stop => return Ok(()),
            p = Arc::clone(&slots).acquire_owned() => p.map_err(|e| anyhow::anyhow!("{e}"))?,
        };
        let (stream, _) = tokio::select! {
            _ = &mut stop => return Ok(()),
            a = listener.accept() => match a {
                Ok(a) => a,
                // Out of file descriptors, a reset before accept: go on.
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _held = permit;
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Every route, behind the token check and the security headers.
pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/runs", get(runs_page))
        .route("/runs/{id}", get(run_page))
        .route("/inbox", get(inbox_page))
        .route("/runs/{id}/events", get(run_events))
        .route("/runs/{id}/approve", post(approve))
        .route("/runs/{id}/reject", post(reject))
        .route("/runs/{id}/cancel", post(cancel))
        .route("/runs/{id}/retry", post(retry))
        .route("/runs/{id}/rewind", post(rewind))
        .route("/runs/{id}/fork", post(fork))
        .route("/api/runs", get(api_runs))
        .route("/api/runs/{id}", get(api_run))
        .route("/api/runs/{id}/history", get(api_history))
        .route("/api/runs/{id}/plan", get(api_plan))
        .route("/api/inbox", get(api_inbox))
        .route("/assets/app.css", get(css))
        .route("/assets/app.js", get(js))
        .route("/login", get(login_page).post(login))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            guard,
        ))
        .layer(axum::middleware::from_fn(headers))
        .with_state(app)
}

/// A random token from the system's generator, as hex.
fn random_token() -> Result<String, Failure> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| anyhow::anyhow!("cannot read /dev/urandom for the CSRF token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Equal in time that does not depend on where the first difference is.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// With a token, lets through only requests that carry it (the login page
/// and the assets excepted).
async fn guard(State(app): Shared, req: Request, next: Next) -> Response {
    let Some(token) = &app.token else {
        // Without a token only this machine may ask, and a page elsewhere
        // could still reach a loopback server by pointing its own host name
        // at 127.0.0.1 (DNS rebinding): the request must name a loopback
        // host and this port.
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !loopback_host(host, app.port) {
            return (
                StatusCode::MISDIRECTED_REQUEST,
                format!("this server answers only requests to 127.0.0.1:{0}, localhost:{0} or [::1]:{0}; serve with a token to reach it by another name", app.port),
            )
                .into_response();
        }
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/login" || path.starts_with("/assets/") {
        return next.run(req).await;
    }
    let headers = req.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let by_header = bearer.is_some_and(|g| same(g, token));
    let by_cookie = cookie(headers, SESSION_COOKIE).is_some_and(|c| same(c, &app.session));
    if by_header || by_cookie {
        return next.run(req).await;
    }
    if path.starts_with("/api/") {
        return api_error(
            StatusCode::UNAUTHORIZED,
            "an access token is required (Authorization: Bearer TOKEN)",
        );
    }
    Redirect::to("/login").into_response()
}

/// Whether a Host header names this machine's loopback with `port`.
fn loopback_host(host: &str, port: u16) -> bool {
    ["127.0.0.1", "localhost", "[::1]"]
        .iter()
        .any(|h| host.eq_ignore_ascii_case(&format!("{h}:{port}")))
}

/// Headers on every response: no inline script, no framing, no sniffing.
async fn headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/app.css"),
    )
}

async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/app.js"),
    )
}

/// A failure shown to a person: what and where, with its status.
pub(crate) struct PageError {
    status: StatusCode,
    title: String,
    detail: String,
}

impl PageError {
    fn new(status: StatusCode, title: impl Into<String>, detail: impl Into<String>) -> Self {
        PageError {
            status,
            title: title.into(),
            detail: detail.into(),
        }
    }

    /// An engine error, with the status it deserves.
    fn engine(what: String, e: &Error) -> Self {
        let status = match e {
            Error::NoSuchRun { .. } => StatusCode::NOT_FOUND,
            Error::InvalidInput { .. }
            | Error::InvalidRunId { .. }
            | Error::NotWaiting { .. }
            | Error::Held { .. } => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        PageError::new(status, what, steadfast::error_chain(e))
    }

    fn store(what: String, e: &steadfast::StoreError) -> Self {
        PageError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            what,
            steadfast::error_chain(e),
        )
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::response::Html(pages::error(&self.title, &self.detail).into_string()),
        )
            .into_response()
    }
}

fn api_error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({"error": message}))).into_response()
}

impl From<PageError> for ApiError {
    fn from(e: PageError) -> Self {
        ApiError(e)
    }
}

/// A [`PageError`] answered as JSON.
pub(crate) struct ApiError(PageError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        api_error(
            self.0.status,
            &format!("{}: {}", self.0.title, self.0.detail),
        )
    }
}

/// The run's record, or why not (naming the run).
async fn load(app: &App, id: &str) -> Result<Checkpoint, PageError> {
    steadfast::validate_run_id(id).map_err(|e| PageError::engine(format!("run {id:?}"), &e))?;
    match app.store.load(id).await {
        Ok(Some(cp)) => Ok(cp),
        Ok(None) => Err(no_such_run(id)),
        Err(e) => Err(PageError::store(format!("run {id:?} cannot be read"), &e)),
    }
}

fn no_such_run(id: &str) -> PageError {
    PageError::new(
        StatusCode::NOT_FOUND,
        format!("run {id:?}"),
        format!("no run {id:?} in the store"),
    )
}

/// The run's step records; `None` when the store keeps no per-step history
/// (as `steadfast show` treats it). A run gone since it was loaded is 404.
async fn history(app: &App, id: &str) -> Result<Option<Vec<StepRecord>>, PageError> {
    match app.store.history(id).await {
        Ok(Some(records)) => Ok(Some(records)),
        Ok(None) => Err(no_such_run(id)),
        Err(e) if e.kind() == steadfast::StoreErrorKind::Unsupported => Ok(None),
        Err(e) => Err(PageError::store(
            format!("the history of run {id:?} cannot be read"),
            &e,
        )),
    }
}

fn stuck(app: &App, cp: &Checkpoint) -> Option<Stuck> {
    diagnose(cp, app.clock.now(), app.stuck_after, None)
}

/// The filters of the runs list.
#[derive(Deserialize, Default)]
pub(crate) struct RunsQuery {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    workflow: Option<String>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

impl RunsQuery {
    fn filter(&self) -> Result<(ListFilter, usize), PageError> {
        let bad = |what: String| PageError::new(StatusCode::BAD_REQUEST, "the runs list", what);
        let mut f = ListFilter::new();
        if let Some(s) = self.status.as_deref().filter(|s| !s.is_empty()) {
            let status: RunStatus = s
                .parse()
                .map_err(|_| bad(format!("status {s:?} is not a run status")))?;
            f = f.status(status);
        }
        if let Some(w) = self.workflow.as_deref().filter(|w| !w.is_empty()) {
            f = f.workflow(w);
        }
        if let Some(a) = self.after.as_deref().filter(|a| !a.is_empty()) {
            f = f.after(a);
        }
        let limit = self.limit.unwrap_or(PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(bad(format!(
                "limit {limit} is out of range: 1 to {MAX_PAGE}"
            )));
        }
        Ok((f.limit(limit), limit))
    }
}

/// A page of runs, each with its stuck label.
async fn list(
    app: &App,
    q: &RunsQuery,
) -> Result<(Vec<(RunSummary, Option<Stuck>)>, usize), PageError> {
    let (filter, limit) = q.filter()?;
    let rows = app
        .store
        .list(&filter)
        .await
        .map_err(|e| PageError::store("the runs cannot be listed".into(), &e))?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        // Only a run that has not finished can be stuck; the others need
        // no second read.
        // Encrypted without the keys, unreadable, or deleted since: listed
        // without a label, as `steadfast runs` does.
        let label = if matches!(
            r.status,
            RunStatus::Completed | RunStatus::Rejected | RunStatus::Cancelled
        ) {
            None
        } else {
            match app.store.load(&r.run_id).await {
                Ok(Some(cp)) => stuck(app, &cp),
                Ok(None) | Err(_) => None,
            }
        };
        out.push((r, label));
    }
    Ok((out, limit))
}

async fn runs_page(State(app): Shared, Query(q): Query<RunsQuery>) -> Result<Response, PageError> {
    let (rows, limit) = list(&app, &q).await?;
    Ok(axum::response::Html(pages::runs(&app.url, &q, &rows, limit).into_string()).into_response())
}

async fn run_page(State(app): Shared, Path(id): Path<String>) -> Result<Response, PageError> {
    let cp = load(&app, &id).await?;
    let hist = history(&app, &id).await?;
    let label = stuck(&app, &cp);
    let plan = plan_of(&app, &cp, hist.as_deref());
    Ok(axum::response::Html(
        pages::run(
            &app.url,
            &app.csrf,
            &cp,
            hist.as_deref(),
            label.as_ref(),
            plan.as_ref(),
            app.clock.now(),
        )
        .into_string(),
    )
    .into_response())
}

/// How long a browser waits before it reconnects to a stream that broke.
const EVENTS_RETRY: Duration = Duration::from_millis(500);

/// A run's events and steps as Server-Sent Events, until it ends or stops.
/// Each emitted event carries its number as its `id`, so a browser that
/// reconnects (it sends the last one as `Last-Event-ID`) goes on after it;
/// the other items are named by their kind (`done`, `completed`…), their
/// data the JSON `steadfast watch --json` prints.
async fn run_events(
    State(app): Shared,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    steadfast::validate_run_id(&id).map_err(|e| PageError::engine(format!("run {id:?}"), &e))?;
    let after = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => 0,
        Some(Ok(text)) => text.trim().parse::<u64>().map_err(|_| PageError {
            status: StatusCode::BAD_REQUEST,
            title: "Bad Last-Event-ID".into(),
            detail: format!("{text:?} is not an event number"),
        })?,
        Some(Err(_)) => {
            return Err(PageError {
                status: StatusCode::BAD_REQUEST,
                title: "Bad Last-Event-ID".into(),
                detail: "the header is not text".into(),
            })
        }
    };
    if app.store.capabilities().events.is_none() {
        return Err(PageError {
            status: StatusCode::NOT_FOUND,
            title: "No events".into(),
            detail: "this store keeps no event log".into(),
        });
    }
    // A stream is opened only for a run there is (a watch would wait for
    // any id), and only so many at once.
    load(&app, &id).await?;
    let permit = Arc::clone(&app.streams).try_acquire_owned().map_err(|_| {
        PageError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Too many event streams",
            format!("{MAX_STREAMS} event streams are open; try again later"),
        )
    })?;
    let watch = steadfast::watch::Watch::shared(Arc::clone(&app.store), &id).after(after);
    let first = Event::default().retry(EVENTS_RETRY).comment("watching");
    // The permit lives as long as the stream.
    let items = futures_util::stream::unfold(Some((watch, permit)), |state| async move {
        let (mut watch, permit) = state?;
        let event = match watch.next().await {
            Ok(Some(item)) => {
                let data = serde_json::to_string(&item).unwrap_or_else(|_| "{}".into());
                let event = Event::default().event(item.kind()).data(data);
                match &item {
                    steadfast::watch::WatchItem::Event { event: e } => event.id(e.seq.to_string()),
                    steadfast::watch::WatchItem::Signal { signal } => {
                        event.id(signal.seq.to_string())
                    }
                    _ => event,
                }
            }
            Ok(None) => return None,
            Err(e) => {
                // Said once, then the stream ends. Named apart from the
                // browser's own `error` (a broken connection).
                let data = serde_json::json!({ "error": steadfast::error_chain(&e) }).to_string();
                return Some((Ok(Event::default().event("watch-error").data(data)), None));
            }
        };
        Some((
            Ok::<_, std::convert::Infallible>(event),
            Some((watch, permit)),
        ))
    });
    let stream =
        futures_util::StreamExt::chain(futures_util::stream::once(async move { Ok(first) }), items);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// A run waiting at a gate, for the inbox.
pub(crate) struct Waiting {
    cp: Checkpoint,
    gate: String,
    since: steadfast::Timestamp,
}

/// The runs waiting at a gate, oldest first, how many there are, and the
/// ones that could not be read.
async fn inbox(app: &App) -> Result<Inbox, PageError> {
    let mut all: Vec<RunSummary> = Vec::new();
    let mut filter = ListFilter::new().status(RunStatus::Waiting).limit(MAX_PAGE);
    loop {
        let page = filter
            .next_page(&*app.store)
            .await
            .map_err(|e| PageError::store("the waiting runs cannot be listed".into(), &e))?;
        if page.is_empty() {
            break;
        }
        all.extend(page);
    }
    all.sort_by(|a, b| (a.updated_at, &a.run_id).cmp(&(b.updated_at, &b.run_id)));
    let total = all.len();
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    // Runs waiting for a signal are waiting too, but not at a gate: they are
    // passed over (loaded, as a run's summary does not say what it waits
    // at), so that they never hide the gates behind them.
    let mut signals = 0;
    let mut looked = 0;
    for r in all.into_iter() {
        if out.len() + unreadable.len() >= INBOX {
            break;
        }
        looked += 1;
        // One run that cannot be read (sealed without keys, corrupt) is
        // named on the page; the others are still shown.
        let cp = match app.store.load(&r.run_id).await {
            Ok(Some(cp)) => cp,
            Ok(None) => continue,
            Err(e) => {
                unreadable.push((r.run_id.clone(), steadfast::error_chain(&e)));
                continue;
            }
        };
        match &cp.wait {
            Some(steadfast::Wait::Gate { step, since, .. }) => {
                let (gate, since) = (step.clone(), *since);
                out.push(Waiting { cp, gate, since });
            }
            _ => signals += 1,
        }
    }
    out.sort_by(|a, b| (a.since, &a.cp.run_id).cmp(&(b.since, &b.cp.run_id)));
    Ok(Inbox {
        items: out,
        total: total.saturating_sub(signals),
        // Runs not looked at may wait for signals rather than at gates.
        exact: looked == total,
        unreadable,
    })
}

/// What the inbox shows.
pub(crate) struct Inbox {
    pub(crate) items: Vec<Waiting>,
    pub(crate) total: usize,
    /// Whether `total` is the count (else at most it: some waiting runs
    /// were not looked at).
    pub(crate) exact: bool,
    /// Runs that could not be read, with why.
    pub(crate) unreadable: Vec<(String, String)>,
}

async fn inbox_page(State(app): Shared) -> Result<Response, PageError> {
    let inbox = inbox(&app).await?;
    Ok(
        axum::response::Html(pages::inbox(&app.url, &app.csrf, &inbox).into_string())
            .into_response(),
    )
}

/// A POST that changes a run, after [`check_post`]: the run's id from the
/// path and the form. Every handler that changes a run takes one, so none
/// can skip the CSRF and origin checks.
struct RunPost {
    app: Arc<App>,
    id: String,
    form: HashMap<String, String>,
}

impl axum::extract::FromRequest<Arc<App>> for RunPost {
    type Rejection = Response;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, Response> {
        use axum::extract::FromRequestParts;
        let (mut parts, body) = req.into_parts();
        let Path(id) = Path::<String>::from_request_parts(&mut parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        let headers = parts.headers.clone();
        let Form(form) = PostForm::from_request(Request::from_parts(parts, body), app)
            .await
            .map_err(IntoResponse::into_response)?;
        check_post(app, &headers, &form).map_err(IntoResponse::into_response)?;
        Ok(RunPost {
            app: Arc::clone(app),
            id,
            form,
        })
    }
}

/// Checks a POST: its CSRF token, and its origin when the browser names one.
fn check_post(
    app: &App,
    headers: &HeaderMap,
    form: &HashMap<String, String>,
) -> Result<(), PageError> {
    let forbidden = |why: String| PageError::new(StatusCode::FORBIDDEN, "refused", why);
    let given = form.get("csrf").map(String::as_str).unwrap_or("");
    if !same(given, &app.csrf) {
        return Err(forbidden(
            "the form's CSRF token is missing or stale; reload the page and try again".into(),
        ));
    }
    same_origin(headers).map_err(forbidden)
}

/// A request a browser sends names its origin; when it does, it must be
/// this server. Programs that send none (curl, scripts) and browsers that
/// hide it (`null`) are let through: the CSRF token is what every change
/// needs, and this check only refuses an origin that is surely another.
fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    if origin == "null" {
        return Ok(());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ok = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|o| !host.is_empty() && o.eq_ignore_ascii_case(host));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the request comes from another site (origin {origin:?}, this server is {host:?})"
        ))
    }
}

/// Refuses a decision made on a page that showed another wait than the
/// run's now (it was rewound and reached the gate again meanwhile).
async fn same_wait(
    app: &App,
    id: &str,
    gate: &str,
    form: &HashMap<String, String>,
) -> Result<(), PageError> {
    let Some(shown) = field(form, "since") else {
        return Ok(());
    };
    let cp = load(app, id).await?;
    match &cp.wait {
        Some(steadfast::Wait::Gate { step, since, .. }) if step == gate && since.unix_millis().to_string() != shown => {
            Err(PageError::new(
                StatusCode::CONFLICT,
                format!("deciding gate {gate:?} of run {id:?}"),
                format!("the run reached this gate again at {since} after the page was shown; reload it, look again, then decide; nothing was written"),
            ))
        }
        _ => Ok(()),
    }
}

fn field<'a>(form: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    form.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// Who decides: the name the person gave, checked as the engine records
/// names (a bad one is the request's fault: 400).
fn by(form: &HashMap<String, String>) -> Result<String, PageError> {
    let by = field(form, "by").map(String::from).ok_or_else(|| {
        PageError::new(
            StatusCode::BAD_REQUEST,
            "your name is needed",
            "fill in who decides; it is recorded with the decision",
        )
    })?;
    checked_name("your name", by)
}

/// The gate a decision names, checked as a step name.
fn gate(form: &HashMap<String, String>) -> Result<String, PageError> {
    checked_name(
        "the gate",
        field(form, "gate").unwrap_or_default().to_string(),
    )
}

/// `name` if the engine can record it; else 400 saying why.
fn checked_name(what: &str, name: String) -> Result<String, PageError> {
    steadfast::check_step_name(&name).map_err(|reason| {
        PageError::new(
            StatusCode::BAD_REQUEST,
            format!("{what} is not a name that can be recorded"),
            format!("{reason}; nothing was written"),
        )
    })?;
    Ok(name)
}

/// Where to go after a POST: back to the inbox or to the run.
fn back(form: &HashMap<String, String>, id: &str) -> Redirect {
    if form.get("back").map(String::as_str) == Some("inbox") {
        Redirect::to("/inbox")
    } else {
        Redirect::to(&format!("/runs/{}", pages::seg(id)))
    }
}

type PostForm = Form<HashMap<String, String>>;

async fn approve(RunPost { app, id, form: f }: RunPost) -> Result<Redirect, PageError> {
    let gate = gate(&f)?;
    let data = match field(&f, "data") {
        None => None,
        Some(text) => Some(crate::command::parse_json_exact(text).map_err(|e| {
            PageError::new(
                StatusCode::BAD_REQUEST,
                format!("approving gate {gate:?} of run {id:?}"),
                format!("the data is not JSON that can be stored: {e}; nothing was written"),
            )
        })?),
    };
    let by = by(&f)?;
    same_wait(&app, &id, &gate, &f).await?;
    steadfast::approve(&*app.store, &id, &gate, data, &by, &*app.clock)
        .await
        .map_err(|e| PageError::engine(format!("approving gate {gate:?} of run {id:?}"), &e))?;
    Ok(back(&f, &id))
}

async fn reject(RunPost { app, id, form: f }: RunPost) -> Result<Redirect, PageError> {
    let gate = gate(&f)?;
    let reason = field(&f, "reason").map(String::from);
    let by = by(&f)?;
    same_wait(&app, &id, &gate, &f).await?;
    steadfast::reject(&*app.store, &id, &gate, reason, &by, &*app.clock)
        .await
        .map_err(|e| PageError::engine(format!("rejecting gate {gate:?} of run {id:?}"), &e))?;
    Ok(back(&f, &id))
}

async fn cancel(RunPost { app, id, form: f }: RunPost) -> Result<Redirect, PageError> {
    let by = by(&f)?;
    let reason = field(&f, "reason").map(String::from);
    steadfast::ops::cancel(&*app.store, &id, reason, &by, &*app.clock)
        .await
        .map_err(|e| PageError::engine(format!("cancelling run {id:?}"), &e))?;
    Ok(back(&f, &id))
}

async fn retry(RunPost { app, id, form: f }: RunPost) -> Result<Redirect, PageError> {
    let by = by(&f)?;
    steadfast::ops::retry(&*app.store, &id, &by, &*app.clock)
        .await
        .map_err(|e| PageError::engine(format!("retrying run {id:?}"), &e))?;
    Ok(back(&f, &id))
}

async fn rewind(RunPost { app, id, form: f }: RunPost) -> Result<Redirect, PageError> {
    let by = by(&f)?;
    let to = field(&f, "to").unwrap_or_default().to_string();
    steadfast::ops::rewind(&*app.store, &id, &to, &by, &*app.clock)
        .await
        .map_err(|e| PageError::engine(format!("rewinding run {id:?} to {to:?}"), &e))?;
    Ok(back(&f, &id))
}

async fn fork(RunPost { app, id, form: f }: RunPost) -> Result<Redirect, PageError> {
    let by = by(&f)?;
    let at = field(&f, "at").unwrap_or_default().to_string();
    let new_id = field(&f, "new_id").unwrap_or_default().to_string();
    steadfast::ops::fork(&*app.store, &id, &at, &new_id, &by, &*app.clock)
        .await
        .map_err(|e| PageError::engine(format!("forking run {id:?} at {at:?}"), &e))?;
    Ok(Redirect::to(&format!("/runs/{}", pages::seg(&new_id))))
}

async fn api_runs(State(app): Shared, Query(q): Query<RunsQuery>) -> Result<Json<Value>, ApiError> {
    let (rows, _) = list(&app, &q).await?;
    Ok(Json(crate::output::runs_json(&rows)))
}

async fn api_run(State(app): Shared, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let cp = load(&app, &id).await?;
    let hist = history(&app, &id).await?;
    let label = stuck(&app, &cp);
    Ok(Json(crate::output::show_json(
        &cp,
        hist.as_deref(),
        label.as_ref(),
    )))
}

async fn api_history(State(app): Shared, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let cp = load(&app, &id).await?;
    let hist = history(&app, &id).await?.ok_or_else(|| {
        PageError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("the history of run {id:?}"),
            "this store keeps no per-step history",
        )
    })?;
    Ok(Json(crate::output::history_json(&hist, &cp.audit)))
}

/// The plan of run `cp` (with its history, if the store keeps one) with the
/// flow of its workflow given to `serve`, if one was: nothing more is read.
fn plan_of(
    app: &App,
    cp: &steadfast::Checkpoint,
    hist: Option<&[StepRecord]>,
) -> Option<steadfast::ops::plan::ResumePlan> {
    // Of several versions given, the one the run was started under.
    let wf = crate::cmd::run::version_for(&app.flows, cp)?;
    Some(steadfast::ops::plan::plan_of(cp, hist.unwrap_or(&[]), wf))
}

/// What resuming the run with the flow of its workflow would do (`steadfast
/// plan --json`); 404 when `serve` was given no flow of that workflow.
async fn api_plan(State(app): Shared, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let cp = load(&app, &id).await?;
    let hist = history(&app, &id).await?;
    let plan = plan_of(&app, &cp, hist.as_deref()).ok_or_else(|| {
        PageError::new(
            StatusCode::NOT_FOUND,
            format!("the plan of run {id:?}"),
            "serve was given no flow of this run's workflow (--flow FLOW)",
        )
    })?;
    Ok(Json(serde_json::to_value(&plan).unwrap_or_default()))
}

async fn api_inbox(State(app): Shared) -> Result<Json<Value>, ApiError> {
    let inbox = inbox(&app).await?;
    let list: Vec<Value> = inbox
        .items
        .iter()
        .map(|w| {
            serde_json::json!({"run_id": w.cp.run_id, "workflow": w.cp.workflow, "gate": w.gate,
                               "since": w.since, "state": w.cp.state, "version": w.cp.version})
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

async fn login_page() -> Response {
    // Before logging in, nothing about the store is shown.
    axum::response::Html(pages::login("", None).into_string()).into_response()
}

async fn login(State(app): Shared, h: HeaderMap, Form(f): PostForm) -> Response {
    let Some(token) = &app.token else {
        return Redirect::to("/runs").into_response();
    };
    if let Err(why) = same_origin(&h) {
        return (
            StatusCode::FORBIDDEN,
            axum::response::Html(pages::login("", Some(&why)).into_string()),
        )
            .into_response();
    }
    let given = f.get("token").map(|t| t.trim()).unwrap_or("");
    if !same(given, token) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::response::Html(
                pages::login("", Some("that is not the access token")).into_string(),
            ),
        )
            .into_response();
    }
    let cookie = format!(
        "{SESSION_COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
        app.session
    );
    let mut res = Redirect::to("/runs").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use steadfast::store::SaveRequest;
    use steadfast::{async_trait, ListFilter, MemoryStore, RunSummary, StoreError};

    /// A store that keeps no per-step history (it declares no capability).
    struct NoHistory(MemoryStore);

    #[async_trait]
    impl Store for NoHistory {
        async fn load(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
            self.0.load(id).await
        }
        async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
            self.0.save(req).await
        }
        async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
            self.0.list(filter).await
        }
        async fn delete(&self, id: &str) -> Result<bool, StoreError> {
            self.0.delete(id).await
        }
        async fn delete_if(&self, id: &str, version: u64) -> Result<bool, StoreError> {
            self.0.delete_if(id, version).await
        }
    }

    async fn app(store: Arc<dyn Store>) -> Arc<App> {
        let wf = steadfast::Workflow::builder("one")
            .step("only", |_, _| async {
                steadfast::update(json!({"done": true}))
            })
            .build()
            .expect("workflow");
        steadfast::run("r1", &wf, &*store).await.expect("run");
        Arc::new(bare_app(store))
    }

    /// The server's state over `store`, as `serve` makes it, with fixed
    /// tokens.
    pub(super) fn bare_app(store: Arc<dyn Store>) -> App {
        App {
            store,
            clock: Arc::new(steadfast::SystemClock),
            csrf: "c".repeat(32),
            token: None,
            session: "s".repeat(32),
            port: 7878,
            stuck_after: Duration::from_secs(60),
            url: "memory:".into(),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            flows: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_store_without_history_shows_the_run_and_says_so_in_the_api() {
        let app = app(Arc::new(NoHistory(MemoryStore::new()))).await;
        let page = run_page(State(Arc::clone(&app)), Path("r1".into()))
            .await
            .unwrap_or_else(|e| panic!("the run page failed: {} {}", e.title, e.detail));
        assert_eq!(page.status(), StatusCode::OK);
        let err = api_history(State(Arc::clone(&app)), Path("r1".into()))
            .await
            .expect_err("no history to give");
        assert_eq!(err.0.status, StatusCode::NOT_IMPLEMENTED);
        assert!(
            err.0.detail.contains("no per-step history"),
            "{}",
            err.0.detail
        );
    }

    #[tokio::test]
    async fn a_run_gone_between_its_record_and_its_history_is_not_found() {
        let app = app(Arc::new(MemoryStore::new())).await;
        let err = history(&app, "gone").await.expect_err("no such run");
        assert_eq!(err.status, StatusCode::NOT_FOUND);
        assert!(matches!(history(&app, "r1").await, Ok(Some(records)) if records.len() == 1));
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use serde_json::json;
    use steadfast::{update, MemoryStore, Step, Workflow};

    fn flow(version: &str) -> Workflow {
        Workflow::new(
            "review",
            vec![
                Step::new("draft", |_, _| async { update(json!({"d": 1})) }).version(version),
                Step::gate("approve"),
            ],
        )
        .expect("workflow")
    }

    async fn body(r: Response) -> String {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20)
            .await
            .expect("body");
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    /// Given the flow of a run's workflow, the run page and the API show
    /// what a resume with it would do; without one, the API says so.
    #[tokio::test]
    async fn the_run_page_and_the_api_show_the_plan_with_the_flow_given() {
        let store = Arc::new(MemoryStore::new());
        steadfast::run("r1", &flow("1"), &*store)
            .await
            .expect("run");
        let bare = Arc::new(super::tests::bare_app(store.clone()));
        let page = body(
            run_page(State(Arc::clone(&bare)), Path("r1".into()))
                .await
                .unwrap_or_else(|e| panic!("{}", e.detail)),
        )
        .await;
        assert!(!page.contains("Resume plan"), "no flow, no plan");
        let err = api_plan(State(Arc::clone(&bare)), Path("r1".into()))
            .await
            .expect_err("no flow given");
        assert_eq!(err.0.status, StatusCode::NOT_FOUND);

        let mut app = super::tests::bare_app(store.clone());
        app.flows = vec![flow("<b>2</b>")];
        let app = Arc::new(app);
        let page = body(
            run_page(State(Arc::clone(&app)), Path("r1".into()))
                .await
                .unwrap_or_else(|e| panic!("{}", e.detail)),
        )
        .await;
        assert!(page.contains("Resume plan with the flow given"), "{page}");
        assert!(page.contains("plan-changed"), "{page}");
        // The new version is shown escaped, never as markup.
        assert!(page.contains("version: 1 → &lt;b&gt;2&lt;/b&gt;"), "{page}");
        let Json(plan) = api_plan(State(Arc::clone(&app)), Path("r1".into()))
            .await
            .unwrap_or_else(|e| panic!("{}", e.0.detail));
        assert_eq!(plan["clean"], false);
        assert_eq!(plan["steps"][0]["action"], "changed");
    }
}

#[cfg(test)]
mod inbox_tests {
    use super::*;
    use steadfast::{MemoryStore, Step, Workflow};

    /// Runs waiting for signals, however many and however old, never hide
    /// the gates behind them, nor count as waiting at a gate.
    #[tokio::test]
    async fn signal_waits_do_not_hide_gates() {
        let store = Arc::new(MemoryStore::new());
        let waits = Workflow::builder("asker")
            .push(Step::wait_for("answer", "reply"))
            .build()
            .expect("workflow");
        let gates = Workflow::builder("reviewed")
            .push(Step::gate("review"))
            .build()
            .expect("workflow");
        for i in 0..(INBOX + 10) {
            steadfast::run(&format!("a{i:03}"), &waits, &*store)
                .await
                .expect("run");
        }
        for i in 0..2 {
            steadfast::run(&format!("z{i}"), &gates, &*store)
                .await
                .expect("run");
        }
        let app = super::tests::bare_app(store);
        let inbox = inbox(&app)
            .await
            .unwrap_or_else(|e| panic!("{} {}", e.title, e.detail));
        let shown: Vec<&str> = inbox.items.iter().map(|w| w.cp.run_id.as_str()).collect();
        assert_eq!(shown, ["z0", "z1"]);
        assert_eq!((inbox.total, inbox.exact), (2, true));
    }
}
