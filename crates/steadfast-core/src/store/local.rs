//! Checks for stores that keep their data in files on this machine.
//!
//! A store's directory and files must belong to the user running Steadfast and
//! must not be writable by anyone else: otherwise another user could have
//! planted them (a pre-created `.steadfast/` or database in a shared directory
//! such as `/tmp`) to read the runs' state or approve their gates. A symbolic
//! link is followed once, at open, so that every process writes one file under
//! one lock, and only when the link itself belongs to the user.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::record::error::StoreError;

/// Resolves the path of a store's main file and checks everything a store
/// relies on before it touches the file:
///
/// - the directory exists (created with mode 0700 when `create` is set, else
///   [`StoreError::NotFound`]), belongs to this user and is not writable by
///   group or others;
/// - the file, if it exists, is a regular file of this user's that group and
///   others cannot write; if it is a symbolic link, the link is this user's,
///   and its target passes the same checks (and is what is returned);
/// - without `create`, the file exists.
///
/// Returns the path to use from then on: absolute, with no symbolic link in it.
pub fn prepare_store_file(path: &Path, create: bool) -> Result<PathBuf, StoreError> {
    let shown = path.display();
    let name = path.file_name().ok_or_else(|| {
        StoreError::InvalidInput(format!("store path {shown} does not name a file"))
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    check_links(&dir)?;
    match fs::symlink_metadata(&dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !create {
                return Err(StoreError::NotFound(format!(
                    "store {shown} does not exist (its directory {} is missing)",
                    dir.display()
                )));
            }
            check_no_way_out_of_missing(path, &dir)?;
            create_private_dir(&dir)?;
        }
        Err(e) => return Err(StoreError::io(format!("inspecting {}", dir.display()), e)),
    }
    let dir = fs::canonicalize(&dir)
        .map_err(|e| StoreError::io(format!("resolving {}", dir.display()), e))?;
    check_private_dir(&dir)?;
    let file = dir.join(name);
    let meta = match fs::symlink_metadata(&file) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !create {
                return Err(StoreError::NotFound(format!(
                    "store {shown} does not exist"
                )));
            }
            return Ok(file);
        }
        Err(e) => return Err(StoreError::io(format!("inspecting {}", file.display()), e)),
    };
    if !meta.file_type().is_symlink() {
        check_private_file(&file)?;
        return Ok(file);
    }
    check_owner(&file, &meta, "the symbolic link")?;
    check_links(&file)?;
    let target = match fs::canonicalize(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StoreError::InvalidInput(format!(
                "store {shown} is a symbolic link to nothing; point it at an existing store file or remove it"
            )))
        }
        Err(e) => return Err(StoreError::io(format!("resolving {}", file.display()), e)),
    };
    if let Some(target_dir) = target.parent() {
        check_private_dir(target_dir)?;
    }
    check_private_file(&target)?;
    Ok(target)
}

/// Refuses a directory path that goes into a directory that does not
/// exist and back out of it (`runs/./new/../x.db`): creating it would make
/// a directory the store never uses.
fn check_no_way_out_of_missing(path: &Path, dir: &Path) -> Result<(), StoreError> {
    let mut at = PathBuf::new();
    for part in dir.components() {
        if part == std::path::Component::ParentDir
            && !at.as_os_str().is_empty()
            && fs::metadata(&at).is_err()
        {
            return Err(StoreError::InvalidInput(format!(
                "the store path {} goes into {}, which does not exist, and back out with `..`; write it without `..` (nothing was created)",
                path.display(),
                at.display()
            )));
        }
        at.push(part);
    }
    Ok(())
}

/// Creates a store's file (mode 0600) if it is missing, and syncs its
/// directory so that the new name survives a crash. A database that names
/// its companion files after the main file's mode (SQLite's WAL and
/// shared-memory files) then never makes anything others can read. The
/// directory is already there (see [`prepare_store_file`]).
pub fn create_private_file(path: &Path) -> Result<(), StoreError> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            fs::File::open(dir)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::io(format!("syncing directory {}", dir.display()), e))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::io(format!("creating {}", path.display()), e)),
    }
}

