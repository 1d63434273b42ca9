//! The PostgreSQL store beyond the conformance suite: TLS, durability
//! settings, schemas it refuses, group commit, and its clock.

mod support;

use std::sync::Arc;
use steadfast_conformance::runtime as rt;

use steadfast_core::store::SaveRequest;
use steadfast_core::StoreExt as _;
use steadfast_core::{Checkpoint, Store, StoreErrorKind, Timestamp};
use steadfast_postgres::{PgOptions, PgStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The URL of the test server with `params` added (and a fresh schema).
fn url_with(params: &str) -> (String, support::DropSchema) {
    let schema = support::fresh_schema();
    let url = format!("{}&{params}", support::url_with_schema(&schema));
    (url, support::DropSchema(schema))
}

#[test]
fn sslmode_require_encrypts_and_disable_does_not() -> TestResult {
    rt().block_on(async {
        let (url, _g) = url_with("sslmode=require");
        let store = PgStore::connect(&url).await?;
        let s = store.settings().await?;
        assert!(s.tls, "sslmode=require must encrypt: {s:?}");
        assert_eq!(
            (s.synchronous_commit.as_str(), s.fsync.as_str()),
            ("on", "on")
        );
        let (url, _g2) = url_with("sslmode=disable");
        let plain = PgStore::connect(&url).await?;
        assert!(!plain.settings().await?.tls);
        Ok(())
    })
}

/// The local server's certificate is self-signed: `verify-full` must refuse
/// it, not fall back to an unchecked connection.
#[test]
fn verify_full_refuses_a_certificate_it_cannot_check() -> TestResult {
    rt().block_on(async {
        let (url, _g) = url_with("sslmode=verify-full");
        let err = PgStore::connect(&url)
            .await
            .expect_err("a self-signed certificate is refused");
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
        let text = steadfast_chain(&err);
        assert!(text.to_lowercase().contains("certificate"), "{text}");
        Ok(())
    })
}

fn steadfast_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        out.push_str(": ");
        out.push_str(&c.to_string());
        next = c.source();
    }
    out
}

/// A schema with tables that are not Steadfast's is refused and left as it
/// was; a schema from a newer build is refused; `create(false)` never makes
/// a schema.
#[test]
fn foreign_newer_and_missing_schemas_are_refused() -> TestResult {
    rt().block_on(async {
        let schema = support::fresh_schema();
        let _g = support::DropSchema(schema.clone());
        let url = support::url_with_schema(&schema);
        let missing = PgStore::connect_with(&url, PgOptions::default().create(false))
            .await
            .expect_err("no schema");
        assert_eq!(missing.kind(), StoreErrorKind::NotFound, "{missing}");

        let store = PgStore::connect(&url).await?;
        // Someone else's table in another schema, and a newer version here.
        let other = support::fresh_schema();
        let _g2 = support::DropSchema(other.clone());
        let (client, conn) =
            tokio_postgres::connect(&support::server_url(), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {other}; CREATE TABLE {other}.orders (id int)"
            ))
            .await?;
        let foreign = PgStore::connect(&support::url_with_schema(&other))
            .await
            .expect_err("foreign");
        assert!(
            foreign.to_string().contains("not a Steadfast store"),
            "{foreign}"
        );
        let still: i64 = client
            .query_one(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
                &[&other],
            )
            .await?
            .get(0);
        assert_eq!(still, 1, "the foreign schema was left as it was");

        client
            .execute(
                &format!("UPDATE {schema}.meta SET value = 99 WHERE key = 'schema_version'"),
                &[],
            )
            .await?;
        let newer = PgStore::connect(&url).await.expect_err("newer schema");
        assert_eq!(newer.kind(), StoreErrorKind::Unsupported, "{newer}");
        drop(store);
        Ok(())
    })
}

