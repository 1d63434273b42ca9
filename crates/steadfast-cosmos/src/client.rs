//! A small client of the Cosmos DB REST API (reqwest and rustls): signed
//! requests, point operations, transactional batches within one partition,
//! and queries paged by continuation token. Within a retry budget, 429s are
//! retried after the delay the service asks for, requests that never left
//! are sent again, and reads (which change nothing) are sent again after a
//! timeout, an unavailable service or a lost answer; a write whose answer
//! was lost is left to the caller, which finds out what happened.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use steadfast_core::{StoreError, StoreErrorKind};

use crate::auth::{header_value, MasterKey};

/// The REST API version spoken.
const API_VERSION: &str = "2018-12-31";

/// How long a request is retried in all by default (throttled, never sent,
/// or a read that failed on the way).
pub(crate) const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(30);

/// The longest retry budget a store takes.
pub(crate) const MAX_RETRY_BUDGET: Duration = Duration::from_secs(600);

/// The longest wait between two tries, whatever the service advertises.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// An answer: status, headers, body.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// How many times the request was sent, and how long that took.
    pub tries: u32,
    pub spent: Duration,
    /// The retry budget it was sent within.
    pub budget: Duration,
}

impl Answer {
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("the answer is not JSON: {e}"))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// What went wrong with a request before an answer came.
pub(crate) enum Failure {
    /// Never sent (no connection): nothing happened.
    NotSent(String),
    /// Sent, but the answer was lost: it may have taken effect.
    Lost(String),
}

