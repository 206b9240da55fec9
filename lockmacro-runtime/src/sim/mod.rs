//! Deterministic simulation (feature `sim`, for the project's own simulator): while a simulated
//! world is installed on this thread, every source of chance the runtime has is drawn from one
//! seed, so a seed replays exactly. Lock tokens, jitter, the wall clock (from a fixed instant on
//! tokio's paused clock; each client adds its own skew, [`crate::clock::Wall`]), the origin of
//! lease times, and the keys of hash maps whose order matters ([`Hashing`]).
//!
//! With no world installed, which is always the case outside [`run`], everything is as without
//! the feature: the hooks answer `None` and the callers take their usual path.
//!
//! Not covered here: the branch `tokio::select!` polls first is drawn from tokio's own thread
//! RNG, which only `--cfg tokio_unstable` (`Builder::rng_seed`) can seed.

use std::cell::RefCell;
use std::collections::hash_map::{DefaultHasher, RandomState};
use std::future::Future;
use std::hash::BuildHasher;

use tokio::time::Instant;

/// The wall clock of a simulation starts at 2026-01-01T00:00:00Z: any fixed instant would do.
const WALL_START_MS: u64 = 1_767_225_600_000;

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
}

/// What a simulated world draws from: one generator, and where its time began.
struct World {
    /// SplitMix64's state: small, and the same numbers on every platform and version.
    state: u64,
    /// Tokio's (paused) clock when the world began: lease times count from it.
    epoch: Instant,
}

impl World {
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn with<R>(f: impl FnOnce(&mut World) -> R) -> Option<R> {
    WORLD.with(|world| world.borrow_mut().as_mut().map(f))
}

/// Runs `scenario` in a simulated world drawn from `seed`: on a new current-thread tokio runtime
/// whose clock is paused (it advances only when every task waits on a timer), on this thread.
/// The world ends with the runtime, after every task left behind was dropped.
///
/// # Errors
/// When the runtime cannot be built (tokio's error).
pub fn run<F: Future>(seed: u64, scenario: impl FnOnce() -> F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let epoch = runtime.block_on(async { Instant::now() });
    let installed = Installed::new(World { state: seed, epoch });
    let output = runtime.block_on(scenario());
    drop(runtime);
    drop(installed);
    Ok(output)
}

/// The world of this thread, removed when dropped (a panicking scenario too).
struct Installed;

impl Installed {
    fn new(world: World) -> Self {
        WORLD.with(|slot| *slot.borrow_mut() = Some(world));
        Self
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        WORLD.with(|slot| *slot.borrow_mut() = None);
    }
}

/// A number drawn from the world's seed, for a scenario's own choices; outside a simulation, a
/// random one.
pub fn draw() -> u64 {
    with(World::next).unwrap_or_else(rand::random)
}

/// Whether a simulated world is installed on this thread.
pub(crate) fn installed() -> bool {
    WORLD.with(|world| world.borrow().is_some())
}

/// In a simulation, a fraction in `[0, 1)` drawn from the seed.
pub(crate) fn unit() -> Option<f64> {
    // The top 53 bits: every float in [0, 1) with that spacing, as `rand` makes them.
    with(|world| (world.next() >> 11) as f64 / (1u64 << 53) as f64)
}

/// In a simulation, a lock token drawn from the seed: 32 lowercase hex digits, as real ones.
pub(crate) fn token() -> Option<String> {
    with(|world| format!("{:016x}{:016x}", world.next(), world.next()))
}

/// In a simulation, when its time began.
pub(crate) fn epoch() -> Option<Instant> {
    with(|world| world.epoch)
}

/// In a simulation, the wall clock in µs since the Unix epoch: its fixed start plus the
/// simulated time gone by.
pub(crate) fn epoch_micros() -> Option<u64> {
    with(|world| {
        let gone = Instant::now().saturating_duration_since(world.epoch);
        let gone = u64::try_from(gone.as_micros()).unwrap_or(u64::MAX);
        (WALL_START_MS * 1000).saturating_add(gone)
    })
}

/// The hasher of the maps whose iteration order the runtime acts on (`crate::sync::Map`):
/// std's random keys, or fixed keys when made in a simulation, so that a seed replays.
#[derive(Clone, Debug)]
pub(crate) enum Hashing {
    Random(RandomState),
    Fixed,
}

impl Default for Hashing {
    fn default() -> Self {
        if installed() {
            Self::Fixed
        } else {
            Self::Random(RandomState::new())
        }
    }
}

impl BuildHasher for Hashing {
    type Hasher = DefaultHasher;

    fn build_hasher(&self) -> DefaultHasher {
        match self {
            Self::Random(keys) => keys.build_hasher(),
            Self::Fixed => DefaultHasher::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_seed_draws_the_same_numbers_and_nothing_is_drawn_outside_a_world() {
        let drawn = |seed| {
            run(seed, || async {
                let token = token().expect("in a world");
                assert!(crate::store::protocol::is_token(&token), "{token}");
                (draw(), token, unit().expect("in a world"))
            })
            .expect("a runtime")
        };
        assert_eq!(drawn(7), drawn(7));
        assert_ne!(drawn(7), drawn(8));
        assert!(!installed());
        assert_eq!(token(), None);
        assert_eq!(epoch_micros(), None);
    }

    #[test]
    fn the_wall_clock_follows_simulated_time() {
        run(1, || async {
            let start = epoch_micros().expect("in a world");
            assert_eq!(start, WALL_START_MS * 1000);
            tokio::time::sleep(Duration::from_secs(5)).await;
            assert_eq!(epoch_micros(), Some(start + 5_000_000));
        })
        .expect("a runtime");
    }
}
