//! Replays the checked-in fuzz corpus (`fuzz/corpus/TARGET/*`, the seeds and
//! every input a fuzzer found) through the fuzz targets, then feeds each
//! target seeded random mutations of its corpus: a short, deterministic smoke
//! run of what `scripts/fuzz.sh` does for hours with coverage guidance.

use std::path::PathBuf;

use steadfast_cli::fuzzing::TARGETS;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Byte-level mutations in the spirit of libFuzzer's: flip, insert, delete,
/// copy a span from another input, or cut.
fn mutate(rng: &mut fastrand::Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.usize(1..4) {
        match rng.u8(0..5) {
            0 if !out.is_empty() => {
                let i = rng.usize(0..out.len());
                out[i] ^= 1 << rng.u8(0..8);
            }
            1 => {
                let i = rng.usize(0..=out.len());
                let b = *rng
                    .choice(b"{}[]\",:0123456789.-eE\\ntfu\xff \n=#'".iter())
                    .unwrap();
                out.insert(i, b);
            }
            2 if !out.is_empty() => {
                let i = rng.usize(0..out.len());
                let n = rng.usize(1..=(out.len() - i).min(8));
                out.drain(i..i + n);
            }
            3 if !other.is_empty() => {
                let a = rng.usize(0..other.len());
                let b = rng.usize(a..=other.len());
                let i = rng.usize(0..=out.len());
                out.splice(i..i, other[a..b].iter().copied());
            }
            _ => out.truncate(rng.usize(0..=out.len())),
        }
    }
    out
}

#[test]
fn every_target_has_a_corpus_and_survives_it() {
    for (name, target) in TARGETS {
        let inputs = corpus(name);
        assert!(
            inputs.len() >= 3,
            "fuzz/corpus/{name} holds only {} inputs",
            inputs.len()
        );
        for (path, bytes) in &inputs {
            let result = std::panic::catch_unwind(|| target(bytes));
            assert!(result.is_ok(), "target {name} broke on {}", path.display());
        }
    }
}

#[test]
fn every_target_survives_random_mutations_of_its_corpus() {
    let per_target = if cfg!(debug_assertions) {
        1_500
    } else {
        20_000
    };
    for (name, target) in TARGETS {
        let inputs = corpus(name);
        let mut rng = fastrand::Rng::with_seed(0x5eed ^ name.len() as u64);
        for i in 0..per_target {
            let (_, a) = &inputs[rng.usize(0..inputs.len())];
            let (_, b) = &inputs[rng.usize(0..inputs.len())];
            let input = mutate(&mut rng, a, b);
            let result = std::panic::catch_unwind(|| target(&input));
            assert!(
                result.is_ok(),
                "target {name} broke on mutation {i}: {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}