/// The path in what follows a file-based store's scheme (`sqlite:` and
/// `file:` take `PATH` or `//PATH`): refused when it is empty.
pub fn url_path(rest: &str) -> Result<&str, StoreError> {
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() {
        return Err(StoreError::InvalidInput(
            "it names no file; write SCHEME:PATH".into(),
        ));
    }
    Ok(path)
}

/// Checks a file a store uses beside its main one (a lock, a write-ahead log)
/// if it exists: a regular file, this user's, not writable by group or others,
/// and not a symbolic link.
pub fn check_private_file(path: &Path) -> Result<(), StoreError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io(format!("inspecting {}", path.display()), e)),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(StoreError::InvalidInput(format!(
            "{} is a symbolic link where a store file belongs; remove it",
            path.display()
        )));
    }
    if kind.is_dir() {
        return Err(StoreError::InvalidInput(format!(
            "{} is a directory, not a store file",
            path.display()
        )));
    }
    if !kind.is_file() {
        return Err(StoreError::InvalidInput(format!(
            "{} is not a regular file (a device, pipe or socket cannot hold a store)",
            path.display()
        )));
    }
    check_owner(path, &meta, "the file")?;
    check_writers(path, &meta, "the file", "chmod go-w")
}

/// Reads a secret (a key file, an access token) from `path`: a regular
/// file of this user's that group and others can neither read nor write
/// (mode 0600 or stricter), of at most `max_bytes`, in UTF-8. It is opened
/// once, without blocking (a FIFO would wait for a writer forever), and
/// every check is made on what was opened, so nothing swapped in after a
/// look gets through. With `follow_link` unset, a symbolic link is refused;
/// set, the file it leads to is checked instead.
///
/// The error is a sentence that starts with `what` and the path
/// (`key file /etc/k can be read or changed by others (mode 644); chmod 600 it`).
pub fn read_secret_file(
    path: &Path,
    what: &str,
    max_bytes: u64,
    follow_link: bool,
) -> Result<String, String> {
    use std::io::Read;
    let shown = path.display();
    let mut flags = nix::fcntl::OFlag::O_NONBLOCK;
    if !follow_link {
        flags |= nix::fcntl::OFlag::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)
        .map_err(|e| {
            if !follow_link && e.raw_os_error() == Some(nix::libc::ELOOP) {
                format!("{what} {shown} is a symbolic link; name the file itself")
            } else {
                format!("{what} {shown}: {e}")
            }
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{what} {shown}: {e}"))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "a FIFO, socket or device"
        };
        return Err(format!("{what} {shown} is {kind}, not a regular file"));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!(
            "{what} {shown} belongs to another user (uid {})",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{what} {shown} can be read or changed by others (mode {:o}); chmod 600 it",
            meta.mode() & 0o777
        ));
    }
    let mut bytes = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{what} {shown}: {e}"))?;
    if bytes.len() as u64 > max_bytes {
        return Err(format!("{what} {shown} is over {max_bytes} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| format!("{what} {shown} is not valid UTF-8"))
}

/// Adds `O_NOFOLLOW` to `opts`: opening a path whose last part is a symbolic
/// link fails instead of following it.
pub fn no_follow(opts: &mut OpenOptions) -> &mut OpenOptions {
    opts.custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
}

/// Refuses a path that passes through a symbolic link belonging to another
/// user (root's own links, like `/var/run`, are trusted): following one would
/// put the store wherever that user chose. Links are followed as the system
/// follows them, each target checked in turn, up to 40 of them.
fn check_links(path: &Path) -> Result<(), StoreError> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::path::Component;

    enum Part {
        Root,
        Up,
        Name(OsString),
    }
    fn parts(p: &Path) -> impl DoubleEndedIterator<Item = Part> + '_ {
        p.components().filter_map(|c| match c {
            Component::Normal(n) => Some(Part::Name(n.to_os_string())),
            Component::ParentDir => Some(Part::Up),
            Component::RootDir | Component::Prefix(_) => Some(Part::Root),
            Component::CurDir => None,
        })
    }

    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| StoreError::io("reading the current directory", e))?
            .join(path)
    };
    let me = nix::unistd::geteuid().as_raw();
    let mut todo: VecDeque<Part> = parts(&absolute).collect();
    let mut at = PathBuf::from("/");
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        let name = match part {
            Part::Root => {
                at = PathBuf::from("/");
                continue;
            }
            Part::Up => {
                at.pop();
                continue;
            }
            Part::Name(name) => name,
        };
        let next = at.join(&name);
        let Ok(meta) = fs::symlink_metadata(&next) else {
            // Missing from here on (or unreadable): nothing more to follow.
            return Ok(());
        };
        if !meta.file_type().is_symlink() {
            at = next;
            continue;
        }
        if meta.uid() != me && meta.uid() != 0 {
            return Err(StoreError::InvalidInput(format!(
                "refusing the store path {}: it passes through the symbolic link {}, which belongs to user id {}, so someone else chose where it leads; use a path of your own",
                path.display(),
                next.display(),
                meta.uid()
            )));
        }
        hops += 1;
        if hops > 40 {
            return Err(StoreError::InvalidInput(format!(
                "the store path {} passes through too many symbolic links",
                path.display()
            )));
        }
        let target = fs::read_link(&next)
            .map_err(|e| StoreError::io(format!("reading the link {}", next.display()), e))?;
        for p in parts(&target).rev() {
            todo.push_front(p);
        }
    }
    Ok(())
}

