//! File modes and refusals, tested as an unprivileged user: root reads and
//! writes whatever the modes say, so permission tests run as root pass
//! vacuously. Each test runs `steadfast` as `nobody` (uid 65534) through
//! `setpriv`, in a directory of nobody's, under umask 000.
//!
//! Needs root to switch users; elsewhere each test prints why it did not run,
//! except under CI (which runs as root), where that is a failure.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use support::BIN;

const NOBODY: u32 = 65534;

const FLOW: &str = "name = \"p\"\n[[step]]\nname = \"a\"\nrun = \"echo '{\\\"a\\\": 1}'\"\n[[step]]\nname = \"b\"\nrun = \"echo '{\\\"b\\\": 2}'\"\n";

/// A directory of nobody's, or `None` (with the reason printed) when this
/// process cannot switch users.
fn nobody_dir() -> Option<tempfile::TempDir> {
    if !nix::unistd::geteuid().is_root()
        || Command::new("setpriv").arg("--version").output().is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the permission tests as root, with setpriv"
        );
        eprintln!("skipped: switching to the unprivileged user needs root and setpriv");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    nix::unistd::chown(dir.path(), Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    std::fs::write(dir.path().join("f.toml"), FLOW).unwrap();
    nix::unistd::chown(
        &dir.path().join("f.toml"),
        Some(NOBODY.into()),
        Some(NOBODY.into()),
    )
    .unwrap();
    Some(dir)
}

/// Runs `steadfast ARGS` as nobody, under umask 000, in `dir`.
fn as_nobody(dir: &Path, args: &[&str]) -> Output {
    let mut script = String::from("umask 000; exec \"$0\"");
    for (i, _) in args.iter().enumerate() {
        script.push_str(&format!(" \"${}\"", i + 1));
    }
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["sh", "-c", &script, BIN])
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .output()
        .expect("setpriv")
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o777
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn store_directories_are_0700_and_store_files_0600_whatever_the_umask() {
    let Some(dir) = nobody_dir() else { return };
    for (url, sub) in [
        ("sqlite:.steadfast/runs.db", ".steadfast"),
        ("file:state/runs.json", "state"),
    ] {
        let out = as_nobody(
            dir.path(),
            &["--store", url, "run", "f.toml", "--run-id", "r"],
        );
        assert_eq!(out.status.code(), Some(0), "{url}: {}", stderr(&out));
        let store_dir = dir.path().join(sub);
        assert_eq!(mode(&store_dir), 0o700, "{url}: the store's directory");
        let mut files = 0;
        for e in std::fs::read_dir(&store_dir).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!(meta.uid(), NOBODY, "{}", p.display());
            assert_eq!(
                meta.mode() & 0o777,
                0o600,
                "{}: mode {:o}",
                p.display(),
                meta.mode() & 0o777
            );
            files += 1;
        }
        // The database and its sidecars (WAL, shared memory, write queue),
        // or the file and its lock.
        assert!(files >= 2, "{url}: only {files} files");
    }
}

#[test]
fn a_store_that_other_users_can_write_is_refused() {
    let Some(dir) = nobody_dir() else { return };
    // A directory anyone can write: another user could swap the files.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    nix::unistd::chown(&open, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for url in ["sqlite:open/runs.db", "file:open/runs.json"] {
        let out = as_nobody(
            dir.path(),
            &["--store", url, "run", "f.toml", "--run-id", "r"],
        );
        assert_ne!(out.status.code(), Some(0), "{url}");
        let err = stderr(&out);
        assert!(
            err.contains("open") && err.contains("chmod"),
            "{url}: {err}"
        );
        assert_eq!(
            std::fs::read_dir(&open).unwrap().count(),
            0,
            "{url}: nothing is created"
        );
    }
    // A database file its group can write.
    let out = as_nobody(
        dir.path(),
        &[
            "--store",
            "sqlite:db/runs.db",
            "run",
            "f.toml",
            "--run-id",
            "r",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let db = dir.path().join("db/runs.db");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o660)).unwrap();
    let before = std::fs::read(&db).unwrap();
    let out = as_nobody(dir.path(), &["--store", "sqlite:db/runs.db", "show", "r"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("runs.db"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "the refused file is unchanged"
    );
    // A directory of another user's (root's), even if nobody may write in it.
    let foreign = dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = as_nobody(
        dir.path(),
        &[
            "--store",
            "sqlite:foreign/runs.db",
            "run",
            "f.toml",
            "--run-id",
            "r",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("foreign"), "{}", stderr(&out));
}

#[test]
fn a_symlink_planted_where_a_lock_or_sidecar_goes_is_refused_not_followed() {
    let Some(dir) = nobody_dir() else { return };
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    nix::unistd::chown(&victim, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    for (url, store_dir, planted) in [
        ("file:fs/runs.json", "fs", "runs.json.lock"),
        ("sqlite:db/runs.db", "db", "runs.db-wal"),
        ("sqlite:db2/runs.db", "db2", "runs.db-writer"),
        ("sqlite:db3/runs.db", "db3", "runs.db-shm"),
    ] {
        let d = dir.path().join(store_dir);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        nix::unistd::chown(&d, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
        let link = d.join(planted);
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(NOBODY), Some(NOBODY)).unwrap();
        let out = as_nobody(
            dir.path(),
            &["--store", url, "run", "f.toml", "--run-id", "r"],
        );
        assert_ne!(
            out.status.code(),
            Some(0),
            "{url}: a planted {planted} was followed"
        );
        let err = stderr(&out);
        assert!(
            err.contains(planted) && err.contains("symbolic link"),
            "{url}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "precious",
            "{url}"
        );
    }
}
