//! What the CLI tests share: a store and a working directory per test, and
//! the built binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

pub const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Self {
        Env {
            dir: tempfile::tempdir().expect("a temp dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn store(&self) -> String {
        format!("sqlite:{}", self.path().join("runs.db").display())
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.current_dir(self.path())
            .arg("--store")
            .arg(self.store())
            .args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run steadfast")
    }

    pub fn flow(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).expect("write flow");
        p
    }

    pub fn show(&self, id: &str) -> Value {
        let out = self.run(&["show", id, "--json"]);
        assert_eq!(out.status.code(), Some(0), "show failed: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("show --json prints JSON")
    }

    pub fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path().join("log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

pub fn pid_alive(pid: &str) -> bool {
    Path::new(&format!("/proc/{}", pid.trim())).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .unwrap_or_default()
            .contains(") Z ")
}
