//! The JSON file store of Steadfast (`file:PATH`): every run in one
//! human-readable JSON file.
//!
//! A save re-reads the file under an exclusive lock on a sidecar `PATH.lock`,
//! checks the version, writes the whole map to a uniquely named temp file in the
//! same directory with mode 0600, `fsync`s it, renames it over the file and
//! `fsync`s the directory. A save that returned `Ok` therefore survives a process
//! kill and a power loss. Readers need no lock: a rename is atomic, so they see
//! the old file or the new one.
//!
//! A value larger than the blob threshold (default 64 KiB,
//! `file:PATH?blob_threshold=SIZE`) is stored once, as a file named by the
//! SHA-256 of its text in the directory `PATH.blobs` beside the file, and the
//! file holds a reference to it. A blob is written to a temp file, `fsync`ed,
//! renamed into place and its directory `fsync`ed before the store file that
//! refers to it is renamed into place; a blob no run refers to any more is
//! removed after the store file without it is durable. So a crash at any
//! point leaves no reference to a missing blob.
//!
//! Each save rewrites every run, so its cost grows with the file: this store is
//! for small deployments, tests and inspection. It keeps each run's per-step
//! history beside the runs (so rewind, fork and prune work here too), which
//! every save rewrites as well: `prune` keeps it small. It is for local file
//! systems only (advisory locks and rename are not reliable on network file
//! systems).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use serde_json::json;
//! use steadfast_core::{run, update, Workflow};
//! use steadfast_file::FileStore;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = FileStore::open(dir.path().join("runs.json"))?;
//! let wf = Workflow::builder("hello")
//!     .step("hi", |_, _| async { update(json!({"hi": 1})) })
//!     .build()
//!     .unwrap();
//! run("r1", &wf, &store).await.unwrap();
//! let text = std::fs::read_to_string(dir.path().join("runs.json")).unwrap();
//! assert!(text.contains("\"r1\""));
//! # Ok::<(), steadfast_core::StoreError>(())
//! # }).unwrap();
//! ```

mod fs;
mod image;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use steadfast_core::store::blob::{Blob, BlobHash, Resolver};
use steadfast_core::store::image::Write;
use steadfast_core::store::rows::Place;
use steadfast_core::store::{check_size, Rewrite, SaveRequest};
use steadfast_core::{
    BlobTotals, Blobs, Capabilities, Document, Documents, Events, History, NewEvent, RunEvent,
    Usage,
};
use steadfast_core::{Checkpoint, ListFilter, RunSummary, StepRecord, Store, StoreError};

pub use crate::fs::{Fs, LockGuard, OsFs, WriteError};
pub use crate::image::FILE_FORMAT;
use crate::image::{Fragments, Image};

/// Default limit of the whole file: 64 MiB. Every save rewrites the whole file,
/// so a larger one is slow to checkpoint; use the SQLite store instead.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;

/// Default limit of one run's state: 16 MiB.
pub const DEFAULT_MAX_STATE_BYTES: u64 = 16 << 20;

pub use steadfast_core::store::blob::DEFAULT_BLOB_THRESHOLD;

/// The prefix of a blob being written.
const BLOB_TMP: &str = ".tmp-";

/// Default lock wait: 10 seconds.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Limits and waits of a [`FileStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FileStoreOptions {
    /// The largest file a save may write.
    pub max_file_bytes: u64,
    /// The largest state (serialized) of one run.
    pub max_state_bytes: u64,
    /// How long a save waits for another process's lock.
    pub lock_timeout: Duration,
    /// Whether opening may create the file's directory (the file itself is
    /// created by the first save). Without it, a missing store is
    /// [`StoreError::NotFound`], for commands that only read.
    pub create: bool,
    /// The size (JSON text, bytes) above which a value is stored once as a
    /// blob file beside the store file (default [`DEFAULT_BLOB_THRESHOLD`];
    /// `?blob_threshold=SIZE` in a URL).
    pub blob_threshold: u64,
    /// Test-only switches that break guarantees on purpose.
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    pub mutants: Mutants,
}

impl Default for FileStoreOptions {
    fn default() -> Self {
        FileStoreOptions {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            create: true,
            blob_threshold: DEFAULT_BLOB_THRESHOLD,
            #[cfg(feature = "mutants")]
            mutants: Mutants::default(),
        }
    }
}

impl FileStoreOptions {
    /// Sets the file size limit.
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }
    /// Sets the per-run state size limit.
    pub fn max_state_bytes(mut self, bytes: u64) -> Self {
        self.max_state_bytes = bytes;
        self
    }
    /// Sets the lock wait.
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d;
        self
    }
    /// Sets whether opening may create a missing store.
    pub fn create(mut self, yes: bool) -> Self {
        self.create = yes;
        self
    }
    /// Sets the size above which a value is stored as a blob (checked when
    /// the store opens: 256 bytes to 1 GiB).
    pub fn blob_threshold(mut self, bytes: u64) -> Self {
        self.blob_threshold = bytes;
        self
    }
}