/// Concurrent saves share commits, and a conflicting member of a batch
/// fails alone while the others commit.
#[test]
fn concurrent_saves_share_commits_and_a_conflict_fails_alone() -> TestResult {
    rt().block_on(async {
        let (store, _g) = support::fresh_store(PgOptions::default()).await;
        let store = Arc::new(store);
        let mut tasks = Vec::new();
        for i in 0..32 {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                let mut cp = Checkpoint::new(format!("r{i}"), "wf", Timestamp::from_unix_millis(1));
                let mut expected = None;
                for n in 0..20 {
                    cp.state.insert("n".into(), serde_json::json!(n));
                    let v = store.save(SaveRequest::new(&cp, expected)).await?;
                    expected = Some(v);
                }
                // A stale save of a run that moved on: a conflict, nothing changed.
                let stale = store
                    .save(SaveRequest::new(&cp, Some(3)))
                    .await
                    .expect_err("stale");
                assert_eq!(stale.kind(), StoreErrorKind::Conflict);
                Ok::<_, steadfast_core::StoreError>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        let stats = store.write_stats();
        assert!(
            stats.writes >= 32 * 21 && stats.commits < stats.writes,
            "{stats:?}"
        );
        for i in 0..32 {
            let cp = store.load(&format!("r{i}")).await?.expect("saved");
            assert_eq!(
                (cp.version, cp.state["n"].clone()),
                (20, serde_json::json!(19))
            );
        }
        Ok(())
    })
}

/// Runners on the store read the server's clock.
#[test]
fn the_store_clock_is_the_servers() -> TestResult {
    rt().block_on(async {
        let (store, _g) = support::fresh_store(PgOptions::default()).await;
        let clock = store.clock().expect("the PostgreSQL store has a clock");
        let (client, conn) =
            tokio_postgres::connect(&support::server_url(), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let server: i64 = client
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                &[],
            )
            .await?
            .get(0);
        let ours = clock.now().unix_millis() as i64;
        assert!(
            (ours - server).abs() < 1_000,
            "store clock {ours} vs server {server}"
        );
        Ok(())
    })
}

/// Callers that give up while their batch is in flight (their futures
/// dropped) never leave the committer's connection inside a transaction: a
/// later save that is acknowledged is committed, as another connection sees.
#[test]
fn dropped_callers_never_leave_a_transaction_open() -> TestResult {
    rt().block_on(async {
        let (store, _g) = support::fresh_store(PgOptions::default()).await;
        let store = Arc::new(store);
        let other = PgStore::connect(&support::url_with_schema(store.schema())).await?;
        let mut cp = Checkpoint::new("probe", "wf", Timestamp::from_unix_millis(1));
        let mut version = store.save(SaveRequest::new(&cp, None)).await?;
        for round in 0..60u64 {
            // Several saves at once (so that they share a transaction), each
            // abandoned after a moment.
            let mut abandoned = Vec::new();
            for i in 0..32 {
                let store = Arc::clone(&store);
                abandoned.push(tokio::spawn(async move {
                    let cp = Checkpoint::new(
                        format!("x{round}-{i}"),
                        "wf",
                        Timestamp::from_unix_millis(1),
                    );
                    let wait = std::time::Duration::from_micros(fastrand::u64(0..400));
                    let _ =
                        tokio::time::timeout(wait, store.save(SaveRequest::new(&cp, None))).await;
                }));
            }
            for a in abandoned {
                a.await?;
            }
            cp.state.insert("round".into(), serde_json::json!(round));
            version = store.save(SaveRequest::new(&cp, Some(version))).await?;
            let seen = other.load("probe").await?.expect("the probe run");
            assert_eq!(
                seen.version, version,
                "round {round}: an acknowledged save is not visible to another connection"
            );
        }
        Ok(())
    })
}

/// A wall clock 30 s ahead of this machine's.
#[derive(Debug)]
struct Ahead;

impl steadfast_core::Clock for Ahead {
    fn now(&self) -> Timestamp {
        Timestamp::from(std::time::SystemTime::now() + std::time::Duration::from_secs(30))
    }
}

/// Leases on PostgreSQL are judged by the server's clock: a runner made with
/// `Runner::new` refuses a lease that is live by the server's time, and writes
/// its own lease from the server's time. The same runner told to use a clock
/// 30 s fast (as a skewed machine's would be) takes the live lease over,
/// which is what the server's clock prevents.
#[test]
fn leases_are_judged_by_the_servers_clock() -> TestResult {
    use steadfast_core::{Lease, Owner, Runner, Workflow};
    rt().block_on(async {
        let (store, _g) = support::fresh_store(PgOptions::default()).await;
        let server_now = store.clock().expect("a server clock").now();
        let mut cp = Checkpoint::new("r", "w", server_now);
        cp.lease = Some(Lease::new(
            Owner::new("elsewhere", 7, 7),
            server_now.saturating_add(std::time::Duration::from_secs(20)),
        ));
        store.save(SaveRequest::new(&cp, None)).await?;
        let wf = Workflow::builder("w")
            .step("a", |_, _| async {
                steadfast_core::update(serde_json::json!({"a": 1}))
            })
            .build()?;
        let me = Owner::new("here", 1, 1);
        let ttl = std::time::Duration::from_secs(30);
        let refused = Runner::new(&store)
            .lease(me.clone(), ttl)
            .run("r", &wf)
            .await;
        assert!(
            matches!(refused, Err(steadfast_core::Error::Held { .. })),
            "{refused:?}"
        );
        let skewed = Runner::new(&store)
            .clock(Arc::new(Ahead))
            .lease(me.clone(), ttl)
            .run("r", &wf)
            .await;
        assert!(skewed.is_ok(), "the fast clock takes over: {skewed:?}");

        // A lease a runner writes is the server's time plus its length.
        let wf = Workflow::builder("w")
            .step("look", |_, _| async {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                steadfast_core::update(serde_json::json!({"b": 1}))
            })
            .build()?;
        let store = Arc::new(store);
        let s = Arc::clone(&store);
        let w = wf.clone();
        let running = tokio::spawn(async move {
            Runner::new(&*s)
                .lease(Owner::new("here", 1, 1), ttl)
                .run("s", &w)
                .await
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let until = store
            .load("s")
            .await?
            .and_then(|c| c.lease)
            .expect("leased")
            .until;
        let server = store.clock().unwrap().now();
        let expected = server.saturating_add(ttl).unix_millis() as i64;
        assert!(
            (until.unix_millis() as i64 - expected).abs() < 2_000,
            "lease until {until} vs server time + ttl {expected}"
        );
        running.await??;
        Ok(())
    })
}

/// A least-privilege role: once an administrator has created the schema,
/// a role with only USAGE on it and SELECT, INSERT, UPDATE and DELETE on its
/// tables (no CREATE anywhere) opens the store and runs flows to the end;
/// it cannot create a schema of its own.
#[test]
fn a_role_that_may_only_use_the_tables_runs_flows() -> TestResult {
    use steadfast_core::{run, update, Workflow};
    rt().block_on(async {
        let schema = support::fresh_schema();
        let _g = support::DropSchema(schema.clone());
        drop(PgStore::connect(&support::url_with_schema(&schema)).await?);
        let role = format!("steadfast_lp_{}", std::process::id());
        let (admin, conn) =
            tokio_postgres::connect(&support::server_url(), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        admin
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN;
                 GRANT USAGE ON SCHEMA \"{schema}\" TO {role};
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" TO {role};
                 GRANT USAGE ON ALL SEQUENCES IN SCHEMA \"{schema}\" TO {role};"
            ))
            .await?;
        let as_role = |schema: &str| {
            let base = support::server_url();
            let rest = base.split_once('@').map_or(base.as_str(), |(_, r)| r).to_string();
            let sep = if rest.contains('?') { '&' } else { '?' };
            format!("postgres://{role}@{rest}{sep}schema={schema}")
        };
        let result = async {
            let store = PgStore::connect(&as_role(&schema)).await?;
            let wf = Workflow::builder("w")
                .step("a", |_, _| async { update(serde_json::json!({"a": 1})) })
                .step("b", |_, _| async { update(serde_json::json!({"b": 2})) })
                .build()?;
            let done = run("r", &wf, &store).await?.completed().expect("completed");
            assert_eq!(done["b"], 2);
            store.delete("r").await?;
            // Without CREATE on the database, a schema of its own is refused
            // with the server's reason.
            let other = format!("{schema}_own");
            let err = PgStore::connect(&as_role(&other)).await.unwrap_err();
            assert!(err.to_string().contains("permission denied"), "{err}");
            Ok::<_, Box<dyn std::error::Error>>(())
        }
        .await;
        admin
            .batch_execute(&format!(
                "REVOKE ALL ON ALL TABLES IN SCHEMA \"{schema}\" FROM {role};
                 REVOKE ALL ON ALL SEQUENCES IN SCHEMA \"{schema}\" FROM {role};
                 REVOKE ALL ON SCHEMA \"{schema}\" FROM {role}; DROP ROLE {role};"
            ))
            .await?;
        result
    })
}

/// Many saves at once, half of them given up part way by their callers:
/// every save whose caller waits is answered with its version, never with
/// an unknown outcome because another caller stopped waiting while its
/// save was being committed in the same transaction.
#[test]
fn a_caller_that_stops_waiting_costs_no_other_caller_its_save() -> TestResult {
    rt().block_on(async {
        let (store, _g) = support::fresh_store(PgOptions::default()).await;
        let store = Arc::new(store);
        for round in 0..300 {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..64usize {
                let store = Arc::clone(&store);
                tasks.spawn(async move {
                    let cp = Checkpoint::new(format!("r{round}-{i}"), "wf", Timestamp::EPOCH);
                    let save = store.save(SaveRequest::new(&cp, None));
                    if i % 2 == 0 {
                        let _ = steadfast_conformance::Cut::new(save, 1 + (i / 2) % 3).await;
                        Ok(())
                    } else {
                        save.await
                            .map(drop)
                            .map_err(|e| format!("r{round}-{i}: {e}"))
                    }
                });
            }
            // A save left with no one to commit it would hang: a failure.
            let all = async {
                while let Some(done) = tasks.join_next().await {
                    done??;
                }
                Ok::<(), Box<dyn std::error::Error>>(())
            };
            tokio::time::timeout(std::time::Duration::from_secs(30), all)
                .await
                .map_err(|_| format!("round {round}: saves still unanswered after 30 s"))??;
        }
        Ok(())
    })
}
