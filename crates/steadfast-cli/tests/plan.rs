//! `steadfast plan ID --flow FLOW`: a run waits at its gate while its flow
//! changes (a command edited, a step renamed, a step inserted before and
//! after the gate); the plan reports each precisely with its exit code, and
//! the resume then does what the plan said.

mod support;

use serde_json::Value;
use support::{code, stderr, Env, TestResult};

const V1: &str = r#"name = "review"
version = "1"
[[step]]
name = "fetch"
run = "echo '{\"doc\": 1}' && echo fetch >> log"
[[step]]
name = "summarize"
run = "echo '{\"sum\": 1}' && echo summarize >> log"
timeout = "30s"
[[step]]
name = "approve"
gate = true
[[step]]
name = "publish"
run = "echo publish >> log"
"#;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_plan_reports_each_change_to_a_waiting_run_and_the_resume_agrees() -> TestResult {
    let env = Env::new();
    let v1 = env.flow("v1.toml", V1);
    let out = env.run(&["run", v1.to_str().unwrap(), "--run-id", "r1"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));

    // The same flow: clean, exit 0.
    let out = env.run(&["plan", "r1", "--flow", v1.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("clean"), "{}", stdout(&out));

    // A command and a timeout edited: changed, with both fields, exit 7.
    let edited = env.flow(
        "v2.toml",
        &V1.replace("\\\"sum\\\": 1", "\\\"sum\\\": 2")
            .replace("\"30s\"", "\"60s\""),
    );
    let out = env.run(&["plan", "r1", "--flow", edited.to_str().unwrap(), "--json"]);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    let plan: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(plan["steps"][1]["action"], "changed", "{plan}");
    let fields: Vec<&str> = plan["steps"][1]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["command", "timeout"], "{plan}");
    assert_eq!(plan["steps"][1]["changes"][1]["was"], "30s");
    assert_eq!(plan["steps"][1]["changes"][1]["now"], "60s");
    assert!(plan.get("stops_at").is_none(), "{plan}");
    let out = env.run(&["plan", "r1", "--flow", edited.to_str().unwrap()]);
    assert!(
        stdout(&out).contains("timeout 30s -> 60s"),
        "{}",
        stdout(&out)
    );

    // A step renamed: renamed, the resume stops there, accepting relabels.
    let renamed = env.flow(
        "renamed.toml",
        &V1.replace("name = \"summarize\"", "name = \"digest\""),
    );
    let out = env.run(&["plan", "r1", "--flow", renamed.to_str().unwrap(), "--json"]);
    assert_eq!(code(&out), 7);
    let plan: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(plan["steps"][1]["action"], "renamed", "{plan}");
    assert_eq!(plan["steps"][1]["recorded_name"], "summarize");
    assert_eq!(plan["stops_at"]["at"], 1);
    assert_eq!(plan["accept"]["relabelled"][0][1], "digest");
    let out = env.run(&["run", renamed.to_str().unwrap(), "--run-id", "r1"]);
    assert_eq!(
        code(&out),
        2,
        "the resume the plan said stops: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("summarize"), "{}", stderr(&out));

    // A step inserted after the gate: runs later; not the steps the run
    // started with, so exit 7, but nothing stops the resume.
    let after = env.flow(
        "after.toml",
        &V1.replace(
            "[[step]]\nname = \"publish\"",
            "[[step]]\nname = \"notify\"\nrun = \"echo notify >> log\"\n[[step]]\nname = \"publish\"",
        ),
    );
    let out = env.run(&["plan", "r1", "--flow", after.to_str().unwrap(), "--json"]);
    assert_eq!(code(&out), 7);
    let plan: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(plan["steps"][3]["name"], "notify");
    assert_eq!(plan["steps"][3]["action"], "run");
    assert!(plan.get("stops_at").is_none(), "{plan}");
    assert!(
        plan["notes"][0]
            .as_str()
            .unwrap()
            .contains("started with 4 step(s)"),
        "{plan}"
    );

    // A step inserted before the gate: it runs next, then the gate waits
    // again; the plan and the resume agree.
    let before = env.flow(
        "before.toml",
        &V1.replace(
            "[[step]]\nname = \"approve\"",
            "[[step]]\nname = \"lint\"\nrun = \"echo lint >> log\"\n[[step]]\nname = \"approve\"",
        ),
    );
    let out = env.run(&["plan", "r1", "--flow", before.to_str().unwrap()]);
    assert_eq!(code(&out), 7);
    assert!(
        stdout(&out).contains("lint       run (next; the run waited at \"approve\")"),
        "{}",
        stdout(&out)
    );
    let out = env.run(&["run", before.to_str().unwrap(), "--run-id", "r1"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(env.log(), ["fetch", "summarize", "lint"]);

    // Nothing to plan: a run that does not exist, a flow that does not parse.
    let out = env.run(&["plan", "nobody", "--flow", v1.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let broken = env.flow("broken.toml", "name = ");
    let out = env.run(&["plan", "r1", "--flow", broken.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    Ok(())
}

#[test]
fn a_step_records_its_definition_and_the_state_never_shows_it() -> TestResult {
    let env = Env::new();
    let flow = env.flow(
        "f.toml",
        "name = \"f\"\n[[step]]\nname = \"echo\"\nrun = \"cat\"\nenv = { TOKEN = \"secret-token-value\" }\nretries = 1\n",
    );
    // The step prints its state back, `__step` would be in it if the state
    // held it; a `__step` a step prints is dropped.
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["show", "r", "--json"]);
    let shown: Value = serde_json::from_slice(&out.stdout)?;
    assert!(shown["state"].get("__step").is_none(), "{shown}");
    let out = env.run(&["history", "r", "--json"]);
    let text = stdout(&out);
    assert!(
        !text.contains("secret-token-value"),
        "the env value is kept in clear: {text}"
    );
    let history: Value = serde_json::from_str(&text)?;
    let def = &history[0]["update"]["__step"];
    assert_eq!(def["fields"]["retries"], 1, "{history}");
    assert!(
        def["fields"]["env"]["TOKEN"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"),
        "{history}"
    );
    Ok(())
}

#[test]
fn migrate_with_a_rename_moves_a_waiting_run_and_it_resumes_without_the_step() -> TestResult {
    let env = Env::new();
    let v1 = env.flow("v1.toml", V1);
    let out = env.run(&["run", v1.to_str().unwrap(), "--run-id", "r1"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let v2 = env.flow(
        "v2.toml",
        &V1.replace("name = \"summarize\"", "name = \"digest\"").replace(
            "[[step]]\nname = \"publish\"",
            "[[step]]\nname = \"notify\"\nrun = \"echo notify >> log\"\n[[step]]\nname = \"publish\"",
        ),
    );
    let v2 = v2.to_str().unwrap();
    // Without the rename: refused, and the run is as it was.
    let out = env.run(&["migrate", "r1", "--flow", v2]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("\"summarize\""), "{}", stderr(&out));
    for bad in ["summarize", "=digest", "nope=digest", "summarize=nope"] {
        let out = env.run(&["migrate", "r1", "--flow", v2, "--rename", bad]);
        assert_eq!(code(&out), 2, "{bad}: {}", stderr(&out));
    }
    let out = env.run(&[
        "migrate",
        "r1",
        "--flow",
        v2,
        "--rename",
        "summarize=digest",
        "--by",
        "ada",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("clean"), "{}", stdout(&out));
    let out = env.run(&["plan", "r1", "--flow", v2]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let shown = env.show("r1");
    let last = shown["audit"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["action"]["kind"], "migrate", "{shown}");
    assert_eq!(last["by"], "ada");
    let out = env.run(&["approve", "r1", "approve"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["run", v2, "--run-id", "r1"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.log(), ["fetch", "summarize", "notify", "publish"]);
    Ok(())
}

#[test]
fn a_flow_with_a_large_env_table_still_loads_and_fingerprints_it_whole() -> TestResult {
    let env = Env::new();
    let vars: Vec<String> = (0..60)
        .map(|i| format!("VARIABLE_{i:03} = \"{i}\""))
        .collect();
    let flow = env.flow(
        "big.toml",
        &format!(
            "name = \"big\"\n[[step]]\nname = \"s\"\nrun = \"echo {{}}\"\nenv = {{ {} }}\n",
            vars.join(", ")
        ),
    );
    let out = env.run(&["run", flow.to_str().unwrap(), "--run-id", "r"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = env.run(&["history", "r", "--json"]);
    let history: Value = serde_json::from_slice(&out.stdout)?;
    let recorded = &history[0]["update"]["__step"]["fields"]["env"];
    assert!(
        recorded.as_str().unwrap().starts_with("sha256:"),
        "{history}"
    );
    Ok(())
}