/// Deliberate defects, settable only with the `mutants` feature, so that the
/// durability tests can show they fail when a guarantee is missing.
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct Mutants {
    /// Skip the `fsync` of the temp file.
    pub no_file_fsync: bool,
    /// Skip the `fsync` of the directory after the rename.
    pub no_dir_fsync: bool,
    /// Skip the `fsync` of the blob directory before the store file that
    /// refers to new blobs is renamed into place.
    pub no_blob_dir_fsync: bool,
    /// Skip the `fsync` of each new blob file (the store file's own stays).
    pub no_blob_fsync: bool,
    /// Take no lock at all.
    pub no_lock: bool,
    /// Lock the data file instead of the sidecar.
    pub lock_data_file: bool,
    /// Treat an undecodable file as an empty store.
    pub fresh_start_on_corrupt: bool,
    /// Go on to the rename when writing the temp file failed (a full disk):
    /// a torn file replaces the good one.
    pub ignore_write_errors: bool,
    /// Sleep this long between reading the file and renaming the new one, to
    /// widen the window in which a missing lock loses updates.
    pub pause_before_rename: Option<Duration>,
}

/// The JSON file store. Cheap to clone; clones share one handle.
#[derive(Clone)]
pub struct FileStore<F: Fs = OsFs> {
    inner: Arc<Inner<F>>,
}

struct Inner<F> {
    fs: F,
    path: PathBuf,
    dir: PathBuf,
    /// `PATH.blobs`: one file per blob, named by its hash.
    blob_dir: PathBuf,
    lock_path: PathBuf,
    tmp_prefix: String,
    opts: FileStoreOptions,
    /// Set after an fsync (or a write the outcome of which is unknown) failed.
    poisoned: AtomicBool,
    /// Serializes this process's writers before they contend for the file
    /// lock, and holds what the last of them wrote.
    writers: Mutex<Option<Written>>,
}

/// A file this handle wrote, and its image: a writer that finds these very
/// bytes in the file takes the image instead of decoding them again.
struct Written {
    bytes: Vec<u8>,
    /// Memory for the text of the next write (the one before `bytes`).
    spare: Vec<u8>,
    image: Image,
    /// Where each run stands in `bytes`.
    fragments: Fragments,
    /// How many writes in a row took a kept image instead of decoding.
    taken: u32,
    /// Whether the blob directory may hold anything after that write: if
    /// not, a write that adds no blob has nothing to sweep.
    blobs: bool,
}

/// The largest file whose image a handle keeps between its writes (8 MiB):
/// past it, each write decodes the file, and memory holds no second copy.
const KEEP_IMAGE_BYTES: usize = 8 << 20;

/// Every this many writes in a row, a write decodes the file even though it
/// holds the bytes this handle wrote: a file this build wrote but could not
/// read back would be refused as `Corrupt` within so many writes, as it is
/// at the next write of any other handle.
const DECODE_EVERY: u32 = 32;

impl<F: Fs> std::fmt::Debug for FileStore<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.inner.path)
            .field("opts", &self.inner.opts)
            .finish_non_exhaustive()
    }
}

impl FileStore<OsFs> {
    /// Opens (or prepares to create) the store file at `path` with default options.
    ///
    /// A missing file is an empty store; it is created by the first save. A
    /// missing parent directory is created with mode 0700. Temp files left by a
    /// crashed writer are removed. The file itself is decoded by each operation
    /// (a write may take the image of the file this handle wrote last, when
    /// the file still holds those bytes), so a corrupt file is reported
    /// there, with its location.
    ///
    /// The directory and the file must belong to this user and must not be
    /// writable by group or others; a symbolic link (of this user's) is
    /// resolved here, once, so that every process writes the same file under
    /// the same lock. See [`steadfast_core::local::prepare_store_file`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(OsFs, path, FileStoreOptions::default())
    }
}

/// The URL schemes this store answers to: `file:PATH` (or `file://PATH`).
pub const URL_SCHEMES: &[&str] = &["file"];

/// Opens the store that a `file:` URL names (`rest` is what follows the
/// scheme), creating its directory only when `create` is set.
///
/// What follows a `?` sets options: `blob_threshold=SIZE` (bytes, or with
/// `KiB`, `MiB` or `GiB`), the size above which a value is stored as a blob.
pub fn open_url(rest: &str, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    let (rest, threshold) = steadfast_core::store::blob::split_url_options("file", rest)?;
    let path = steadfast_core::local::url_path(rest)?;
    let mut opts = FileStoreOptions::default().create(create);
    if let Some(t) = threshold {
        opts.blob_threshold = t;
    }
    Ok(Arc::new(FileStore::open_with(OsFs, path, opts)?))
}

/// This store as a backend of the facade: `file:PATH`.
pub const BACKEND: steadfast_core::store::backend::Backend =
    steadfast_core::store::backend::Backend::new(
        "file",
        URL_SCHEMES,
        "file:PATH",
        "every run in one JSON file",
        |_, rest, create| Box::pin(std::future::ready(open_url(rest, create))),
    );

