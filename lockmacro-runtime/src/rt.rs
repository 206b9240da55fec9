//! What the caller's tokio runtime must offer.
//!
//! A locked call needs a tokio runtime with timers (its lease's deadline) and, against Redis,
//! sockets. Outside any runtime it gets a `LockError::Config`. A runtime built without the time
//! or IO driver is not probed for: tokio itself panics at the first timer or socket with a
//! message that names the builder call to add ("timers are disabled. Call `enable_time` on the
//! runtime builder"), as it does for every tokio library. Probing without that panic would mean
//! catching it and silencing the process's panic hook, which is the application's, not ours.
//! The public entry points document it under `# Panics`.

use tokio::runtime::{Handle, Id};

use crate::error::LockError;

/// A driver the caller's runtime must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Driver {
    Time,
    Io,
}

/// `Ok` when the current thread runs inside a tokio runtime; the runtime is expected to have
/// `driver` (tokio panics with a clear message when it does not).
pub(crate) fn require(driver: Driver) -> Result<(), LockError> {
    require_all(&[driver]).map(drop)
}

/// The current runtime's id, when the current thread runs inside a tokio runtime; the runtime
/// is expected to have every driver in `drivers`. One call asks tokio for its handle once: each
/// ask touches a count that every worker thread shares.
pub(crate) fn require_all(drivers: &[Driver]) -> Result<Id, LockError> {
    Handle::try_current()
        .map(|handle| handle.id())
        .map_err(|_| LockError::Config {
            message: format!(
                "lockmacro needs a tokio runtime with {}; call it from async code running on tokio",
                needs(drivers)
            ),
        })
}

/// "timers", "timers and IO": what the runtime builder must enable.
fn needs(drivers: &[Driver]) -> &'static str {
    match (
        drivers.contains(&Driver::Time),
        drivers.contains(&Driver::Io),
    ) {
        (true, true) => "timers and IO (`enable_all()`)",
        (false, true) => "IO (`enable_io()`)",
        _ => "timers (`enable_time()`)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_runtime_is_an_error_that_names_what_to_enable() {
        let message = require(Driver::Time).unwrap_err().to_string();
        assert!(message.contains("enable_time"), "{message}");
        let message = require_all(&[Driver::Time, Driver::Io])
            .unwrap_err()
            .to_string();
        assert!(message.contains("enable_all"), "{message}");
    }

    #[test]
    fn inside_a_runtime_is_ok_whatever_it_enables() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(runtime.block_on(async { require(Driver::Time) }).is_ok());
    }
}
