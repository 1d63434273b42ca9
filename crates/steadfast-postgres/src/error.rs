//! PostgreSQL errors mapped to the portable store error kinds, by SQLSTATE
//! (never by message text, which changes with the server's language).

use steadfast_core::{StoreError, StoreErrorKind};
use tokio_postgres::error::SqlState;

/// The kind a SQLSTATE stands for.
pub(crate) fn kind_of(code: &SqlState) -> StoreErrorKind {
    let c = code.code();
    match c {
        // unique_violation, serialization_failure, deadlock_detected: another
        // writer got there first.
        "23505" | "40001" | "40P01" => StoreErrorKind::Conflict,
        // program_limit_exceeded and its subclasses (a row or value too large).
        _ if c.starts_with("54") => StoreErrorKind::TooLarge,
        // data_corrupted, index_corrupted.
        "XX001" | "XX002" => StoreErrorKind::Corrupt,
        // invalid_schema_name, undefined_table, invalid_catalog_name.
        "3F000" | "42P01" | "3D000" => StoreErrorKind::NotFound,
        // data exceptions (a value the server cannot take) and integrity
        // violations other than the unique one.
        _ if c.starts_with("22") || c.starts_with("23") => StoreErrorKind::InvalidInput,
        // feature_not_supported.
        "0A000" => StoreErrorKind::Unsupported,
        // Connections, resources, operator intervention, system errors, and
        // everything else: try again later.
        _ => StoreErrorKind::Unavailable,
    }
}

/// Maps a driver error to a store error: by SQLSTATE when the server sent
/// one, else (a lost connection, a closed pool) as unavailable.
pub(crate) fn map_err(e: tokio_postgres::Error, context: &str) -> StoreError {
    let kind = e.code().map_or(StoreErrorKind::Unavailable, kind_of);
    let detail = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        // The driver's own words ("error performing TLS handshake") and
        // their cause ("invalid peer certificate: UnknownIssuer").
        None => steadfast_core::error_chain(&e),
    };
    if kind == StoreErrorKind::Corrupt {
        return StoreError::Corrupt {
            location: context.to_string(),
            reason: detail,
        };
    }
    StoreError::backend(kind, format!("{context}: {detail}"))
}

/// Maps the error of a write that met another writer of the same large
/// value: the server broke a deadlock (`40P01`), or a blob was removed under
/// a writer each time it looked (`23503`, refused by the foreign key). The
/// transaction was rolled back and nothing of it was written: unavailable,
/// to be tried again, never a version conflict or a refused value. Any other
/// error as [`map_err`] maps it.
pub(crate) fn race_is_transient(e: tokio_postgres::Error, context: &str) -> StoreError {
    match e.code().map(SqlState::code) {
        Some(code @ ("40P01" | "23503")) => StoreError::backend(
            StoreErrorKind::Unavailable,
            format!(
                "{context}: another writer of the same large value was in the way ({code}); nothing was written, try again"
            ),
        ),
        _ => map_err(e, context),
    }
}

/// Maps a pool error (no connection could be had).
pub(crate) fn pool_err(e: deadpool_postgres::PoolError, context: &str) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => map_err(e, context),
        other => StoreError::backend(StoreErrorKind::Unavailable, format!("{context}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_kinds() {
        let cases = [
            (SqlState::UNIQUE_VIOLATION, StoreErrorKind::Conflict),
            (
                SqlState::T_R_SERIALIZATION_FAILURE,
                StoreErrorKind::Conflict,
            ),
            (SqlState::T_R_DEADLOCK_DETECTED, StoreErrorKind::Conflict),
            (SqlState::PROGRAM_LIMIT_EXCEEDED, StoreErrorKind::TooLarge),
            (SqlState::DATA_CORRUPTED, StoreErrorKind::Corrupt),
            (SqlState::INVALID_SCHEMA_NAME, StoreErrorKind::NotFound),
            (
                SqlState::UNTRANSLATABLE_CHARACTER,
                StoreErrorKind::InvalidInput,
            ),
            (SqlState::DISK_FULL, StoreErrorKind::Unavailable),
            (SqlState::ADMIN_SHUTDOWN, StoreErrorKind::Unavailable),
            (SqlState::CONNECTION_FAILURE, StoreErrorKind::Unavailable),
            (SqlState::FEATURE_NOT_SUPPORTED, StoreErrorKind::Unsupported),
        ];
        for (code, kind) in cases {
            assert_eq!(kind_of(&code), kind, "{}", code.code());
        }
    }
}