impl<F: Fs> FileStore<F> {
    /// Opens a store on a given file system with the given options.
    pub fn open_with(
        fs: F,
        path: impl AsRef<Path>,
        opts: FileStoreOptions,
    ) -> Result<Self, StoreError> {
        steadfast_core::store::blob::check_threshold(opts.blob_threshold)?;
        let given = path.as_ref();
        given.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            StoreError::InvalidInput(format!(
                "file store path {} has no file name",
                given.display()
            ))
        })?;
        let path = fs.resolve(given, opts.create)?;
        let file_name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                StoreError::InvalidInput(format!(
                    "file store path {} resolves to {}, which has no file name",
                    given.display(),
                    path.display()
                ))
            })?
            .to_string();
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut lock_name = path.clone().into_os_string();
        lock_name.push(".lock");
        let mut blob_name = path.clone().into_os_string();
        blob_name.push(".blobs");
        let store = FileStore {
            inner: Arc::new(Inner {
                fs,
                lock_path: PathBuf::from(lock_name),
                blob_dir: PathBuf::from(blob_name),
                tmp_prefix: format!(".{file_name}.tmp-"),
                path,
                dir,
                opts,
                poisoned: AtomicBool::new(false),
                writers: Mutex::new(None),
            }),
        };
        store.inner.sweep_temps()?;
        Ok(store)
    }

    /// The store file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` off the async executor. When `writes` names a run, `f` may
    /// write it, so a worker that died leaves the outcome unknown.
    async fn blocking<T: Send + 'static>(
        &self,
        writes: Option<&str>,
        f: impl FnOnce(&Inner<F>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = Arc::clone(&self.inner);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle
                .spawn_blocking(move || f(&inner))
                .await
                .map_err(|e| {
                    let failed =
                        StoreError::unavailable(format!("file store worker thread failed: {e}"));
                    match writes {
                        Some(run_id) => StoreError::OutcomeUnknown {
                            run_id: run_id.to_string(),
                            source: failed.into(),
                        },
                        None => failed,
                    }
                })?,
            Err(_) => f(&inner),
        }
    }
}

impl<F: Fs> Inner<F> {
    fn read_image(&self) -> Result<Image, StoreError> {
        match self.read_file()? {
            Some(bytes) => self.decode(&bytes),
            None => Ok(Image::empty()),
        }
    }

