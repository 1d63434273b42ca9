//! Numbered layouts: how a store that keeps its own tables (a SQLite file, a
//! PostgreSQL schema, the graph store's tables) decides what to do with a
//! layout it finds, so that every store refuses the same things with the
//! same words. Migration `i` of a list brings a layout from version `i` to
//! `i + 1`; applying them is the store's.

use crate::record::error::{StoreError, StoreErrorKind};

/// The migrations a layout at version `found` still lacks, with their
/// numbers (1-based), given this build's list `migrations`. A layout from a
/// newer build is [`StoreError::Unsupported`] ("upgrade Steadfast") and a
/// negative version [`StoreError::Corrupt`]: nothing is applied. `at` names
/// the layout in messages (`database runs.db`, `schema agents`).
pub fn pending<'a>(
    at: &str,
    found: i64,
    migrations: &'a [&'a str],
) -> Result<impl Iterator<Item = (usize, &'a str)> + 'a, StoreError> {
    check_version(at, found, migrations.len() as i64)?;
    let from = usize::try_from(found).unwrap_or(0);
    Ok(migrations
        .iter()
        .copied()
        .enumerate()
        .skip(from)
        .map(|(i, m)| (i + 1, m)))
}

/// Refuses a layout at version `found` that this build, which writes
/// `latest`, cannot read: one from a newer build, or a negative version.
pub fn check_version(at: &str, found: i64, latest: i64) -> Result<(), StoreError> {
    if found > latest {
        return Err(StoreError::Unsupported(format!(
            "{at} has version {found}, newer than this build understands ({latest}); upgrade Steadfast"
        )));
    }
    if found < 0 {
        return Err(StoreError::Corrupt {
            location: at.to_string(),
            reason: format!("its version {found} is negative"),
        });
    }
    Ok(())
}

/// The refusal of a file or schema that holds something else than a
/// Steadfast store (`why`): it is left as it was, and `hint` says what to
/// do instead.
pub fn not_ours(at: &str, why: &str, hint: &str) -> StoreError {
    StoreError::backend(
        StoreErrorKind::InvalidInput,
        format!("{at} is not a Steadfast store ({why}); it was left unchanged. {hint}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_missing_migrations_are_pending() {
        let all = ["one", "two", "three"];
        let left: Vec<_> = pending("schema s", 1, &all).unwrap().collect();
        assert_eq!(left, [(2, "two"), (3, "three")]);
        assert_eq!(pending("schema s", 3, &all).unwrap().count(), 0);
        let newer = pending("schema s", 4, &all).err().unwrap();
        assert_eq!(newer.kind(), StoreErrorKind::Unsupported);
        assert!(newer.to_string().contains("upgrade Steadfast"), "{newer}");
        assert_eq!(
            pending("schema s", -1, &all).err().unwrap().kind(),
            StoreErrorKind::Corrupt
        );
        let foreign = not_ours("x.db", "its tables are t", "Name another file.");
        assert!(foreign
            .to_string()
            .contains("x.db is not a Steadfast store (its tables are t)"));
    }
}
