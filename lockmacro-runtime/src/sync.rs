//! One way to take a std mutex here.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`'s guard, even after a holder panicked: every mutex here guards plain data that each
/// holder updates whole, so a panic elsewhere leaves nothing half-written to refuse.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