/// One database and container of an account.
pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    pub db: String,
    pub coll: String,
    key: Arc<MasterKey>,
    /// How long a request is retried in all.
    budget: Duration,
    /// Request units the service charged, in thousandths, and requests sent.
    pub charged_milli_ru: std::sync::atomic::AtomicU64,
    pub requests: std::sync::atomic::AtomicU64,
    /// The last session token the service gave for each partition this
    /// client wrote to: sent back on the requests that follow, so that a
    /// read sees this client's writes at session consistency.
    sessions: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Client {
    pub fn new(
        base: String,
        db: String,
        coll: String,
        key: MasterKey,
        tls: rustls::ClientConfig,
        budget: Duration,
    ) -> Result<Self, StoreError> {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .http1_only()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| StoreError::Unsupported(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            db,
            coll,
            key: Arc::new(key),
            budget,
            charged_milli_ru: Default::default(),
            requests: Default::default(),
            sessions: Default::default(),
        })
    }

    /// The link of the container (`dbs/DB/colls/COLL`).
    pub fn coll_link(&self) -> String {
        format!("dbs/{}/colls/{}", self.db, self.coll)
    }

    /// Sends a signed request. Within the retry budget, sends it again
    /// after a 429 (waiting the delay the service asks for), after a
    /// connection that could not be made (the request never left), and, for
    /// a read (`GET` or a query), after a 408, a 503 or a lost answer
    /// (waiting 50 ms, doubling to a second). A write whose answer was lost
    /// or left open is never sent again here: the caller reads what landed.
    pub async fn send(
        &self,
        method: Method,
        resource_type: &str,
        resource_link: &str,
        path: &str,
        headers: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<Answer, Failure> {
        let started = Instant::now();
        let read = method == Method::GET
            || headers
                .iter()
                .any(|(k, v)| *k == "x-ms-documentdb-isquery" && v == "True");
        let mut tries = 0u32;
        let mut backoff = Duration::from_millis(50);
        loop {
            tries += 1;
            // The wait before the next try, if the budget allows one.
            let again = |wait: Duration| {
                let wait = wait.min(MAX_RETRY_WAIT);
                (started.elapsed() + wait < self.budget).then_some(wait)
            };
            let date = httpdate::fmt_http_date(SystemTime::now());
            let auth = header_value(&self.key.sign(
                method.as_str(),
                resource_type,
                resource_link,
                &date,
            ));
            let mut h = HeaderMap::new();
            let mut put = |k: &str, v: &str| {
                if let (Ok(k), Ok(v)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(v),
                ) {
                    h.insert(k, v);
                }
            };
            put("authorization", &auth);
            put("x-ms-date", &date);
            put("x-ms-version", API_VERSION);
            put("accept", "application/json");
            for (k, v) in headers {
                put(k, v);
            }
            let partition = headers
                .iter()
                .find(|(k, _)| *k == "x-ms-documentdb-partitionkey")
                .map(|(_, v)| v.clone());
            if let Some(token) = partition.as_ref().and_then(|p| self.session(p)) {
                put("x-ms-session-token", &token);
            }
            let mut req = self
                .http
                .request(method.clone(), format!("{}/{path}", self.base))
                .headers(h);
            if let Some(b) = &body {
                req = req.body(b.clone());
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    let never_sent = e.is_connect();
                    // A certificate or handshake the client refused is not
                    // a passing trouble: no try would do better.
                    let refused_tls = tls_refused(&e);
                    if (never_sent || read) && !refused_tls {
                        if let Some(wait) = again(backoff) {
                            tracing::debug!(tries, error = %chain(&e), "Cosmos DB request sent again");
                            tokio::time::sleep(wait).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                            continue;
                        }
                    }
                    let why = format!(
                        "{} (after {tries} tries in {:.1?})",
                        chain(&e),
                        started.elapsed()
                    );
                    return Err(match never_sent {
                        true => Failure::NotSent(why),
                        false => Failure::Lost(why),
                    });
                }
            };
            let status = resp.status();
            let headers = resp.headers().clone();
            let charge = headers
                .get("x-ms-request-charge")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            use std::sync::atomic::Ordering::Relaxed;
            self.charged_milli_ru
                .fetch_add((charge * 1000.0).round() as u64, Relaxed);
            self.requests.fetch_add(1, Relaxed);
            if let (Some(p), Some(token)) = (
                &partition,
                headers
                    .get("x-ms-session-token")
                    .and_then(|v| v.to_str().ok()),
            ) {
                self.remember_session(p, token);
            }
            let body = match resp.bytes().await {
                Ok(b) => b.to_vec(),
                Err(e) if read => {
                    if let Some(wait) = again(backoff) {
                        tokio::time::sleep(wait).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                    return Err(Failure::Lost(chain(&e)));
                }
                Err(e) => return Err(Failure::Lost(chain(&e))),
            };
            let wait = match status.as_u16() {
                // At least a millisecond: a service that asks for no wait
                // at all is not sent a stream of requests.
                429 => again(retry_after(&headers).max(Duration::from_millis(1))),
                408 | 503 if read => again(backoff),
                _ => None,
            };
            if let Some(wait) = wait {
                tracing::debug!(
                    tries,
                    status = status.as_u16(),
                    ?wait,
                    "Cosmos DB request sent again"
                );
                tokio::time::sleep(wait).await;
                if status != StatusCode::TOO_MANY_REQUESTS {
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                continue;
            }
            return Ok(Answer {
                status,
                headers,
                body,
                tries,
                spent: started.elapsed(),
                budget: self.budget,
            });
        }
    }
}

impl Client {
    fn session(&self, partition: &str) -> Option<String> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(partition)
            .cloned()
    }

    /// Keeps `token` for `partition` unless the one kept is newer (a slow
    /// answer must not move the session back).
    fn remember_session(&self, partition: &str, token: &str) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = sessions.get(partition) {
            if lsn(kept) >= lsn(token) {
                return;
            }
        }
        if sessions.len() >= 16_384 && !sessions.contains_key(partition) {
            if let Some(evict) = sessions.keys().next().cloned() {
                sessions.remove(&evict);
            }
        }
        sessions.insert(partition.to_string(), token.to_string());
    }
}

