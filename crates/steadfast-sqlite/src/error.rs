//! SQLite errors mapped to the portable store error kinds, by result code.

use rusqlite::ErrorCode;
use steadfast_core::{StoreError, StoreErrorKind};

/// Maps a rusqlite error to a store error, by SQLite's result code.
pub(crate) fn map_err(e: rusqlite::Error, context: &str) -> StoreError {
    let kind = match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => StoreErrorKind::Corrupt,
            ErrorCode::TooBig => StoreErrorKind::TooLarge,
            ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied => {
                StoreErrorKind::Unavailable
            }
            _ => StoreErrorKind::Unavailable,
        },
        // A stored value of another type than the schema's, or out of range.
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Unavailable,
    };
    if kind == StoreErrorKind::Corrupt {
        return StoreError::Corrupt {
            location: context.to_string(),
            reason: e.to_string(),
        };
    }
    // SQLite's error and its cause say the same thing: keep one copy, in the
    // message, so that an error chain prints it once.
    StoreError::backend(kind, format!("{context}: {e}"))
}

/// Whether a failed COMMIT may nonetheless have made the transaction durable:
/// an I/O error can strike after the WAL frames were written.
pub(crate) fn commit_outcome_unknown(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, ErrorCode::SystemIoFailure | ErrorCode::DiskFull | ErrorCode::Unknown))
}
