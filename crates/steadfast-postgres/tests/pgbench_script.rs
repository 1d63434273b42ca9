//! `scripts/pgbench/compare.sh`, the statement-against-statement measure
//! that docs/durability.md quotes: bad numbers are refused before anything
//! is touched, and a schema of its name that is already there (someone
//! else's) is refused and kept, never dropped.

mod support;

use std::path::PathBuf;
use std::process::Command;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pgbench/compare.sh")
}

#[test]
fn bad_durations_and_rounds_are_refused_before_anything_runs() -> TestResult {
    // A URL nothing answers at: the refusal comes first.
    let url = "postgres://nobody@127.0.0.1:1/none";
    for (seconds, rounds) in [
        ("0", "1"),
        ("-1", "1"),
        ("1", "abc"),
        ("99999", "1"),
        ("1", "1e3"),
    ] {
        let out = Command::new("bash")
            .arg(script())
            .args([url, seconds, rounds])
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{seconds} {rounds}: {err}");
        assert!(err.contains("whole numbers from 1 to 9999"), "{err}");
    }
    Ok(())
}

#[test]
fn a_schema_of_its_name_already_there_is_refused_and_kept() -> TestResult {
    let url = support::server_url();
    let _drop = support::DropSchema("steadfast_pgbench".into());
    steadfast_conformance::runtime().block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        client
            .batch_execute(
                "CREATE SCHEMA steadfast_pgbench;
                 CREATE TABLE steadfast_pgbench.mine (x int);
                 INSERT INTO steadfast_pgbench.mine VALUES (42);",
            )
            .await?;
        let out = Command::new("bash")
            .arg(script())
            .args([url.as_str(), "1", "1"])
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("already exists"), "{err}");
        let kept: i32 = client
            .query_one("SELECT x FROM steadfast_pgbench.mine", &[])
            .await?
            .get(0);
        assert_eq!(kept, 42, "the planted schema was touched");
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
