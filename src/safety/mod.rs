//! The safety campaign (`scripts/safety.sh`): many workers lock and increment counters while a
//! nemesis injects faults on a schedule; the checker then reads what each worker and the fenced
//! storage saw, and holds the figures to what the contract promises.
//!
//! Jepsen's shape, small: [`history`] is what the workers log, [`checker`] counts overlapping
//! holders, stale fenced writes, lost updates, time a key stood free while someone waited, and
//! recovery after each fault, and [`promises`] says which of those figures must be zero where.
//! The runner and the nemesis are `src/bin/safety.rs`; the workers `src/bin/safety_worker.rs`.

pub mod checker;
pub mod history;
pub mod promises;

pub use checker::{Broken, Campaign, Phase, Row, broken, table_header, table_row};
pub use history::{
    Call, Caller, Outcome, WAITING_WAIT, begin_line, fenced_value, monotonic_ns, parse_fenced_value,
};
pub use promises::{
    Deployment, Fault, Promise, RIDES_OUT, WAKE_UP, WAKE_UP_BOUND, known_defect, promise,
};
