"""Steadfast's exception classes.

Every error the engine raises is a :class:`SteadfastError`; the subclasses
match the Rust library's error variants and carry the same messages the
``steadfast`` command prints. :class:`TerminalError` is the one a step raises
itself, to fail at once without further attempts.
"""

from steadfast._native import (
    Cancelled,
    Conflict,
    Corrupt,
    Held,
    InvalidInput,
    InvalidRunId,
    InvalidValue,
    InvalidWorkflow,
    NoSuchRun,
    NotFound,
    NotWaiting,
    OutcomeUnknown,
    SteadfastError,
    StepFailed,
    StoreFailure,
    Suspended,
    TooLarge,
    Unavailable,
    Unsupported,
    WorkflowChanged,
)


class TerminalError(Exception):
    """Raise from a step to fail it for good: no retry, whatever its policy.

    Any other exception a step raises is retryable: the step is tried again
    until its attempts run out.
    """


__all__ = [
    "Cancelled",
    "Conflict",
    "Corrupt",
    "Held",
    "InvalidInput",
    "InvalidRunId",
    "InvalidValue",
    "InvalidWorkflow",
    "NoSuchRun",
    "NotFound",
    "NotWaiting",
    "OutcomeUnknown",
    "SteadfastError",
    "StepFailed",
    "StoreFailure",
    "Suspended",
    "TerminalError",
    "TooLarge",
    "Unavailable",
    "Unsupported",
    "WorkflowChanged",
]