/// Whether the TLS layer refused the server (its certificate, the
/// handshake): an error no retry mends.
fn tls_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The wait a 429 asks for (`x-ms-retry-after-ms`, milliseconds, possibly
/// fractional); 100 ms when it names none or none that makes sense.
fn retry_after(headers: &HeaderMap) -> Duration {
    headers
        .get("x-ms-retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map_or(Duration::from_millis(100), |ms| {
            Duration::from_secs_f64((ms / 1000.0).min(MAX_RETRY_WAIT.as_secs_f64()))
        })
}

/// The global log sequence number of a session token
/// (`RANGE:VERSION#GLOBAL_LSN#…`, or `RANGE:GLOBAL_LSN` in the old form);
/// 0 when it cannot be read.
fn lsn(token: &str) -> u64 {
    let body = token.rsplit_once(':').map_or(token, |(_, b)| b);
    let mut parts = body.split('#');
    let first = parts.next().unwrap_or("");
    let global = parts.next().unwrap_or(first);
    global.parse().unwrap_or(0)
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    steadfast_core::error_chain(e)
}

/// The store error for an answer that is not what was hoped for: by status
/// (and substatus), never by message text. `write` says whether the request
/// may have changed something, which makes 408/449/503 unknown outcomes.
pub(crate) fn answer_error(a: &Answer, what: &str, run_id: &str, write: bool) -> StoreError {
    let detail = a
        .json()
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default();
    let tried = match a.tries {
        0 | 1 => String::new(),
        n => format!(" (after {n} tries in {:.1?})", a.spent),
    };
    let msg = format!("{what}: HTTP {} {detail}{tried}", a.status.as_u16());
    match a.status.as_u16() {
        // 403 with substatus 1014: the run's logical partition is full.
        403 if a.header("x-ms-substatus") == Some("1014") => StoreError::backend(
            StoreErrorKind::TooLarge,
            format!("{what}: the run's partition reached the service's size limit (HTTP 403.1014)"),
        ),
        // Still throttled when the next wait the service asked for would
        // pass the retry budget.
        429 => StoreError::backend(
            StoreErrorKind::Unavailable,
            format!(
                "{what}: the service kept throttling the request (HTTP 429): {} {} in {:.1?}, and the next wait it asked for would pass the retry budget of {:?}; give the container more throughput (RU/s), run fewer workers, or raise the budget (?retry_budget= in the store URL)",
                a.tries,
                if a.tries == 1 { "try" } else { "tries" },
                a.spent,
                a.budget
            ),
        ),
        401 | 403 => StoreError::backend(
            StoreErrorKind::Unavailable,
            format!("{what}: the account refused the key (HTTP {}); check $STEADFAST_COSMOS_KEY or the key file", a.status.as_u16()),
        ),
        409 | 412 => StoreError::Conflict {
            run_id: run_id.to_string(),
            expected: None,
            found: None,
        },
        413 => StoreError::backend(StoreErrorKind::TooLarge, msg),
        400 => StoreError::InvalidInput(msg),
        404 => StoreError::NotFound(msg),
        // A write the service answered with a timeout, a retry-with or a
        // server error may have been applied.
        408 | 449 | 500..=599 if write => StoreError::OutcomeUnknown {
            run_id: run_id.to_string(),
            source: msg.into(),
        },
        _ => StoreError::backend(StoreErrorKind::Unavailable, msg),
    }
}

