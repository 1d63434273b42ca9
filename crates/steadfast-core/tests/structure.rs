//! The core's structure, held by a test rather than by intentions: its
//! modules are grouped in layers (the record, the store seam, the engine,
//! the operations), a module imports only its own layer and the layers
//! below it, and no import cycle joins two modules.
//!
//! Imports are read from the code as text: every `crate::…` path outside
//! comments and tests, with the crate root's re-exports followed to the
//! module that defines the item. The checker is tested on planted cycles
//! and upward imports, so that it can fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first.
const LAYERS: [&str; 4] = ["record", "store", "engine", "ops"];

/// One module: its path (`engine::session`, `engine` for `engine/mod.rs`)
/// and its code without comments or tests.
struct Module {
    path: String,
    code: String,
}

fn strip(text: &str) -> String {
    // Tests sit at the end of a file, after `#[cfg(test)]`.
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn read_modules(src: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src");
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.push(Module {
                path: parts.join("::"),
                code: strip(&text),
            });
        }
    }
    out
}

/// Every `crate::a::b::c` path in `code`, as its segments.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let segs: Vec<String> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

/// The crate root's re-exports: item name to the module it comes from.
fn reexports(root: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in root.split(';') {
        let Some(i) = stmt.find("pub use ") else {
            continue;
        };
        let spec = stmt[i + "pub use ".len()..].trim();
        let (base, items) = match spec.split_once("::{") {
            Some((base, items)) => (
                base.to_string(),
                items
                    .trim_end_matches('}')
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>(),
            ),
            None => match spec.rsplit_once("::") {
                Some((base, item)) => (base.to_string(), vec![item.to_string()]),
                None => continue,
            },
        };
        for item in items {
            out.insert(item, base.clone());
        }
    }
    out
}

/// The module a path names: the longest module path it starts with, after
/// following a re-export at the crate root.
fn resolve(
    segs: &[String],
    modules: &BTreeSet<String>,
    reexported: &BTreeMap<String, String>,
) -> Option<String> {
    let mut segs = segs.to_vec();
    if let Some(base) = segs.first().and_then(|s| reexported.get(s)) {
        let mut full: Vec<String> = base.split("::").map(String::from).collect();
        full.append(&mut segs);
        segs = full;
    }
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|p| modules.contains(p))
}

/// The import edges between modules (not counting a module's own).
fn edges(modules: &[Module]) -> BTreeSet<(String, String)> {
    let names: BTreeSet<String> = modules.iter().map(|m| m.path.clone()).collect();
    let root = modules
        .iter()
        .find(|m| m.path.is_empty())
        .map(|m| reexports(&m.code))
        .unwrap_or_default();
    let mut out = BTreeSet::new();
    for m in modules.iter().filter(|m| !m.path.is_empty()) {
        for segs in crate_paths(&m.code) {
            if let Some(to) = resolve(&segs, &names, &root) {
                if to != m.path && !to.is_empty() {
                    out.insert((m.path.clone(), to));
                }
            }
        }
    }
    out
}

/// The groups of modules that import each other in a circle.
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        graph.entry(a).or_default().push(b);
        graph.entry(b).or_default();
    }
    // Two modules are in one circle when each reaches the other.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for &next in graph.get(n).into_iter().flatten() {
                if seen.insert(next.to_string()) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<String>> = graph.keys().map(|&n| (n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for (&n, r) in &reached {
        if !r.contains(n) || out.iter().any(|c| c.iter().any(|m| m == n)) {
            continue;
        }
        let circle: Vec<String> = r
            .iter()
            .filter(|m| reached[m.as_str()].contains(n))
            .cloned()
            .collect();
        out.push(circle);
    }
    out
}

fn layer_of(path: &str) -> Option<usize> {
    let top = path.split("::").next()?;
    LAYERS.iter().position(|l| *l == top)
}

/// Imports from a lower layer up into a higher one.
fn upward(edges: &BTreeSet<(String, String)>) -> Vec<(String, String)> {
    edges
        .iter()
        .filter(|(a, b)| matches!((layer_of(a), layer_of(b)), (Some(x), Some(y)) if x < y))
        .cloned()
        .collect()
}

fn core() -> Vec<Module> {
    read_modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn every_core_module_belongs_to_a_layer() {
    let orphans: Vec<String> = core()
        .into_iter()
        .map(|m| m.path)
        .filter(|p| !p.is_empty() && layer_of(p).is_none())
        .collect();
    assert!(
        orphans.is_empty(),
        "modules outside the layers {LAYERS:?}: {orphans:?}"
    );
}

#[test]
fn core_modules_import_no_circle_and_no_higher_layer() {
    let modules = core();
    let found = edges(&modules);
    assert!(
        found.len() > 40,
        "only {} imports were read: the reader is broken",
        found.len()
    );
    let circles = cycles(&found);
    assert!(circles.is_empty(), "import cycles: {circles:?}");
    let up = upward(&found);
    assert!(up.is_empty(), "imports into a higher layer: {up:?}");
}

/// The negative controls: a cycle or an upward import planted in the real
/// sources is found, also when it goes through a re-export at the root.
#[test]
fn a_planted_cycle_or_upward_import_is_found() {
    let plant = |module: &str, line: &str| {
        let mut modules = core();
        let m = modules
            .iter_mut()
            .find(|m| m.path == module)
            .expect("the module to plant in");
        m.code.push_str(line);
        edges(&modules)
    };
    // The engine's runner imports an operation, which imports the runner.
    let planted = plant("engine", "\nuse crate::ops::prune;\n");
    let circles = cycles(&planted);
    assert!(
        circles
            .iter()
            .any(|c| c.contains(&"engine".to_string()) && c.contains(&"ops".to_string())),
        "{circles:?}"
    );
    assert!(upward(&planted).contains(&("engine".to_string(), "ops".to_string())));
    // The record reaches up to the worker through a root re-export.
    let planted = plant(
        "record::checkpoint",
        "\nfn f() { let _ = crate::Worker::new; }\n",
    );
    assert!(
        upward(&planted).contains(&("record::checkpoint".to_string(), "ops::worker".to_string())),
        "{:?}",
        upward(&planted)
    );
    // A cycle within one layer.
    let planted = plant(
        "engine::workflow",
        "\nuse crate::engine::session::Session;\n",
    );
    assert!(!cycles(&planted).is_empty(), "no cycle found");
}

#[test]
fn the_reader_sees_paths_and_skips_comments() {
    let code = strip("use crate::a::b; // crate::c::d\n/// crate::e\nlet x = crate::f::G;\n#[cfg(test)]\nuse crate::h;");
    let paths = crate_paths(&code);
    assert_eq!(
        paths,
        vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["f".to_string(), "G".to_string()]
        ]
    );
}
