//! The fuzz targets: each takes arbitrary bytes, feeds them to one parser or
//! decoder the way real input reaches it, and panics only when a promise is
//! broken (a panic inside the code under test, an accepted value that does
//! not read back, an error that does not say where). The coverage-guided
//! fuzzers in `fuzz/` call these; `tests/fuzz_corpus.rs` replays the
//! checked-in corpus through them on every test run.
//!
//! Not part of the supported API.

use std::path::Path;

use clap::Parser;
use serde_json::Value;
use steadfast::store::{check_head, check_state, decode_head, encode_head};
use steadfast::{Checkpoint, MemoryStore, Step, Store, SystemClock, Workflow};

use crate::args::Cli;
use crate::command::parse_json_exact;
use crate::flow;
use steadfast::StoreExt as _;

/// A fuzz target: takes any bytes, panics only on a broken promise.
pub type Target = fn(&[u8]);

/// The targets by name, as the fuzz binaries and the corpus folders call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("file_image", file_image),
    ("sqlite_record", sqlite_record),
    ("flow_file", flow_file),
    ("step_stdout", step_stdout),
    ("json_arg", json_arg),
    ("duration", duration),
    ("run_id", run_id),
    ("gate_name", gate_name),
    ("export_line", export_line),
];

/// Splits `data` into at most `n` fields at 0xFF bytes (which never occur in
/// UTF-8), each read as lossy UTF-8.
fn fields(data: &[u8], n: usize) -> Vec<String> {
    let mut out: Vec<String> = data
        .splitn(n, |b| *b == 0xFF)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    out.resize(n, String::new());
    out
}

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// Asserts that an accepted checkpoint survives the head codec and that its
/// state passes the checks every store makes before a write.
fn reads_back(cp: &Checkpoint) {
    let Ok(head) = encode_head(cp) else { return };
    let mut again = Checkpoint::new(&cp.run_id, cp.workflow.clone(), cp.created_at);
    decode_head(&head, &mut again).expect("an encoded head decodes");
    assert_eq!(
        encode_head(&again).ok().as_deref(),
        Some(head.as_str()),
        "a head does not survive encode and decode"
    );
}

/// The file store's decoder on a whole file's bytes.
pub fn file_image(data: &[u8]) {
    match steadfast::file::decode_file_for_fuzzing(data) {
        Ok(runs) => runs.iter().for_each(reads_back),
        Err(e) => assert!(
            e.to_string().contains("fuzz.json"),
            "a decode error does not name the file: {e}"
        ),
    }
}

/// The SQLite store's decoding of one run's row and history rows.
pub fn sqlite_record(data: &[u8]) {
    let f = fields(data, 9);
    let int = |s: &str| s.trim().parse::<i64>().unwrap_or(s.len() as i64 - 1);
    let ints = [int(&f[5]), int(&f[6]), int(&f[7]), int(&f[8]), 0];
    let mut deltas = Vec::new();
    for (i, line) in f[4].lines().enumerate() {
        let (name, update) = line.split_once('\t').unwrap_or((line, "{}"));
        deltas.push((i as i64, name.to_string(), update.to_string()));
    }
    let text = [
        "w".to_string(),
        f[0].clone(),
        f[1].clone(),
        f[2].clone(),
        f[3].clone(),
    ];
    let snapshot_next = serde_json::from_str::<Vec<String>>(&text[4]).map_or(0, |v| v.len());
    let mut ints = ints;
    ints[4] = snapshot_next as i64;
    let deltas: Vec<_> = deltas
        .into_iter()
        .map(|(i, n, u)| (i + snapshot_next as i64, n, u))
        .collect();
    match steadfast::sqlite::decode_record_for_fuzzing("r", text, ints, deltas) {
        Ok(cp) => {
            check_head(&cp).expect("a decoded record passes the save checks");
            reads_back(&cp);
        }
        Err(e) => assert!(
            e.to_string().contains("fuzz.db"),
            "a decode error does not name the store: {e}"
        ),
    }
}

/// The flow-file parser.
pub fn flow_file(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Err(e) = flow::parse(text, Path::new("fuzz.toml")) {
        assert!(
            e.0.starts_with("fuzz.toml"),
            "error without a location: {}",
            e.0
        );
    }
}

/// A step's stdout: read as it comes, in two pieces cut where the input's
/// first byte says, it must give what a parse of the whole output gives; what
/// is accepted as an update must be storable and read back as the same values.
pub fn step_stdout(data: &[u8]) {
    // The last byte says where: the first is nearly always `{`.
    let cut = data.last().map_or(0, |b| *b as usize % (data.len() + 1));
    let mut reader = crate::update_reader::UpdateReader::new();
    reader.feed(&data[..cut]);
    reader.feed(&data[cut..]);
    let read = reader.finish();
    let whole = crate::command::parse_whole(data);
    assert_eq!(
        read.as_ref().ok(),
        whole.as_ref().ok(),
        "read in pieces: {read:?}, whole: {whole:?}"
    );
    let Ok(update) = read else {
        return;
    };
    if check_state("r", "update", &update).is_ok() {
        let text = serde_json::to_string(&update).expect("an accepted update serializes");
        let back: steadfast::Update = serde_json::from_str(&text).expect("and parses back");
        assert_eq!(back, update, "an update does not read back");
    }
}

