//! What the caller's tokio runtime must offer, checked without panicking.
//!
//! Tokio panics when a timer or a socket is created on a runtime built without the time or IO
//! driver, and offers no way to ask first. A locked call needs timers (its lease's deadline) and,
//! against Redis, sockets: so each runtime is probed once, with the probe's panic caught and its
//! message kept off stderr, and a runtime that lacks a driver gets a `LockError::Config` instead.

use std::cell::Cell;
use std::sync::{Mutex, Once};

use tokio::runtime::{Handle, Id};

use crate::error::LockError;

/// A driver the caller's runtime must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Driver {
    Time,
    Io,
}

/// `Ok` when the current thread runs inside a tokio runtime that has `driver`.
pub(crate) fn require(driver: Driver) -> Result<(), LockError> {
    require_all(&[driver]).map(drop)
}

/// The current runtime's id, when the current thread runs inside a tokio runtime that has
/// every driver in `drivers`. One call asks tokio for its handle once: each ask touches a
/// count that every worker thread shares.
pub(crate) fn require_all(drivers: &[Driver]) -> Result<Id, LockError> {
    thread_local! {
        static LAST_CHECKED: Cell<[Option<Id>; 2]> = const { Cell::new([None, None]) };
    }
    let id = Handle::try_current()
        .map_err(|_| LockError::Config {
            message: "lockmacro needs a tokio runtime; call it from async code running on tokio"
                .into(),
        })?
        .id();
    let mut last = LAST_CHECKED.get();
    for &driver in drivers {
        let slot = driver as usize;
        if last[slot] != Some(id) {
            check(id, driver)?;
            last[slot] = Some(id);
        }
    }
    LAST_CHECKED.set(last);
    Ok(id)
}

/// `Ok` when runtime `id` has `driver`.
fn check(id: Id, driver: Driver) -> Result<(), LockError> {
    if !verdict(id, driver) {
        let builder_call = match driver {
            Driver::Time => "enable_time()",
            Driver::Io => "enable_io()",
        };
        return Err(LockError::Config {
            message: format!(
                "lockmacro needs a tokio runtime with {driver:?} enabled; add `.{builder_call}` (or `.enable_all()`) to the runtime builder"
            ),
        });
    }
    Ok(())
}

/// Whether runtime `id` has `driver`, probed once and remembered.
fn verdict(id: Id, driver: Driver) -> bool {
    /// Bounded: runtimes come and go (one per `#[tokio::test]`); old verdicts are dropped.
    const REMEMBERED: usize = 64;
    static VERDICTS: Mutex<Vec<(Id, Driver, bool)>> = Mutex::new(Vec::new());
    let mut verdicts = VERDICTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, _, has)) = verdicts.iter().find(|v| v.0 == id && v.1 == driver) {
        return has;
    }
    let has = probe(driver);
    if verdicts.len() >= REMEMBERED {
        verdicts.remove(0);
    }
    verdicts.push((id, driver, has));
    has
}

fn probe(driver: Driver) -> bool {
    quiet_panics(|| match driver {
        Driver::Time => drop(tokio::time::sleep(std::time::Duration::ZERO)),
        Driver::Io => {
            // Registering any socket with the runtime needs the IO driver.
            if let Ok(socket) = std::net::UdpSocket::bind(("127.0.0.1", 0))
                && socket.set_nonblocking(true).is_ok()
            {
                drop(tokio::net::UdpSocket::from_std(socket));
            }
        }
    })
}

thread_local! {
    static PROBING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `probe`, returning whether it finished without panicking. The panic hook is wrapped once
/// so that a probe's panic prints nothing; every other panic goes to the hook as before.
fn quiet_panics(probe: impl FnOnce()) -> bool {
    static WRAP_HOOK: Once = Once::new();
    WRAP_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !PROBING.get() {
                previous(info);
            }
        }));
    });
    PROBING.set(true);
    let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(probe)).is_ok();
    PROBING.set(false);
    finished
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_without_timers_is_an_error_not_a_panic() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let outcome = runtime.block_on(async { require(Driver::Time) });
        let message = outcome.unwrap_err().to_string();
        assert!(message.contains("enable_time"), "{message}");
        assert!(runtime.block_on(async { require(Driver::Io) }).is_ok());
    }

    #[test]
    fn a_runtime_without_io_is_an_error_not_a_panic() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        assert!(runtime.block_on(async { require(Driver::Io) }).is_err());
        assert!(runtime.block_on(async { require(Driver::Time) }).is_ok());
    }

    #[test]
    fn outside_a_runtime_is_an_error() {
        assert!(require(Driver::Time).is_err());
    }
}
