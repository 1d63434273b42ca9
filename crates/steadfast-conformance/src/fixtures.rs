//! Workloads the stores' own tests share.

use serde_json::json;
use steadfast_core::{update, Step, Workflow};

/// A large value, the same for the same `k`: about `kb` KB of JSON text.
pub fn doc(k: usize, kb: usize) -> String {
    format!("{k:04}").repeat(kb * 256)
}

/// An agent that rereads documents: steps `s0`..`s{n-1}`, where step `i`
/// returns the shared document `i % 2` (100 KB) and a document of its own
/// (20 KB, the same for the same `run` and step).
pub fn rereading_agent(n: usize, run: usize) -> Workflow {
    let mut b = Workflow::builder("agent");
    for i in 0..n {
        b = b.push(Step::new(format!("s{i}"), move |_, _| async move {
            update(json!({
                format!("shared{}", i % 2): doc(i % 2, 100),
                format!("own{i}"): doc(1000 + run * 100 + i, 20),
                "i": i,
            }))
        }));
    }
    b.build().expect("a valid workflow")
}

/// Removes every blob file (a name of 64 hex digits) from a file store's
/// blob directory, behind the store's back, and says how many it removed:
/// the file store's [`TestStore::with_blob_loss`](crate::TestStore::with_blob_loss) hook.
pub fn remove_blob_files(dir: &std::path::Path) -> Result<u64, String> {
    let mut removed = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            std::fs::remove_file(entry.path())
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
            removed += 1;
        }
    }
    Ok(removed)
}
