//! A simulated disk for the file store: it keeps what has been made durable apart
//! from what is only visible, so a test can "pull the plug" at any point and see
//! every state the disk could come back in. It can also fail chosen operations.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steadfast::file::{Fs, LockGuard, WriteError};

#[derive(Clone, Debug, Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Clone, Debug)]
enum DirOp {
    Link(PathBuf, usize),
    Unlink(PathBuf),
}

/// The disk at one instant.
#[derive(Clone, Debug, Default)]
pub struct Disk {
    inodes: Vec<Inode>,
    live: BTreeMap<PathBuf, usize>,
    durable: BTreeMap<PathBuf, usize>,
    /// Directory changes since the last directory sync, in order.
    pending: Vec<DirOp>,
}

/// What a crash leaves: the file contents by name.
pub type CrashImage = BTreeMap<PathBuf, Vec<u8>>;

impl Disk {
    /// A disk whose durable and visible contents are `image`.
    pub fn from_image(image: &CrashImage) -> Disk {
        let mut d = Disk::default();
        for (p, bytes) in image {
            d.inodes.push(Inode {
                live: bytes.clone(),
                durable: bytes.clone(),
            });
            d.live.insert(p.clone(), d.inodes.len() - 1);
        }
        d.durable = d.live.clone();
        d
    }

    /// Every state a power loss now could leave: any subset (up to 3) of the
    /// directory changes not yet synced, applied in order, combined with unsynced
    /// file data lost, kept, or torn after 512 bytes.
    pub fn crash_images(&self) -> Vec<CrashImage> {
        let n = self.pending.len();
        let mut subsets: Vec<Vec<usize>> = vec![vec![]];
        for a in 0..n {
            subsets.push(vec![a]);
            for b in a + 1..n {
                subsets.push(vec![a, b]);
                for c in b + 1..n {
                    subsets.push(vec![a, b, c]);
                }
            }
        }
        if n > 3 {
            subsets.push((0..n).collect());
        }
        let mut out = Vec::new();
        for subset in subsets {
            let mut dir = self.durable.clone();
            for &i in &subset {
                match &self.pending[i] {
                    DirOp::Link(p, ino) => {
                        dir.insert(p.clone(), *ino);
                    }
                    DirOp::Unlink(p) => {
                        dir.remove(p);
                    }
                }
            }
            for data in [DataFate::Lost, DataFate::Kept, DataFate::Torn] {
                out.push(
                    dir.iter()
                        .map(|(p, &ino)| {
                            let inode = &self.inodes[ino];
                            let bytes = if inode.live == inode.durable {
                                inode.durable.clone()
                            } else {
                                match data {
                                    DataFate::Lost => inode.durable.clone(),
                                    DataFate::Kept => inode.live.clone(),
                                    DataFate::Torn => {
                                        inode.live[..inode.live.len().min(512)].to_vec()
                                    }
                                }
                            };
                            (p.clone(), bytes)
                        })
                        .collect(),
                );
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

#[derive(Clone, Copy)]
enum DataFate {
    Lost,
    Kept,
    Torn,
}

/// Which operation to fail, and on which call of it (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Write,
    SyncFile,
    Rename,
    SyncDir,
}

/// A snapshot taken before a mutating operation, with the number of saves the
/// store had acknowledged by then.
pub struct Snapshot {
    pub disk: Disk,
    pub acked: usize,
}

#[derive(Default)]
struct Inner {
    disk: Disk,
    snapshots: Vec<Snapshot>,
    record: bool,
    fail: Option<(Op, usize)>,
    calls: BTreeMap<&'static str, usize>,
    /// Directories made with `create_dir`.
    dirs: std::collections::BTreeSet<PathBuf>,
}

/// The simulated file system. Clones share one disk.
#[derive(Clone, Default)]
pub struct SimFs {
    inner: Arc<Mutex<Inner>>,
    /// Saves acknowledged so far; the test's store wrapper counts them.
    pub acked: Arc<AtomicUsize>,
}

impl SimFs {
    /// A disk holding `image`, durable.
    pub fn with_image(image: &CrashImage) -> SimFs {
        let fs = SimFs::default();
        fs.inner.lock().unwrap().disk = Disk::from_image(image);
        fs
    }

    /// Records a snapshot before every mutating operation from now on.
    pub fn record_snapshots(&self) {
        self.inner.lock().unwrap().record = true;
    }

    /// Records a snapshot of the disk as it is now.
    pub fn snapshot_now(&self) {
        let mut g = self.inner.lock().unwrap();
        let snap = Snapshot {
            disk: g.disk.clone(),
            acked: self.acked.load(Ordering::SeqCst),
        };
        g.snapshots.push(snap);
    }

    /// The snapshots recorded so far.
    pub fn take_snapshots(&self) -> Vec<Snapshot> {
        std::mem::take(&mut self.inner.lock().unwrap().snapshots)
    }

    /// Makes call number `nth` (1-based) of `op` fail with EIO.
    pub fn fail(&self, op: Op, nth: usize) {
        self.inner.lock().unwrap().fail = Some((op, nth));
    }

    /// Stops failing.
    pub fn heal(&self) {
        self.inner.lock().unwrap().fail = None;
    }

    /// The visible bytes of `path`.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let g = self.inner.lock().unwrap();
        g.disk
            .live
            .get(path)
            .map(|&ino| g.disk.inodes[ino].live.clone())
    }

    /// The paths of every file visible.
    pub fn names(&self) -> Vec<PathBuf> {
        self.inner
            .lock()
            .unwrap()
            .disk
            .live
            .keys()
            .cloned()
            .collect()
    }

    fn begin(&self, op: Option<Op>) -> Result<std::sync::MutexGuard<'_, Inner>, io::Error> {
        let mut g = self.inner.lock().unwrap();
        if g.record {
            let snap = Snapshot {
                disk: g.disk.clone(),
                acked: self.acked.load(Ordering::SeqCst),
            };
            g.snapshots.push(snap);
        }
        if let Some(op) = op {
            let key = match op {
                Op::Write => "write",
                Op::SyncFile => "sync_file",
                Op::Rename => "rename",
                Op::SyncDir => "sync_dir",
            };
            let n = {
                let c = g.calls.entry(key).or_default();
                *c += 1;
                *c
            };
            if g.fail == Some((op, n)) {
                return Err(io::Error::other(format!("injected EIO on {key} call {n}")));
            }
        }
        Ok(g)
    }
}

impl Fs for SimFs {
    fn resolve(&self, path: &Path, _create: bool) -> Result<PathBuf, steadfast::StoreError> {
        // A simulated disk has no owners, modes or links to check.
        Ok(path.to_path_buf())
    }