/// Opens a store file to read: never through a symbolic link, and without
/// blocking (a pipe or device swapped in cannot hold the open up; the caller
/// checks that what it opened is a regular file).
pub fn open_to_read(path: &Path) -> io::Result<fs::File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
}

fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StoreError::io(format!("creating directory {}", dir.display()), e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::File::open(parent)
            .and_then(|f| f.sync_all())
            .map_err(|e| StoreError::io(format!("syncing directory {}", parent.display()), e))?;
    }
    Ok(())
}

/// Checks a directory a store keeps beside its file (the file store's
/// blobs) if it exists: a directory, not a symbolic link, this user's, not
/// writable by group or others.
pub fn check_private_subdir(dir: &Path) -> Result<(), StoreError> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io(format!("inspecting {}", dir.display()), e)),
    };
    if meta.file_type().is_symlink() {
        return Err(StoreError::InvalidInput(format!(
            "{} is a symbolic link where the store's directory of large values belongs; remove it",
            dir.display()
        )));
    }
    check_private_dir(dir)
}

fn check_private_dir(dir: &Path) -> Result<(), StoreError> {
    let meta = fs::metadata(dir)
        .map_err(|e| StoreError::io(format!("inspecting {}", dir.display()), e))?;
    if !meta.is_dir() {
        return Err(StoreError::InvalidInput(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    check_owner(dir, &meta, "the store's directory")?;
    check_writers(dir, &meta, "the store's directory", "chmod go-w")
}

fn check_owner(path: &Path, meta: &fs::Metadata, what: &str) -> Result<(), StoreError> {
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(StoreError::InvalidInput(format!(
            "refusing {what} {}: it belongs to user id {}, not to this user ({me}), so someone else could have planted it; use a store in a directory of your own",
            path.display(),
            meta.uid()
        )));
    }
    Ok(())
}

fn check_writers(
    path: &Path,
    meta: &fs::Metadata,
    what: &str,
    fix: &str,
) -> Result<(), StoreError> {
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StoreError::InvalidInput(format!(
            "refusing {what} {}: its mode {mode:04o} lets group or others write it, so they could read or change the runs; run `{fix} '{}'` or use a private directory",
            path.display(),
            path.display().to_string().replace('\'', "'\\''")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_directory_is_created_and_the_path_resolved() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b/runs.db");
        let got = prepare_store_file(&path, true).unwrap();
        assert_eq!(
            got,
            fs::canonicalize(tmp.path()).unwrap().join("a/b/runs.db")
        );
        let mode = fs::metadata(tmp.path().join("a/b")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn no_directory_is_made_only_to_be_left_by_dotdot() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("./sub/../runs.db");
        let err = prepare_store_file(&path, true).unwrap_err();
        assert!(err.to_string().contains("back out with `..`"), "{err}");
        assert!(!tmp.path().join("sub").exists(), "sub was created");
        // Through a directory that exists, `..` is fine.
        fs::create_dir(tmp.path().join("there")).unwrap();
        let path = tmp.path().join("there/../new/runs.db");
        assert!(prepare_store_file(&path, true).is_ok());
        assert!(tmp.path().join("new").is_dir());
    }

    #[test]
    fn a_missing_store_is_not_created_when_asked_not_to() {
        let tmp = tempfile::tempdir().unwrap();
        let err = prepare_store_file(&tmp.path().join("deep/x.db"), false).unwrap_err();
        assert!(matches!(err, StoreError::NotFound(_)), "{err}");
        assert!(!tmp.path().join("deep").exists());
        let err = prepare_store_file(&tmp.path().join("x.db"), false).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn writable_directories_and_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shared");
        fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o777);
        let err = prepare_store_file(&dir.join("runs.db"), true).unwrap_err();
        assert!(err.to_string().contains("0777"), "{err}");
        chmod(&dir, 0o700);
        let file = dir.join("runs.db");
        fs::write(&file, b"").unwrap();
        chmod(&file, 0o666);
        let err = prepare_store_file(&file, true).unwrap_err();
        assert!(err.to_string().contains("chmod go-w"), "{err}");
    }

    #[test]
    fn a_directory_link_of_another_user_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        chmod(&theirs, 0o700);
        let link = tmp.path().join(".steadfast");
        std::os::unix::fs::symlink(&theirs, &link).unwrap();
        // Ours: followed.
        assert!(prepare_store_file(&link.join("runs.db"), true).is_ok());
        if nix::unistd::geteuid().is_root() {
            // Someone else's: refused, even though the target is private, and
            // also when reached through a link of our own.
            std::os::unix::fs::lchown(&link, Some(65534), None).unwrap();
            let err = prepare_store_file(&link.join("runs.db"), true).unwrap_err();
            assert!(
                err.to_string().contains("belongs to user id 65534"),
                "{err}"
            );
            let ours = tmp.path().join("ours");
            std::os::unix::fs::symlink(&link, &ours).unwrap();
            let err = prepare_store_file(&ours.join("sub/runs.db"), true).unwrap_err();
            assert!(
                err.to_string().contains("belongs to user id 65534"),
                "{err}"
            );
            assert!(
                !theirs.join("sub").exists(),
                "nothing created through the link"
            );
        }
    }

    #[test]
    fn secret_files_must_be_private_regular_files() {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("key");
        fs::write(&key, "s3cret").unwrap();
        chmod(&key, 0o644);
        let err = read_secret_file(&key, "token file", 64, true).unwrap_err();
        assert!(
            err.contains("can be read or changed by others (mode 644); chmod 600 it"),
            "{err}"
        );
        chmod(&key, 0o600);
        assert_eq!(
            read_secret_file(&key, "token file", 64, true).unwrap(),
            "s3cret"
        );
        let err = read_secret_file(&key, "token file", 3, true).unwrap_err();
        assert!(err.contains("is over 3 bytes"), "{err}");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&key, &link).unwrap();
        assert_eq!(
            read_secret_file(&link, "token file", 64, true).unwrap(),
            "s3cret"
        );
        let err = read_secret_file(&link, "key file", 64, false).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        let err = read_secret_file(tmp.path(), "key file", 64, true).unwrap_err();
        assert!(err.contains("a directory, not a regular file"), "{err}");
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&key, Some(65534), None).unwrap();
            let err = read_secret_file(&key, "key file", 64, true).unwrap_err();
            assert!(err.contains("belongs to another user (uid 65534)"), "{err}");
        }
    }

    #[test]
    fn symlinks_are_resolved_once_and_devices_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real.json");
        fs::write(&real, b"{}").unwrap();
        chmod(&real, 0o600);
        let link = tmp.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            prepare_store_file(&link, true).unwrap(),
            fs::canonicalize(&real).unwrap()
        );
        let dangling = tmp.path().join("dangling.json");
        std::os::unix::fs::symlink(tmp.path().join("nothing"), &dangling).unwrap();
        assert!(prepare_store_file(&dangling, true).is_err());
        let err = check_private_file(&link).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let err = check_private_file(Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}
