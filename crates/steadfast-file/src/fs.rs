//! The file-system seam of the file store: the real one, and the place where tests
//! put a simulated disk that can lose unsynced writes.

use std::any::Any;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use steadfast_core::StoreError;

/// Which part of [`Fs::write_new`] failed.
#[derive(Debug)]
pub enum WriteError {
    /// Creating or writing the file failed; nothing was made durable.
    Write(io::Error),
    /// `fsync` of the written file failed. Its data may be lost, and the kernel may
    /// not report the loss again.
    Sync(io::Error),
}

/// A held lock; dropping it releases the lock.
pub type LockGuard = Box<dyn Any + Send>;

/// The file operations the file store uses, in the order that makes a save
/// durable: [`write_new`](Fs::write_new) with `sync`, [`rename`](Fs::rename),
/// [`sync_dir`](Fs::sync_dir).
///
/// [`OsFs`] is the real implementation. Tests implement this trait to simulate
/// power loss and I/O errors.
pub trait Fs: Send + Sync + 'static {
    /// Checks and resolves the store file's path once, at open: see
    /// [`steadfast_core::local::prepare_store_file`]. Creates the missing
    /// directory (mode 0700) when `create` is set, and refuses a missing
    /// store when it is not. Returns the path every later call uses.
    fn resolve(&self, path: &Path, create: bool) -> Result<PathBuf, StoreError>;
    /// Reads a whole regular file of at most `limit` bytes, without following
    /// a symbolic link. A missing file is an error of kind `NotFound`; a larger
    /// one of kind `FileTooLarge`; anything but a regular file of kind
    /// `InvalidInput`.
    fn read(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>>;
    /// Whether the regular file at `path` holds exactly `bytes`: how the
    /// store sees that its file is still the one it wrote last. A missing
    /// file is an error of kind `NotFound`, anything but a regular file of
    /// kind `InvalidInput`. The default reads the whole file with
    /// [`read`](Fs::read).
    fn holds(&self, path: &Path, bytes: &[u8]) -> io::Result<bool> {
        match self.read(path, bytes.len() as u64) {
            Ok(found) => Ok(found == bytes),
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge => Ok(false),
            Err(e) => Err(e),
        }
    }
    /// Creates a new file with mode 0600 (failing if it exists), writes `data`,
    /// and, when `sync` is set, flushes it to stable storage on the same handle.
    fn write_new(&self, path: &Path, data: &[u8], sync: bool) -> Result<(), WriteError>;
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Flushes a directory's entries (creations, renames, removals) to stable storage.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// The names of the entries in a directory.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The size in bytes of the regular file at `path`, not following a
    /// symbolic link (anything but a regular file is an error of kind
    /// `InvalidInput`): how the store counts the blobs on disk. The default
    /// asks the operating system's file system; a simulated one overrides it.
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let meta = fs::symlink_metadata(path)?;
        if !meta.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            ));
        }
        Ok(meta.len())
    }
    /// Takes an exclusive lock on `path` (created with mode 0600 if missing) that
    /// other processes respect, waiting at most `timeout` (then `TimedOut`).
    fn lock(&self, path: &Path, timeout: Duration) -> io::Result<LockGuard>;
    /// Creates a directory with mode 0700 (the blob directory beside the
    /// store file); one that exists already is no error. The default makes
    /// it on the operating system's file system: a simulated one overrides
    /// it.
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        match fs::DirBuilder::new().mode(0o700).create(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    }
}

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

impl Fs for OsFs {
    fn resolve(&self, path: &Path, create: bool) -> Result<PathBuf, StoreError> {
        let file = steadfast_core::local::prepare_store_file(path, create)?;
        let mut lock = file.clone().into_os_string();
        lock.push(".lock");
        steadfast_core::local::check_private_file(Path::new(&lock))?;
        let mut blobs = file.clone().into_os_string();
        blobs.push(".blobs");
        steadfast_core::local::check_private_subdir(Path::new(&blobs))?;
        Ok(file)
    }

    fn read(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>> {
        let file = steadfast_core::local::open_to_read(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        let mut bytes = Vec::with_capacity(meta.len().min(limit) as usize);
        file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("the file is larger than the limit of {limit} bytes"),
            ));
        }
        Ok(bytes)
    }

    /// Compares the file with `bytes` a piece at a time, without reading
    /// it whole into memory.
    fn holds(&self, path: &Path, bytes: &[u8]) -> io::Result<bool> {
        let mut file = steadfast_core::local::open_to_read(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        if meta.len() != bytes.len() as u64 {
            return Ok(false);
        }
        let mut piece = vec![0u8; 64 << 10];
        let mut at = 0;
        loop {
            let n = match file.read(&mut piece) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(at == bytes.len());
            }
            match bytes.get(at..at + n) {
                Some(expected) if expected == &piece[..n] => at += n,
                _ => return Ok(false),
            }
        }
    }

    fn write_new(&self, path: &Path, data: &[u8], sync: bool) -> Result<(), WriteError> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(WriteError::Write)?;
        file.write_all(data).map_err(WriteError::Write)?;
        if sync {
            file.sync_all().map_err(WriteError::Sync)?;
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn lock(&self, path: &Path, timeout: Duration) -> io::Result<LockGuard> {
        let file = steadfast_core::local::no_follow(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600),
        )
        .open(path)?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Box::new(file)),
                Err(TryLockError::WouldBlock) => {
                    if start.elapsed() >= timeout {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "lock wait timed out",
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(10));
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}
