//! One way to take a std mutex here, and the maps whose order the runtime acts on.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`'s guard, even after a holder panicked: every mutex here guards plain data that each
/// holder updates whole, so a panic elsewhere leaves nothing half-written to refuse.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A map whose iteration order the runtime acts on (which key to subscribe or wake first):
/// std's, with random keys; under a simulation, fixed keys, so that a seed replays. Made with
/// `Map::default()`.
#[cfg(not(feature = "sim"))]
pub(crate) type Map<K, V> = std::collections::HashMap<K, V>;
#[cfg(feature = "sim")]
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, crate::world::Hashing>;

/// A set, as [`Map`].
#[cfg(not(feature = "sim"))]
pub(crate) type Set<K> = std::collections::HashSet<K>;
#[cfg(feature = "sim")]
pub(crate) type Set<K> = std::collections::HashSet<K, crate::world::Hashing>;

/// `tokio::select!`, whose choice among branches ready at once is random. Under a simulation
/// the first ready branch in written order is taken instead (`biased;`), so that a seed
/// replays: tokio's choice could only be seeded with `--cfg tokio_unstable`
/// (`Builder::rng_seed`). Each branch must therefore be right whichever order it is taken in,
/// as with tokio's.
#[cfg(not(feature = "sim"))]
macro_rules! select {
    ($($branches:tt)*) => {
        tokio::select! { $($branches)* }
    };
}
#[cfg(feature = "sim")]
macro_rules! select {
    ($($branches:tt)*) => {
        if crate::world::installed() {
            tokio::select! { biased; $($branches)* }
        } else {
            tokio::select! { $($branches)* }
        }
    };
}
pub(crate) use select;
