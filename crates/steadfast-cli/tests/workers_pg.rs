//! Worker processes sharing a PostgreSQL store: a worker SIGKILLed with its
//! process group mid-load costs at most one step per run it held, and a
//! worker stopped past its lease is fenced out when it wakes.

mod pg;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pg::{now_ns, Execution, PgEnv};
use steadfast::Store;
use steadfast::StoreExt as _;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const RUNS: usize = 200;
const STEPS: usize = 5;

/// 3 workers take 200 runs of a 5-step flow; one is SIGKILLed with its
/// process group a third of the way in and a fourth starts in its place.
/// Every run completes; a run re-executes a step only if the kill hit it
/// (at most once: there was one kill); and no two workers ever ran steps of
/// one run at overlapping times.
#[test]
fn killed_worker_costs_at_most_one_step_per_run_and_never_overlaps() -> TestResult {
    let env = PgEnv::new();
    let flow = env.flow("five", STEPS, &[]);
    env.start_runs(&flow, RUNS);
    let args = [
        "--concurrency",
        "8",
        "--lease",
        "2s",
        "--poll",
        "200ms",
        "--grace",
        "5s",
    ];
    let mut workers: Vec<_> = ["w1", "w2", "w3"]
        .iter()
        .map(|t| env.worker(t, &flow, &args))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while env.count("end") < RUNS * STEPS / 3 {
        assert!(
            Instant::now() < deadline,
            "the workers made no progress: {}",
            env.stderr_of("w1")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started_before_kill = env.count("start");
    workers[0].kill_group();
    let killed_at = now_ns();
    workers.push(env.worker("w4", &flow, &args));
    env.wait_all_completed(RUNS, Duration::from_secs(240));
    for w in workers.iter_mut().skip(1) {
        assert_eq!(
            w.stop(),
            Some(0),
            "worker {} exits 0 on SIGTERM: {}",
            w.tag,
            env.stderr_of(&w.tag)
        );
    }

    let mut by_run: BTreeMap<String, Vec<Execution>> = BTreeMap::new();
    for mut e in env.executions() {
        if e.end.is_none() {
            assert_eq!(
                e.tag, "w1",
                "only the killed worker leaves steps unfinished: {e:?}"
            );
            e.end = Some(killed_at);
        }
        by_run.entry(e.run.clone()).or_default().push(e);
    }
    assert_eq!(by_run.len(), RUNS);
    let mut re_executed = 0;
    for (run, execs) in &by_run {
        let extra = execs.len() - STEPS;
        let hit = execs.iter().any(|e| e.tag == "w1");
        assert!(
            extra <= usize::from(hit),
            "run {run} ran {extra} steps again (hit by the kill: {hit}): {execs:?}"
        );
        re_executed += extra;
        for a in execs {
            for b in execs {
                if a.tag != b.tag {
                    let (a_end, b_end) = (a.end.unwrap_or(u128::MAX), b.end.unwrap_or(u128::MAX));
                    assert!(
                        a_end <= b.start || b_end <= a.start,
                        "run {run}: {a:?} and {b:?} overlap"
                    );
                }
            }
        }
        let history = env
            .rt
            .block_on(env.store.history(run))?
            .expect("the run exists");
        assert_eq!(history.len(), STEPS, "run {run}");
    }
    eprintln!(
        "{RUNS} runs x {STEPS} steps: {started_before_kill} steps started before the kill, {re_executed} executed again after it"
    );
    Ok(())
}

/// A worker SIGSTOPped past its lease, while another takes the run over, is
/// fenced when SIGCONT wakes it: its writes are refused, the record holds
/// only the new owner's, and it drops the run.
#[test]
fn a_worker_stopped_past_its_lease_is_fenced_when_it_wakes() -> TestResult {
    let env = PgEnv::new();
    let flow = env.flow("slow", 3, &[("s1", "5")]);
    env.start_runs(&flow, 1);
    let args = ["--lease", "1s", "--poll", "100ms", "--grace", "2s"];
    let mut a = env.worker("A", &flow, &args);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env
        .executions()
        .iter()
        .any(|e| e.step == "s1" && e.tag == "A")
    {
        assert!(
            Instant::now() < deadline,
            "A never reached s1: {}",
            env.stderr_of("A")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    a.signal(Signal::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1500));
    let mut b = env.worker("B", &flow, &["--lease", "1s", "--poll", "100ms"]);
    // B needs a shorter s1 to finish first; it takes the run and runs s1
    // (5 s) and s2.
    env.wait_all_completed(1, Duration::from_secs(60));
    let done = env.rt.block_on(env.store.load("r000"))?.expect("the run");
    a.signal(Signal::SIGCONT);
    // A wakes: its renewal or save is refused, and it drops the run.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !env
        .stderr_of("A")
        .contains("r000  lost: another worker has the run")
    {
        assert!(
            Instant::now() < deadline,
            "A did not drop the run: {}",
            env.stderr_of("A")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(a.stop(), Some(0), "{}", env.stderr_of("A"));
    assert_eq!(b.stop(), Some(0), "{}", env.stderr_of("B"));
    let after = env.rt.block_on(env.store.load("r000"))?.expect("the run");
    assert_eq!(after, done, "nothing A did after waking reached the store");
    assert_eq!(after.state.get("s1"), Some(&serde_json::json!("B")));
    assert_eq!(after.state.get("s2"), Some(&serde_json::json!("B")));
    assert!(after.lease.is_none());
    let a_err = env.stderr_of("A");
    assert!(
        a_err.contains("1 held by others"),
        "A reports the run it lost: {a_err}"
    );
    eprintln!("the fenced worker said:\n{a_err}");
    // A's s1 was killed by B's takeover, not left running beside B's.
    let s1: Vec<Execution> = env
        .executions()
        .into_iter()
        .filter(|e| e.step == "s1")
        .collect();
    assert_eq!(s1.len(), 2, "{s1:?}");
    assert!(
        s1.iter().any(|e| e.tag == "A" && e.end.is_none()),
        "A's s1 never finished: {s1:?}"
    );
    Ok(())
}

/// SIGTERM stops a worker gracefully: it takes nothing more, gives a running
/// step the grace period, then kills the step's process group and releases
/// the lease, so that another worker can take the run at once.
#[test]
fn sigterm_lets_steps_finish_within_the_grace_then_releases_the_lease() -> TestResult {
    let env = PgEnv::new();
    let flow = env.flow("long", 2, &[("s0", "30")]);
    env.start_runs(&flow, 1);
    let mut w = env.worker(
        "A",
        &flow,
        &["--lease", "30s", "--poll", "100ms", "--grace", "1s"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env.executions().iter().any(|e| e.step == "s0") {
        assert!(
            Instant::now() < deadline,
            "the step never started: {}",
            env.stderr_of("A")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked = Instant::now();
    assert_eq!(w.stop(), Some(0), "{}", env.stderr_of("A"));
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the grace period is 1 s, the worker took {took:?}"
    );
    let err = env.stderr_of("A");
    assert!(err.contains("1 stopped mid-run"), "{err}");
    let cp = env.rt.block_on(env.store.load("r000"))?.expect("the run");
    assert!(cp.lease.is_none(), "the lease was released: {:?}", cp.lease);
    assert_eq!(cp.next, 0);
    // The step's processes (`sh step.sh 30` and its `sleep`, working in the
    // flow's directory) died with the worker's stop.
    std::thread::sleep(Duration::from_millis(300));
    let left: Vec<String> = std::fs::read_dir("/proc")?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter(|e| std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd == env.path()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.is_empty(),
        "step processes outlived the worker: {left:?}"
    );
    assert!(
        env.executions().iter().all(|e| e.end.is_none()),
        "the step was not killed"
    );
    Ok(())
}