    /// The store file's bytes; `None` when there is no file yet.
    fn read_file(&self) -> Result<Option<Vec<u8>>, StoreError> {
        match self.fs.read(&self.path, self.opts.max_file_bytes) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => Err(StoreError::backend(
                steadfast_core::StoreErrorKind::TooLarge,
                format!(
                    "{} is larger than the store's file limit of {} bytes; raise FileStoreOptions::max_file_bytes to read it",
                    self.path.display(),
                    self.opts.max_file_bytes
                ),
            )),
            Err(e) => Err(StoreError::io(
                format!("reading {}", self.path.display()),
                e,
            )),
        }
    }

    fn decode(&self, bytes: &[u8]) -> Result<Image, StoreError> {
        let decoded = Image::decode(bytes, &self.path);
        #[cfg(feature = "mutants")]
        if self.opts.mutants.fresh_start_on_corrupt && decoded.is_err() {
            return Ok(Image::empty());
        }
        decoded
    }

    /// Whether a deliberate defect is switched on (never, without `mutants`).
    #[cfg(feature = "mutants")]
    fn mutant(&self, f: impl Fn(&Mutants) -> bool) -> bool {
        f(&self.opts.mutants)
    }

    #[cfg(not(feature = "mutants"))]
    fn mutant(&self, _f: impl Fn(&Mutants) -> bool) -> bool {
        false
    }

    fn lock(&self) -> Result<Option<LockGuard>, StoreError> {
        if self.mutant(|m| m.no_lock) {
            return Ok(None);
        }
        let path = if self.mutant(|m| m.lock_data_file) {
            &self.path
        } else {
            &self.lock_path
        };
        match self.fs.lock(path, self.opts.lock_timeout) {
            Ok(g) => Ok(Some(g)),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(StoreError::LockTimeout {
                path: path.clone(),
                waited: self.opts.lock_timeout,
            }),
            Err(e) => Err(StoreError::io(format!("locking {}", path.display()), e)),
        }
    }

    /// Removes temp files of writers that died between creating and renaming them.
    /// Temps are only created under the lock, so under the lock every one is stale.
    fn sweep_temps(&self) -> Result<(), StoreError> {
        let _w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        let _lock = self.lock()?;
        let names = match self.fs.list_dir(&self.dir) {
            Ok(n) => n,
            Err(e) => return Err(StoreError::io(format!("listing {}", self.dir.display()), e)),
        };
        let mut removed = 0;
        for name in names.iter().filter(|n| n.starts_with(&self.tmp_prefix)) {
            let p = self.dir.join(name);
            match self.fs.remove_file(&p) {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "could not remove a leftover temp file")
                }
            }
        }
        // Blob temps are made under the lock too. A blob directory made by
        // a writer that died before it synced the store's directory gets
        // its entry synced now, before anything else refers into it.
        if let Ok(names) = self.fs.list_dir(&self.blob_dir) {
            for name in names.iter().filter(|n| n.starts_with(BLOB_TMP)) {
                let p = self.blob_dir.join(name);
                if let Err(e) = self.fs.remove_file(&p) {
                    tracing::warn!(path = %p.display(), error = %e, "could not remove a leftover temp file")
                }
            }
            self.fs.sync_dir(&self.dir).map_err(|e| {
                StoreError::io(format!("syncing directory {}", self.dir.display()), e)
            })?;
        }
        if removed > 0 {
            tracing::info!(removed, dir = %self.dir.display(), "removed leftover temp files");
            self.fs.sync_dir(&self.dir).map_err(|e| {
                StoreError::io(format!("syncing directory {}", self.dir.display()), e)
            })?;
        }
        Ok(())
    }

    fn check_poisoned(&self) -> Result<(), StoreError> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(StoreError::Poisoned {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// Read, change and durably replace the file under both locks. `change` sees
    /// the decoded image and returns `Ok(false)` when there is nothing to write.
    /// It must change nothing but run `run_id`'s record, history rows and
    /// events, or shared documents: the text of every other run is copied
    /// from the file this handle wrote last (debug builds check the whole
    /// text at every write).
    /// `blobs` (those the change refers to) are made durable before the file
    /// that refers to them; blobs no run refers to any more are removed once
    /// the file without them is: at once when the change dropped one of the
    /// run's references or wrote a blob the file does not refer to, and
    /// those a crash or a failed write left at the next write that decodes
    /// the file (within [`DECODE_EVERY`] writes of a handle).
    fn update<T>(
        &self,
        run_id: &str,
        blobs: &[Blob],
        change: impl FnOnce(&mut Image) -> Result<(bool, T), StoreError>,
    ) -> Result<T, StoreError> {
        self.check_poisoned()?;
        let mut written = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        let _lock = self.lock()?;
        // A writer that waited for the locks while another's sync failed.
        self.check_poisoned()?;
        // What this handle wrote last, unless the file has changed since
        // (another handle or process wrote it): then the file, decoded.
        // Taken out, so that a write that fails (its change may have
        // changed the image) leaves nothing kept.
        let kept = written.take();
        let mut taken = 0;
        let keep = |len: usize| len <= KEEP_IMAGE_BYTES;
        let same = match &kept {
            Some(k) if k.taken + 1 < DECODE_EVERY => match self.fs.holds(&self.path, &k.bytes) {
                Ok(same) => same,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    return Err(StoreError::io(
                        format!("reading {}", self.path.display()),
                        e,
                    ))
                }
            },
            _ => false,
        };
        // `seen`: what the kept write saw of the blob directory; `None`
        // when the file was decoded (this handle's first write, another
        // writer's file, a write after a failed one, every 32nd write),
        // and then the write sweeps the directory whole.
        let (mut image, mut fragments, old, spare, seen) = match kept {
            Some(k) if same => {
                taken = k.taken + 1;
                // Kept only for a file within the size kept.
                let fragments = k.fragments.keeping();
                (k.image, fragments, k.bytes, k.spare, Some(k.blobs))
            }
            _ => match self.read_file()? {
                None => (
                    Image::empty(),
                    Fragments::new(true),
                    Vec::new(),
                    Vec::new(),
                    None,
                ),
                Some(bytes) => {
                    let image = self.decode(&bytes)?;
                    let fragments = Fragments::new(keep(bytes.len()));
                    (image, fragments, Vec::new(), bytes, None)
                }
            },
        };
        // Every change is to one run's record, history rows and events (or
        // to one document): the text of every other run stays, and so do
        // their references. So a blob the file referred to can lose its
        // last reference only if the change dropped one of this run's.
        fragments.forget(run_id);
        // The blobs the run's record as stored refers to: their names are
        // durable (synced before the file that refers to them).
        let durable: std::collections::HashSet<BlobHash> = if blobs.is_empty() {
            Default::default()
        } else {
            image
                .with(|d| Ok(d.refs_of_record(run_id)))?
                .into_iter()
                .map(|(h, _)| h)
                .collect()
        };
        let before = match seen {
            Some(true) => Some(image.with(|d| Ok(d.refs_of_run(run_id)))?),
            _ => None,
        };
        let (write, out) = change(&mut image)?;
        if !write {
            return Ok(out);
        }
        let bytes = image.encode_with(&self.path, &mut fragments, &old, spare)?;
        check_size(
            run_id,
            "store file",
            bytes.len() as u64,
            self.opts.max_file_bytes,
        )?;
        #[cfg(feature = "mutants")]
        if let Some(d) = self.opts.mutants.pause_before_rename {
            std::thread::sleep(d);
        }
        self.write_blobs(blobs, &durable)?;
        self.replace(run_id, &bytes)?;
        // Sweep when the change dropped one of the run's references, or
        // wrote a blob the file does not refer to (a step its rows did not
        // take, a rewrite of a record that has no row): otherwise no blob
        // lost its last reference, and none was left behind.
        let sweep = match seen {
            None => true,
            Some(seen) if !seen && blobs.is_empty() => false,
            Some(_) => {
                let after: std::collections::HashSet<BlobHash> = image
                    .with(|d| Ok(d.refs_of_run(run_id)))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(h, _)| h)
                    .collect();
                before.iter().flatten().any(|(h, _)| !after.contains(h))
                    || blobs.iter().any(|b| !after.contains(&b.hash))
            }
        };
        let blobs_left = if sweep {
            self.sweep_blobs(&mut image)
        } else {
            seen == Some(true) || !blobs.is_empty()
        };
        if keep(bytes.len()) {
            // The image kept must be the one the bytes decode to, or a
            // writer would build on what no reader sees: every test of a
            // debug build checks that it is. (The format is not compared:
            // `encode` sets it from the content, and decoding reads it.)
            #[cfg(debug_assertions)]
            {
                let decoded = self.decode(&bytes).map(|mut d| d.with(|d| Ok(d.clone())));
                let kept = image.with(|d| Ok(d.clone()));
                assert!(
                    matches!((&decoded, &kept), (Ok(Ok(d)), Ok(k)) if d == k),
                    "the image kept differs from the file written"
                );
            }
            *written = Some(Written {
                bytes,
                spare: old,
                image,
                fragments,
                taken,
                blobs: blobs_left,
            });
        }
        Ok(out)
    }

    /// Writes each of `blobs` not stored yet: a temp file, `fsync`ed, renamed
    /// to its hash, then the blob directory `fsync`ed (and, when it was just
    /// made, the store's directory). A failed `fsync` poisons the handle.
    /// The directory is not synced when every blob is there and named in
    /// `durable` (the run's stored record refers to it, so its name was
    /// synced before that record was written): every save of a run whose
    /// decision carries a large value carries that blob.
    fn write_blobs(
        &self,
        blobs: &[Blob],
        durable: &std::collections::HashSet<BlobHash>,
    ) -> Result<(), StoreError> {
        if blobs.is_empty() {
            return Ok(());
        }
        let dir = &self.blob_dir;
        let io = |what: &str, e| StoreError::io(format!("{what} {}", dir.display()), e);
        let present: std::collections::HashSet<String> = match self.fs.list_dir(dir) {
            Ok(names) => names.into_iter().collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.fs
                    .create_dir(dir)
                    .map_err(|e| io("creating the blob directory", e))?;
                // Its entry durable before any file refers into it.
                self.fs.sync_dir(&self.dir).map_err(|e| {
                    self.poisoned.store(true, Ordering::SeqCst);
                    StoreError::io(format!("syncing directory {}", self.dir.display()), e)
                })?;
                Default::default()
            }
            Err(e) => return Err(io("listing", e)),
        };
        let mut sync = false;
        for blob in blobs {
            let name = blob.hash.hex();
            if present.contains(&name) {
                sync |= !durable.contains(&blob.hash);
                continue;
            }
            sync = true;
            let tmp = dir.join(format!(
                "{BLOB_TMP}{}-{:016x}",
                std::process::id(),
                fastrand::u64(..)
            ));
            let sync_blob = !self.mutant(|m| m.no_blob_fsync);
            self.put_in_place(&tmp, &dir.join(&name), blob.text.as_bytes(), sync_blob)?;
        }
        // Also when every blob was there already, unless the stored record
        // refers to each: a name another writer renamed into place is not
        // durable until someone syncs the directory (that writer may have
        // died, or failed, before it did).
        if sync && !self.mutant(|m| m.no_blob_dir_fsync) {
            self.fs.sync_dir(dir).map_err(|e| {
                self.poisoned.store(true, Ordering::SeqCst);
                io("syncing", e)
            })?;
        }
        Ok(())
    }

    /// Removes the blobs no record or history row of `image` (the file just
    /// made durable) refers to, and leftover temps. Under the lock, after the
    /// rename: a crash before a removal leaves a blob no one needs, never a
    /// reference to a missing one. A removal that fails is left for the
    /// next sweep. Returns whether the directory may still hold anything
    /// (false when it is missing, true when it could not be listed).
    fn sweep_blobs(&self, image: &mut Image) -> bool {
        let names = match self.fs.list_dir(&self.blob_dir) {
            Ok(names) => names,
            Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
        };
        if names.is_empty() {
            return false;
        }
        let Ok(wanted) = image.with(|data| {
            Ok(data
                .all_refs()
                .into_keys()
                .collect::<std::collections::HashSet<_>>())
        }) else {
            return true;
        };
        let mut left = false;
        for name in names {
            // Ours: a temp, or a blob's name (its hash's hex digits).
            let unwanted = name.starts_with(BLOB_TMP)
                || BlobHash::parse_hex(&name).is_some_and(|h| !wanted.contains(&h));
            if !unwanted {
                left = true;
                continue;
            }
            let p = self.blob_dir.join(&name);
            if let Err(e) = self.fs.remove_file(&p) {
                left = true;
                tracing::warn!(path = %p.display(), error = %e, "could not remove a blob no run refers to");
            }
        }
        left
    }

    /// How many blob files (named by a hash) the blob directory holds, and
    /// their bytes; an entry of that name that is not a regular file (a
    /// planted link or directory, which a load refuses) is not counted.
    fn blob_files(&self) -> Result<BlobTotals, StoreError> {
        let names = match self.fs.list_dir(&self.blob_dir) {
            Ok(names) => names,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(StoreError::io(
                    format!("listing {}", self.blob_dir.display()),
                    e,
                ))
            }
        };
        let (mut blobs, mut bytes) = (0u64, 0u64);
        for name in names {
            if BlobHash::parse_hex(&name).is_none() {
                continue;
            }
            let path = self.blob_dir.join(&name);
            match self.fs.file_len(&path) {
                Ok(n) => {
                    blobs += 1;
                    bytes += n;
                }
                // Removed by a sweep since the listing, or not a blob.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidInput
                    ) => {}
                Err(e) => return Err(StoreError::io(format!("reading {}", path.display()), e)),
            }
        }
        Ok(BlobTotals::new(blobs, bytes))
    }

    /// The stored text of blob `hash`, read up to `expect` bytes (what its
    /// reference says); `None` when there is no such file.
    fn fetch(&self, hash: &BlobHash, expect: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.blob_dir.join(hash.hex());
        match self.fs.read(&path, expect) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => Err(StoreError::Corrupt {
                location: path.display().to_string(),
                reason: format!("blob {hash} is longer than the {expect} bytes its reference says"),
            }),
            Err(e) => Err(StoreError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Run `run_id`'s record with its values put back, or its history rows
    /// (`history`): read, then its blobs. A blob removed between the two (by
    /// a writer that changed or deleted the run meanwhile) sends it back to
    /// read the file again, the last time under the writers' lock, so that
    /// what it then reports is the store's state, not a race.
    fn read_resolved<T>(
        &self,
        run_id: &str,
        take: impl Fn(&mut Image) -> Option<T>,
        marked: impl Fn(&T) -> bool,
        resolve: impl Fn(&mut T, &Place<'_>, &mut Resolver<'_>) -> Result<(), StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let at = format!("{} run {run_id:?}", self.path.display());
        let locate = move |column: &str| format!("{at} {column}");
        let place = Place::new(run_id, &locate);
        const TRIES: usize = 3;
        for attempt in 1..=TRIES {
            let _lock = if attempt == TRIES { self.lock()? } else { None };
            let mut image = self.read_image()?;
            let Some(mut value) = take(&mut image) else {
                return Ok(None);
            };
            if !marked(&value) {
                return Ok(Some(value));
            }
            let mut fetch = |h: &BlobHash, n: u64| self.fetch(h, n);
            let mut resolver = Resolver::new(&mut fetch);
            match resolve(&mut value, &place, &mut resolver) {
                Ok(()) => return Ok(Some(value)),
                Err(e) if attempt == TRIES => return Err(e),
                Err(_) => continue,
            }
        }
        Ok(None)
    }

    /// Writes `bytes` to the new file `tmp`, `fsync`s it (when `sync`: only
    /// a mutant passes `false`) and renames it to `to` (the store file, or
    /// a blob); on a failure the temp is removed. A
    /// failed `fsync` poisons the handle: the kernel may have dropped the
    /// pages and will not say so again. The directory is not synced here.
    fn put_in_place(
        &self,
        tmp: &Path,
        to: &Path,
        bytes: &[u8],
        sync: bool,
    ) -> Result<(), StoreError> {
        let sync_file = sync && !self.mutant(|m| m.no_file_fsync);
        let written = match self.fs.write_new(tmp, bytes, sync_file) {
            Err(WriteError::Write(_)) if self.mutant(|m| m.ignore_write_errors) => Ok(()),
            other => other,
        };
        if let Err(e) = written {
            let _ = self.fs.remove_file(tmp);
            return Err(match e {
                WriteError::Write(e) => StoreError::io(format!("writing {}", tmp.display()), e),
                WriteError::Sync(e) => {
                    self.poisoned.store(true, Ordering::SeqCst);
                    StoreError::io(format!("syncing {}", tmp.display()), e)
                }
            });
        }
        if let Err(e) = self.fs.rename(tmp, to) {
            let _ = self.fs.remove_file(tmp);
            return Err(StoreError::io(
                format!("renaming {} over {}", tmp.display(), to.display()),
                e,
            ));
        }
        Ok(())
    }

    fn replace(&self, run_id: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let tmp = self.dir.join(format!(
            "{}{}-{:016x}",
            self.tmp_prefix,
            std::process::id(),
            fastrand::u64(..)
        ));
        let sync_dir = !self.mutant(|m| m.no_dir_fsync);
        self.put_in_place(&tmp, &self.path, bytes, true)?;
        if sync_dir {
            if let Err(e) = self.fs.sync_dir(&self.dir) {
                // The new file is visible but may not survive a power loss.
                self.poisoned.store(true, Ordering::SeqCst);
                return Err(StoreError::OutcomeUnknown {
                    run_id: run_id.to_string(),
                    source: Box::new(StoreError::io(
                        format!("syncing directory {}", self.dir.display()),
                        e,
                    )),
                });
            }
        }
        Ok(())
    }
}

#[async_trait]
impl<F: Fs> Store for FileStore<F> {
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .history(self)
            .max_state_bytes(self.inner.opts.max_state_bytes)
            .blobs(self)
            .events(self)
            .documents(self)
    }

    async fn load(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let run_id = run_id.to_string();
        self.blocking(None, move |inner| {
            inner.read_resolved(
                &run_id,
                |image| image.runs.remove(&run_id),
                steadfast_core::store::blob::record_holds_marks,
                |cp, place, resolver| resolver.resolve_record(cp, place),
            )
        })
        .await
    }

    async fn save(&self, req: SaveRequest<'_>) -> Result<u64, StoreError> {
        let (limit, threshold) = (
            self.inner.opts.max_state_bytes,
            self.inner.opts.blob_threshold,
        );
        // A save that completes the step after the stored one writes the
        // stored state with the step's update over it, so only the update's
        // values are written out (a state may hold many large ones). Should
        // the stored record turn out not to be the one the step follows,
        // nothing is written and the whole state is, below.
        if let Some((write, blobs)) = Write::after_step_with_blobs(&req, limit, threshold)? {
            let run_id = write.run_id().to_string();
            let saved = self
                .blocking(Some(&run_id.clone()), move |inner| {
                    inner.update(&run_id, &blobs, move |image| {
                        let saved = image.with(|data| data.try_save(write))?;
                        Ok((saved.is_some(), saved))
                    })
                })
                .await?;
            if let Some(version) = saved {
                return Ok(version);
            }
        }
        // Checked before the lock: a value the parser would refuse must not
        // be written, or the whole file (every run in it) would stop loading.
        let (write, blobs) = Write::checked_with_blobs(&req, limit, threshold)?;
        let run_id = write.run_id().to_string();
        self.blocking(Some(&run_id.clone()), move |inner| {
            inner.update(&run_id, &blobs, move |image| {
                image.with(|data| data.save(write)).map(|v| (true, v))
            })
        })
        .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, StoreError> {
        let filter = filter.clone();
        self.blocking(None, move |inner| {
            let mut image = inner.read_image()?;
            image.with(|data| Ok(data.list(&filter)))
        })
        .await
    }

    async fn delete(&self, run_id: &str) -> Result<bool, StoreError> {
        let run_id = run_id.to_string();
        let writes = run_id.clone();
        self.blocking(Some(&writes), move |inner| {
            inner.update(&run_id, &[], |image| {
                // Events may be there without the run (emitted before its
                // first save): they go too.
                let logged = image.events.contains_key(&run_id);
                let existed = image.with(|data| Ok(data.delete(&run_id)))?;
                Ok((existed || logged, existed))
            })
        })
        .await
    }

    async fn delete_if(&self, run_id: &str, version: u64) -> Result<bool, StoreError> {
        let run_id = run_id.to_string();
        let writes = run_id.clone();
        self.blocking(Some(&writes), move |inner| {
            inner.update(&run_id, &[], |image| {
                let existed = image.with(|data| data.delete_if(&run_id, version))?;
                Ok((existed, existed))
            })
        })
        .await
    }
}

/// The part of the file's limit the event logs may fill, as a divisor: a
/// quarter ([`FileStoreOptions::max_file_bytes`] / 4). Beyond it appends are
/// refused, so that chatty steps never leave the runs' checkpoints without
/// room.
pub const EVENTS_SHARE: u64 = 4;

/// Each append rewrites the file, as a save does (fsync of the file and its
/// directory): emitting steps make the file store's slowness twice felt,
/// which batching (at most one append per 100 ms per step) keeps small. The
/// event logs together may fill at most a quarter of the file's limit
/// ([`EVENTS_SHARE`]); delete or prune finished runs to make room.
/// Each write rewrites the file, as a save does.
#[async_trait]
impl<F: Fs> Documents for FileStore<F> {
    async fn get_document(&self, key: &str) -> Result<Option<Document>, StoreError> {
        let key = key.to_string();
        self.blocking(None, move |inner| {
            let mut image = inner.read_image()?;
            image.with(|data| Ok(data.get_document(&key)))
        })
        .await
    }

    async fn put_document(
        &self,
        key: &str,
        value: &serde_json::Value,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        // Checked before the lock, as a save is.
        steadfast_core::store::check_document(key, value)?;
        let (key, value) = (key.to_string(), value.clone());
        self.blocking(Some(&key.clone()), move |inner| {
            inner.update(&key.clone(), &[], |image| {
                let v = image.with(|data| data.put_document(&key, &value, expected))?;
                Ok((true, v))
            })
        })
        .await
    }

    async fn list_documents(&self, prefix: &str) -> Result<Vec<Document>, StoreError> {
        let prefix = prefix.to_string();
        self.blocking(None, move |inner| {
            let mut image = inner.read_image()?;
            image.with(|data| Ok(data.list_documents(&prefix)))
        })
        .await
    }

    async fn delete_document(&self, key: &str, expected: u64) -> Result<bool, StoreError> {
        let key = key.to_string();
        self.blocking(Some(&key.clone()), move |inner| {
            inner.update(&key.clone(), &[], |image| {
                let gone = image.with(|data| Ok(data.delete_document(&key, expected)))?;
                Ok((gone, gone))
            })
        })
        .await
    }
}

#[async_trait]
impl<F: Fs> Events for FileStore<F> {
    async fn append_events(&self, run_id: &str, events: &[NewEvent]) -> Result<u64, StoreError> {
        // Checked before the lock, as a save is: a value the parser would
        // refuse must never reach the file.
        steadfast_core::store::check_events(run_id, events)?;
        let (run_id, events) = (run_id.to_string(), events.to_vec());
        self.blocking(Some(&run_id.clone()), move |inner| {
            let room = inner.opts.max_file_bytes / EVENTS_SHARE;
            inner.update(&run_id, &[], |image| {
                let last = image.with(|data| data.append_events(&run_id, &events))?;
                // (Encoding cannot fail here; the file's encoding would
                // report it.)
                let used = serde_json::to_vec(&image.events).map_or(0, |v| v.len() as u64);
                if used > room {
                    return Err(StoreError::backend(
                        steadfast_core::StoreErrorKind::TooLarge,
                        format!(
                            "the event logs would take {used} bytes of the store file, over a quarter of its limit ({room} of {} bytes); delete or prune finished runs, or raise FileStoreOptions::max_file_bytes",
                            inner.opts.max_file_bytes
                        ),
                    ));
                }
                Ok((true, last))
            })
        })
        .await
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let run_id = run_id.to_string();
        self.blocking(None, move |inner| {
            let mut image = inner.read_image()?;
            image.with(|data| Ok(data.read_events(&run_id, after, limit)))
        })
        .await
    }
}

#[async_trait]
impl<F: Fs> History for FileStore<F> {
    async fn history(&self, run_id: &str) -> Result<Option<Vec<StepRecord>>, StoreError> {
        let run_id = run_id.to_string();
        self.blocking(None, move |inner| {
            inner.read_resolved(
                &run_id,
                |image| image.with(|data| Ok(data.history(&run_id))).ok().flatten(),
                |rows| {
                    rows.iter()
                        .any(|r| steadfast_core::store::blob::holds_marks(&r.update))
                },
                |rows, place, resolver| {
                    resolver.resolve_rows(rows, place, |i| format!("history[{i}].update"))
                },
            )
        })
        .await
    }
    async fn rewrite(
        &self,
        run_id: &str,
        expected: u64,
        rewrite: Rewrite<'_>,
    ) -> Result<(), StoreError> {
        let (run_id, writes) = (run_id.to_string(), run_id.to_string());
        let fold = rewrite.is_fold();
        // The rows as the file keeps them: large values as references.
        let mut blobs = Vec::new();
        let records = steadfast_core::store::blob::encode_rows(
            rewrite.records(),
            self.inner.opts.blob_threshold,
            &run_id,
            &mut blobs,
        )?;
        // The checked rewrite again, as records this thread owns.
        self.blocking(Some(&writes), move |inner| {
            inner.update(&run_id, &blobs, |image| {
                image.with(|data| {
                    let rewrite = match records.first() {
                        Some(first) if fold => Rewrite::fold(&run_id, first)?,
                        _ => Rewrite::replace(&run_id, &records)?,
                    };
                    data.rewrite(&run_id, expected, rewrite)
                })?;
                Ok((true, ()))
            })
        })
        .await
    }
}

#[async_trait]
impl<F: Fs> Blobs for FileStore<F> {
    async fn usage(&self, run_id: &str) -> Result<Option<Usage>, StoreError> {
        let run_id = run_id.to_string();
        self.blocking(None, move |inner| {
            let mut image = inner.read_image()?;
            image.with(|data| Ok(data.usage(&run_id)))
        })
        .await
    }

    fn threshold(&self) -> u64 {
        self.inner.opts.blob_threshold
    }

    /// The blob files in `PATH.blobs`, as they are on disk: those no record
    /// refers to any more (left by a writer that died, waiting for the next
    /// sweep) count too, until a write sweeps them.
    async fn blob_totals(&self) -> Result<BlobTotals, StoreError> {
        self.blocking(None, move |inner| inner.blob_files()).await
    }
}

/// Decodes `bytes` as the contents of a store file, as opening one does, and
/// returns the runs it holds. For the fuzz targets and their corpus replay;
/// not part of the supported API.
#[doc(hidden)]
pub fn decode_file_for_fuzzing(bytes: &[u8]) -> Result<Vec<Checkpoint>, StoreError> {
    let path = Path::new("fuzz.json");
    let mut image = Image::decode(bytes, path)?;
    // What decodes must encode and decode to the same runs.
    let again = Image::decode(&image.encode(path)?, path)?;
    assert_eq!(
        serde_json::to_value(&image.runs).ok(),
        serde_json::to_value(&again.runs).ok(),
        "a decoded file does not survive encode and decode"
    );
    assert_eq!(
        serde_json::to_value(&image.history).ok(),
        serde_json::to_value(&again.history).ok(),
        "a decoded file's history does not survive encode and decode"
    );
    Ok(image.runs.into_values().collect())
}