    fn read(&self, path: &Path, _limit: u64) -> io::Result<Vec<u8>> {
        let g = self.inner.lock().unwrap();
        match g.disk.live.get(path) {
            Some(&ino) => Ok(g.disk.inodes[ino].live.clone()),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn write_new(&self, path: &Path, data: &[u8], sync: bool) -> Result<(), WriteError> {
        let mut g = self.begin(Some(Op::Write)).map_err(WriteError::Write)?;
        if g.disk.live.contains_key(path) {
            return Err(WriteError::Write(io::Error::from(
                io::ErrorKind::AlreadyExists,
            )));
        }
        g.disk.inodes.push(Inode {
            live: data.to_vec(),
            durable: Vec::new(),
        });
        let ino = g.disk.inodes.len() - 1;
        g.disk.live.insert(path.to_path_buf(), ino);
        g.disk.pending.push(DirOp::Link(path.to_path_buf(), ino));
        drop(g);
        if sync {
            let mut g = self.begin(Some(Op::SyncFile)).map_err(WriteError::Sync)?;
            let inode = &mut g.disk.inodes[ino];
            inode.durable = inode.live.clone();
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut g = self.begin(Some(Op::Rename))?;
        let ino = g
            .disk
            .live
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        g.disk.live.insert(to.to_path_buf(), ino);
        g.disk.pending.push(DirOp::Link(to.to_path_buf(), ino));
        g.disk.pending.push(DirOp::Unlink(from.to_path_buf()));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // The changes of that directory become durable, in order; those of
        // others (the blob directory beside the store's) stay pending.
        let mut g = self.begin(Some(Op::SyncDir))?;
        let pending = std::mem::take(&mut g.disk.pending);
        for op in pending {
            let path = match &op {
                DirOp::Link(p, _) | DirOp::Unlink(p) => p.clone(),
            };
            if path.parent() != Some(dir) {
                g.disk.pending.push(op);
                continue;
            }
            match op {
                DirOp::Link(p, ino) => {
                    g.disk.durable.insert(p, ino);
                }
                DirOp::Unlink(p) => {
                    g.disk.durable.remove(&p);
                }
            }
        }
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        // Directories are otherwise implicit in the paths of this disk: one
        // made here lists (empty) from now on.
        self.inner.lock().unwrap().dirs.insert(path.to_path_buf());
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut g = self.begin(None)?;
        g.disk
            .live
            .remove(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        g.disk.pending.push(DirOp::Unlink(path.to_path_buf()));
        Ok(())
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let g = self.inner.lock().unwrap();
        match g.disk.live.get(path) {
            Some(&ino) => Ok(g.disk.inodes[ino].live.len() as u64),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let g = self.inner.lock().unwrap();
        let names: Vec<String> = g
            .disk
            .live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        // The store's own directory always exists; another only once made
        // or holding a file.
        if names.is_empty() && dir != Path::new("/sim") && !g.dirs.contains(dir) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(names)
    }

    fn lock(&self, _path: &Path, _timeout: Duration) -> io::Result<LockGuard> {
        // One process: the store's own mutex already serializes writers.
        Ok(Box::new(()))
    }
}