/// The store error for a request that got no answer.
pub(crate) fn failure_error(f: Failure, what: &str, run_id: &str, write: bool) -> StoreError {
    match f {
        Failure::NotSent(e) => StoreError::unavailable(format!("{what}: {e}")),
        Failure::Lost(e) if write => StoreError::OutcomeUnknown {
            run_id: run_id.to_string(),
            source: format!("{what}: {e}").into(),
        },
        Failure::Lost(e) => StoreError::unavailable(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, substatus: Option<&str>) -> Answer {
        let mut headers = HeaderMap::new();
        if let Some(s) = substatus {
            headers.insert("x-ms-substatus", HeaderValue::from_str(s).expect("ascii"));
        }
        Answer {
            status: StatusCode::from_u16(status).expect("a status"),
            headers,
            body: br#"{"message": "words"}"#.to_vec(),
            tries: 1,
            spent: Duration::ZERO,
            budget: DEFAULT_RETRY_BUDGET,
        }
    }

    /// Statuses map to kinds; a wrong key is never "absent", and a write
    /// whose answer leaves its outcome open is an unknown outcome.
    #[test]
    fn statuses_map_to_kinds() {
        let kind =
            |status, sub, write| answer_error(&answer(status, sub), "saving", "r", write).kind();
        let key = answer_error(&answer(401, None), "reading", "r", false);
        assert_eq!(key.kind(), StoreErrorKind::Unavailable);
        assert!(key.to_string().contains("key"), "{key}");
        assert_eq!(kind(403, Some("1014"), true), StoreErrorKind::TooLarge);
        assert_eq!(kind(412, None, true), StoreErrorKind::Conflict);
        assert_eq!(kind(409, None, true), StoreErrorKind::Conflict);
        assert_eq!(kind(413, None, true), StoreErrorKind::TooLarge);
        for status in [408, 449, 500, 503] {
            assert_eq!(
                kind(status, None, true),
                StoreErrorKind::OutcomeUnknown,
                "{status}"
            );
            assert_eq!(
                kind(status, None, false),
                StoreErrorKind::Unavailable,
                "{status}"
            );
        }
        assert_eq!(kind(404, None, false), StoreErrorKind::NotFound);
        let throttled = answer_error(&answer(429, None), "saving", "r", true);
        assert_eq!(throttled.kind(), StoreErrorKind::Unavailable);
        assert!(
            throttled.to_string().contains("retry budget of 30s"),
            "{throttled}"
        );
        let lost = failure_error(Failure::Lost("reset".into()), "saving", "r", true);
        assert_eq!(lost.kind(), StoreErrorKind::OutcomeUnknown);
        let never = failure_error(Failure::NotSent("refused".into()), "saving", "r", true);
        assert_eq!(never.kind(), StoreErrorKind::Unavailable);
    }

    /// The advertised wait is taken as given, fractions included, and
    /// bounded; nonsense falls back to 100 ms.
    #[test]
    fn the_advertised_wait_is_read_and_bounded() {
        let wait = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                "x-ms-retry-after-ms",
                HeaderValue::from_str(v).expect("ascii"),
            );
            retry_after(&h)
        };
        assert_eq!(wait("250"), Duration::from_millis(250));
        assert_eq!(wait("0.5"), Duration::from_micros(500));
        assert_eq!(wait("86400000"), MAX_RETRY_WAIT);
        for junk in ["-3", "NaN", "inf", "soon", ""] {
            assert_eq!(wait(junk), Duration::from_millis(100), "{junk:?}");
        }
        assert_eq!(retry_after(&HeaderMap::new()), Duration::from_millis(100));
    }

    #[test]
    fn session_tokens_never_go_back() {
        assert_eq!(lsn("0:-1#125"), 125);
        assert_eq!(lsn("0:1#130#3=120"), 130);
        assert_eq!(lsn("7"), 7);
        assert_eq!(lsn("junk"), 0);
        let c = Client::new(
            "https://127.0.0.1:1".into(),
            "d".into(),
            "c".into(),
            MasterKey::from_base64("c2VjcmV0").expect("base64"),
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
            DEFAULT_RETRY_BUDGET,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        c.remember_session("[\"a\"]", "0:-1#10");
        c.remember_session("[\"a\"]", "0:-1#9");
        assert_eq!(c.session("[\"a\"]").as_deref(), Some("0:-1#10"));
        c.remember_session("[\"a\"]", "0:-1#11");
        assert_eq!(c.session("[\"a\"]").as_deref(), Some("0:-1#11"));
    }
}
