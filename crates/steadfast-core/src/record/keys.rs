//! The state keys the engine writes itself, which steps and inputs may not
//! use: one list for the engine, the command line and the bindings.

/// The state key under which [`start`](crate::start) keeps a listed
/// workflow's input whole, so that a rewind or fork can rebuild the state
/// before a step that overwrote one of its values.
pub const START_KEY: &str = "__start";

/// The state key under which [`start`](crate::start) keeps a durable
/// function's input ([`DurableCtx::input`](crate::DurableCtx::input)).
pub const INPUT_KEY: &str = "__input";

/// The state key under which a durable function's result is saved.
pub const RESULT_KEY: &str = "__result";

/// The state key under which a run's waits record, per signal name, the
/// last signal they took ([`signal`](crate::signal)).
pub const SIGNALS_KEY: &str = "__signals";

/// The state key under which a child run keeps its parent: `{"run": ID,
/// "step": NAME, "created": TIME}` ([`DurableCtx::child`](crate::DurableCtx::child)).
pub const PARENT_KEY: &str = "__parent";

/// The state key under which a parent's child step records the id of the
/// child run whose result it took (each step's record keeps its own; the
/// state keeps the last).
pub const CHILD_KEY: &str = "__child";

/// Every state key the engine writes itself.
///
/// ```
/// assert!(steadfast_core::RESERVED_KEYS.contains(&"__start"));
/// ```
pub const RESERVED_KEYS: [&str; 7] = [
    START_KEY,
    INPUT_KEY,
    RESULT_KEY,
    SIGNALS_KEY,
    PARENT_KEY,
    CHILD_KEY,
    crate::record::spend::SPEND_KEY,
];
