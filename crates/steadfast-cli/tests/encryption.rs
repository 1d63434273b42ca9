//! Encryption at rest through the CLI: the key comes from the environment or
//! a private key file, never from the command line; stored bytes hold no
//! secret; the key never shows in output or errors; rotation with `rekey`;
//! plaintext records refused until migrated; a wrong key is an error naming
//! the run.

mod support;

use std::process::Output;

use support::{code, stderr, Env};

const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const K2: &str = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";
const SECRET: &str = "tok-7d1e2f9a";

const FLOW: &str = r#"
name = "secret"
[[step]]
name = "fetch"
run = "echo '{\"token\": \"tok-7d1e2f9a\"}'"
[[step]]
name = "use"
run = "echo '{\"used\": true}'"
"#;

fn with_key(env: &Env, key: Option<&str>, args: &[&str]) -> Output {
    let mut c = env.cmd(args);
    c.env_remove("STEADFAST_ENCRYPTION_KEY")
        .env_remove("STEADFAST_ENCRYPTION_KEY_FILE");
    if let Some(k) = key {
        c.env("STEADFAST_ENCRYPTION_KEY", k);
    }
    c.output().expect("run steadfast")
}

fn all_bytes(env: &Env) -> Vec<u8> {
    let mut bytes = Vec::new();
    for e in std::fs::read_dir(env.path()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file()
            && p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("runs.db")
        {
            bytes.extend(std::fs::read(p).unwrap());
        }
    }
    bytes
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn no_key_in(out: &Output) {
    for text in [
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    ] {
        assert!(
            !text.contains(K1) && !text.contains(K2),
            "a key leaked: {text}"
        );
    }
}

#[test]
fn encrypted_runs_store_no_secret_and_show_it_only_with_the_key() {
    let env = Env::new();
    let flow = env.flow("f.toml", FLOW);
    let k1 = format!("k1:{K1}");
    let out = with_key(
        &env,
        Some(&k1),
        &["run", flow.to_str().unwrap(), "--run-id", "r"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    no_key_in(&out);
    assert!(
        !contains(&all_bytes(&env), SECRET),
        "the secret is stored in clear"
    );

    let show = with_key(&env, Some(&k1), &["show", "r", "--json"]);
    assert_eq!(code(&show), 0, "{}", stderr(&show));
    no_key_in(&show);
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(v["state"]["token"], SECRET);
    let history = with_key(&env, Some(&k1), &["history", "r", "--json"]);
    assert_eq!(code(&history), 0, "{}", stderr(&history));
    assert!(String::from_utf8_lossy(&history.stdout).contains(SECRET));

    // Without a key: ids, workflow and status are readable, the state is not.
    let runs = with_key(&env, None, &["runs"]);
    assert_eq!(code(&runs), 0, "{}", stderr(&runs));
    assert!(String::from_utf8_lossy(&runs.stdout).contains("completed"));
    // Reading, resuming or deciding a sealed run without a key is refused,
    // saying what to set, and changes nothing.
    let before = all_bytes(&env);
    for args in [
        vec!["show", "r", "--json"],
        vec!["history", "r"],
        vec!["run", flow.to_str().unwrap(), "--run-id", "r"],
    ] {
        let out = with_key(&env, None, &args);
        assert_ne!(code(&out), 0, "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(SECRET));
        assert!(
            stderr(&out).contains("STEADFAST_ENCRYPTION_KEY"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(all_bytes(&env), before);

    // A wrong key: an error naming the run, no key in it, nothing changed.
    let before = all_bytes(&env);
    let wrong = with_key(&env, Some(&format!("k1:{K2}")), &["show", "r"]);
    assert_ne!(code(&wrong), 0);
    no_key_in(&wrong);
    let err = stderr(&wrong);
    assert!(
        err.contains("\"r\"") && err.contains("does not open"),
        "{err}"
    );
    let again = with_key(
        &env,
        Some(&format!("k1:{K2}")),
        &["run", flow.to_str().unwrap(), "--run-id", "r"],
    );
    assert_ne!(code(&again), 0);
    assert_eq!(
        all_bytes(&env),
        before,
        "a wrongly keyed run changed the store"
    );
}

#[test]
fn keys_rotate_with_rekey_and_plaintext_is_migrated_only_when_asked() {
    let env = Env::new();
    let flow = env.flow("f.toml", FLOW);
    let f = flow.to_str().unwrap();
    // One run written without encryption, one under k1.
    assert_eq!(
        code(&with_key(&env, None, &["run", f, "--run-id", "plain"])),
        0
    );
    let k1 = format!("k1:{K1}");
    assert_eq!(
        code(&with_key(&env, Some(&k1), &["run", f, "--run-id", "old"])),
        0
    );

    let refused = with_key(&env, Some(&k1), &["show", "plain"]);
    assert_ne!(code(&refused), 0);
    assert!(
        stderr(&refused).contains("not encrypted"),
        "{}",
        stderr(&refused)
    );

    let both = format!("k2:{K2},k1:{K1}");
    let out = with_key(&env, Some(&both), &["rekey"]);
    // Without --migrate-plaintext the plaintext run fails; the other is done.
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("1 runs rewritten under key \"k2\"") && err.contains("1 failed"),
        "{err}"
    );
    assert!(
        err.contains("run \"plain\"") && err.contains("not encrypted"),
        "{err}"
    );
    // Run again, asked to migrate: it goes on where it stopped.
    let out = with_key(&env, Some(&both), &["rekey", "--migrate-plaintext"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    no_key_in(&out);
    let err = stderr(&out);
    assert!(
        err.contains("1 runs rewritten") && err.contains("1 already current"),
        "{err}"
    );
    let out = with_key(&env, Some(&both), &["rekey"]);
    assert!(
        stderr(&out).contains("0 runs rewritten") && stderr(&out).contains("2 already current"),
        "{}",
        stderr(&out)
    );

    // k1 retired: both runs open with k2 alone.
    let k2 = format!("k2:{K2}");
    for id in ["plain", "old"] {
        let show = with_key(&env, Some(&k2), &["show", id, "--json"]);
        assert_eq!(code(&show), 0, "{}", stderr(&show));
        let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
        assert_eq!(v["state"]["token"], SECRET);
    }
    // The step records were rewritten too: no secret is left in clear, and
    // the history opens with the new key alone.
    assert!(
        !contains(&all_bytes(&env), SECRET),
        "a secret is left in clear"
    );
    for id in ["plain", "old"] {
        let history = with_key(&env, Some(&k2), &["history", id, "--json"]);
        assert_eq!(code(&history), 0, "{}", stderr(&history));
        assert!(String::from_utf8_lossy(&history.stdout).contains(SECRET));
    }
}

#[test]
fn a_key_file_must_be_private_and_rekey_needs_a_key() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let flow = env.flow("f.toml", FLOW);
    let key_file = env.path().join("keys");
    std::fs::write(&key_file, format!("k1:{K1}\n")).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = |env: &Env| {
        env.cmd(&["run", flow.to_str().unwrap(), "--run-id", "r"])
            .env_remove("STEADFAST_ENCRYPTION_KEY")
            .env("STEADFAST_ENCRYPTION_KEY_FILE", &key_file)
            .output()
            .unwrap()
    };
    let out = run(&env);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = run(&env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!contains(&all_bytes(&env), SECRET));

    let out = with_key(&env, None, &["rekey"]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("STEADFAST_ENCRYPTION_KEY"),
        "{}",
        stderr(&out)
    );
    let bad = with_key(&env, Some("k1:short"), &["runs"]);
    assert_eq!(code(&bad), 2, "{}", stderr(&bad));
}

#[test]
fn steps_never_see_the_keys() {
    let env = Env::new();
    let flow = env.flow(
        "leak.toml",
        "name = \"leak\"\n[[step]]\nname = \"look\"\nrun = \"printf '{\\\"seen\\\": \\\"%s|%s|%s\\\"}' \\\"$STEADFAST_ENCRYPTION_KEY\\\" \\\"$STEADFAST_ENCRYPTION_KEY_FILE\\\" \\\"$STEADFAST_COSMOS_KEY\\\"\"\n",
    );
    let k1 = format!("k1:{K1}");
    let out = env
        .cmd(&["run", flow.to_str().unwrap(), "--run-id", "r", "--json"])
        .env("STEADFAST_ENCRYPTION_KEY", &k1)
        .env("STEADFAST_COSMOS_KEY", "cosmos-secret")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["seen"], "||", "a step saw a key: {v}");
}

#[test]
fn bad_keys_are_usage_errors_that_touch_nothing() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let flow = env.flow("f.toml", FLOW);
    let f = flow.to_str().unwrap();
    let run_with = |vars: &[(&str, &std::ffi::OsStr)]| {
        let mut c = env.cmd(&["run", f, "--run-id", "r"]);
        c.env_remove("STEADFAST_ENCRYPTION_KEY")
            .env_remove("STEADFAST_ENCRYPTION_KEY_FILE");
        for (k, v) in vars {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let dir = env.path().join("keydir");
    std::fs::create_dir(&dir).unwrap();
    let huge = env.path().join("huge");
    std::fs::write(&huge, format!("k1:{K1}\n# {}\n", "x".repeat(70_000))).unwrap();
    let binary = env.path().join("binary");
    std::fs::write(&binary, b"k1:\xff\xfe\n").unwrap();
    let fifo = env.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for p in [&huge, &binary, &fifo] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let k1 = format!("k1:{K1}");
    let non_utf8 = std::ffi::OsStr::from_bytes(b"k1:\xff");
    let cases: Vec<(&str, Vec<(&str, &std::ffi::OsStr)>)> = vec![
        ("empty key", vec![("STEADFAST_ENCRYPTION_KEY", "".as_ref())]),
        (
            "comment only",
            vec![("STEADFAST_ENCRYPTION_KEY", "# nothing".as_ref())],
        ),
        ("not UTF-8", vec![("STEADFAST_ENCRYPTION_KEY", non_utf8)]),
        (
            "both set",
            vec![
                ("STEADFAST_ENCRYPTION_KEY", k1.as_ref()),
                ("STEADFAST_ENCRYPTION_KEY_FILE", huge.as_os_str()),
            ],
        ),
        (
            "missing file",
            vec![("STEADFAST_ENCRYPTION_KEY_FILE", "nope".as_ref())],
        ),
        (
            "directory",
            vec![("STEADFAST_ENCRYPTION_KEY_FILE", dir.as_os_str())],
        ),
        (
            "fifo",
            vec![("STEADFAST_ENCRYPTION_KEY_FILE", fifo.as_os_str())],
        ),
        (
            "huge file",
            vec![("STEADFAST_ENCRYPTION_KEY_FILE", huge.as_os_str())],
        ),
        (
            "binary file",
            vec![("STEADFAST_ENCRYPTION_KEY_FILE", binary.as_os_str())],
        ),
    ];
    for (what, vars) in cases {
        let out = run_with(&vars);
        assert_eq!(code(&out), 2, "{what}: {}", stderr(&out));
        no_key_in(&out);
        assert!(
            !env.path().join("runs.db").exists(),
            "{what}: a store was created"
        );
    }
}

#[test]
fn export_keeps_encrypted_runs_encrypted_unless_asked_to_decrypt() {
    let env = Env::new();
    let f = env.flow("f.toml", FLOW);
    let f = f.to_str().unwrap();
    let k1 = format!("k1:{K1}");
    assert_eq!(
        code(&with_key(&env, Some(&k1), &["run", f, "--run-id", "r"])),
        0
    );
    // Without a key, as stored: no secret in the export.
    let sealed = with_key(&env, None, &["export"]);
    assert_eq!(code(&sealed), 0, "{}", stderr(&sealed));
    assert!(
        !contains(&sealed.stdout, SECRET),
        "the export holds the secret"
    );
    assert!(
        contains(&sealed.stdout, "sf1:"),
        "the export holds no sealed value"
    );
    // Imported elsewhere, it opens with the same key only.
    let other = Env::new();
    let file = other.path().join("runs.jsonl");
    std::fs::write(&file, &sealed.stdout).unwrap();
    let out = with_key(&other, None, &["import", file.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        !contains(&all_bytes(&other), SECRET),
        "the import decrypted the run"
    );
    let shown = with_key(&other, Some(&k1), &["show", "r", "--json"]);
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    assert!(
        contains(&shown.stdout, SECRET),
        "the imported run does not open with its key"
    );
    let refused = with_key(&other, None, &["show", "r"]);
    assert_ne!(code(&refused), 0, "a sealed run was shown without the key");
    // --decrypt needs the key and writes the values open.
    assert_eq!(code(&with_key(&env, None, &["export", "--decrypt"])), 2);
    let open = with_key(&env, Some(&k1), &["export", "--decrypt"]);
    assert_eq!(code(&open), 0, "{}", stderr(&open));
    assert!(
        contains(&open.stdout, SECRET),
        "--decrypt did not open the values"
    );
    no_key_in(&open);
}