/// `--data` and `--input` JSON: parsed exactly, then approved into a waiting
/// run or given as a run's input; what is accepted must load back unchanged.
pub fn json_arg(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(value) = parse_json_exact(text) else {
        return;
    };
    block_on(async {
        let store = MemoryStore::new();
        let wf = gate_flow("review");
        wait_at_gate(&store, &wf).await;
        if steadfast::approve(
            &store,
            "r",
            "review",
            Some(value.clone()),
            "fuzz",
            &SystemClock,
        )
        .await
        .is_ok()
        {
            let cp = store.load("r").await.unwrap().expect("the run is there");
            let stored = &cp.decisions.last().expect("the decision is there").data;
            let expected = Some(&value).filter(|v| !v.is_null());
            assert_eq!(stored.as_ref(), expected, "decision data changed");
            reads_back(&cp);
        }
        for durable in [false, true] {
            let id = if durable { "d" } else { "i" };
            if let Ok(true) = steadfast::start(&store, "w", id, value.clone(), durable).await {
                let cp = store
                    .load(id)
                    .await
                    .unwrap()
                    .expect("the started run is there");
                reads_back(&cp);
            }
        }
    });
}

/// Durations on the command line (`--lease`, `--poll`, `--grace`).
pub fn duration(data: &[u8]) {
    let Some(text) = text(data) else { return };
    for flag in ["--lease", "--poll", "--grace"] {
        let args = ["steadfast", "worker", "f.toml", flag, text];
        let _ = Cli::try_parse_from(args);
    }
    let args = ["steadfast", "run", "f.toml", "--lease", text];
    let _ = Cli::try_parse_from(args);
}

/// Run ids: refused with an error, or kept apart from every other id by the
/// encodings that put them in keys and item ids.
pub fn run_id(data: &[u8]) {
    let f = fields(data, 2);
    let (a, b) = (&f[0], &f[1]);
    let ok_a = steadfast::validate_run_id(a).is_ok();
    let ok_b = steadfast::validate_run_id(b).is_ok();
    if ok_a && ok_b && a != b {
        assert_ne!(
            steadfast::cosmos::encode_run_id(a),
            steadfast::cosmos::encode_run_id(b),
            "two run ids share a Cosmos id"
        );
        assert_ne!(
            steadfast::idempotency_key(a, "s"),
            steadfast::idempotency_key(b, "s"),
            "two run ids share an idempotency key"
        );
    }
    if ok_a {
        let args = ["steadfast", "start", "f.toml", "--run-id", a.as_str()];
        let _ = Cli::try_parse_from(args);
        block_on(async {
            let store = MemoryStore::new();
            steadfast::start(&store, "w", a, Value::Null, false)
                .await
                .expect("a valid run id starts");
            let cp = store.load(a).await.unwrap().expect("the run is there");
            assert_eq!(&cp.run_id, a);
        });
    }
}

/// Gate names in a workflow and in `approve`/`reject`.
pub fn gate_name(data: &[u8]) {
    let f = fields(data, 3);
    let (name, asked, by) = (&f[0], &f[1], &f[2]);
    let Ok(wf) = Workflow::builder("w")
        .push(Step::gate(name.clone()))
        .build()
    else {
        return;
    };
    block_on(async {
        let store = MemoryStore::new();
        wait_at_gate(&store, &wf).await;
        let decided =
            steadfast::reject(&store, "r", asked, Some("no".into()), by, &SystemClock).await;
        if decided.is_ok() {
            assert_eq!(asked, name, "a decision was recorded for another gate");
            let cp = store.load("r").await.unwrap().expect("the run is there");
            reads_back(&cp);
        }
    });
}

/// A line of an export (`steadfast import`): one that decodes is written
/// into a store and loads back equal, history included, or is refused by
/// the store with an error; one that does not decode names its line. Input
/// that starts with `{"format"` is a whole line; any other is a record,
/// wrapped in a line with its checksum right, so that the checks behind the
/// checksum are reached.
pub fn export_line(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let line = if text.starts_with("{\"format\"") {
        text.to_string()
    } else {
        let Ok(record) = serde_json::from_str::<Value>(text) else {
            return;
        };
        steadfast::transfer::line_for_fuzzing(record)
    };
    let rec = match steadfast::transfer::decode_line(&line, 7) {
        Ok(rec) => rec,
        Err(e) => {
            assert!(
                e.to_string().contains("line 7"),
                "an error that does not say where: {e}"
            );
            return;
        }
    };
    block_on(async {
        let store = MemoryStore::new();
        if steadfast::transfer::put_run(&store, &rec).await.is_err() {
            return;
        }
        let loaded = store.load(&rec.run.run_id).await.unwrap();
        assert_eq!(
            loaded.as_ref(),
            Some(&rec.run),
            "an imported run does not load back"
        );
        reads_back(&rec.run);
        let history = store
            .history(&rec.run.run_id)
            .await
            .unwrap()
            .unwrap_or_default();
        assert_eq!(
            history,
            rec.history.clone().unwrap_or_default(),
            "an imported history does not load back"
        );
        // Importing it again keeps it.
        let again = steadfast::transfer::put_run(&store, &rec).await.unwrap();
        assert!(
            matches!(again, steadfast::transfer::Put::Kept { .. }),
            "{again:?}"
        );
    });
}

fn gate_flow(gate: &str) -> Workflow {
    Workflow::builder("w")
        .push(Step::gate(gate))
        .build()
        .expect("a plain gate flow")
}

async fn wait_at_gate(store: &MemoryStore, wf: &Workflow) {
    let outcome = steadfast::run("r", wf, store).await.expect("the run waits");
    assert!(matches!(outcome, steadfast::Outcome::Waiting { .. }));
}

fn block_on<F: std::future::Future<Output = ()>>(f: F) {
    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
    }
    RT.with(|rt| rt.block_on(f));
}
