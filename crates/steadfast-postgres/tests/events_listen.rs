//! A watcher of a run on PostgreSQL is woken by the notification of an
//! append (LISTEN/NOTIFY), not by its poll.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_core::watch::{Watch, WatchItem};
use steadfast_core::{Events, NewEvent, Timestamp};
use steadfast_postgres::{PgOptions, PgStore};

#[tokio::test]
async fn a_watcher_is_woken_by_an_append_from_another_connection() {
    let (store, guard) = support::fresh_store(PgOptions::default()).await;
    // Another handle on the same schema: its appends reach the watcher only
    // through the server.
    let url = support::url_with_schema(&guard.0);
    let writer = PgStore::connect(&url).await.expect("a second handle");
    // A poll far longer than the test may take: only a notification can
    // wake the watcher in time.
    let mut watch = Watch::new(&store, "r")
        .poll_every(Duration::from_secs(60))
        .unwrap();
    let first = NewEvent::new("s", 1, Timestamp::from_unix_millis(1), json!(0));
    writer.append_events("r", &[first]).await.unwrap();
    // The first look reads what is there.
    let got = watch.next().await.unwrap();
    assert!(matches!(got, Some(WatchItem::Started { .. })), "{got:?}");
    let got = watch.next().await.unwrap();
    assert!(matches!(got, Some(WatchItem::Event { .. })), "{got:?}");
    // The next item needs a wake-up: appended after the watcher waits.
    let started = Instant::now();
    let append = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let next = NewEvent::new("s", 1, Timestamp::from_unix_millis(2), json!(1));
        writer.append_events("r", &[next]).await.unwrap();
    });
    let got = tokio::time::timeout(Duration::from_secs(20), watch.next())
        .await
        .expect("the watcher was woken by the append, not its 60 s poll")
        .unwrap();
    match got {
        Some(WatchItem::Event { event }) => assert_eq!(event.value, json!(1)),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    append.await.unwrap();
}
