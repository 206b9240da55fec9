//! The simulated world of this thread (feature `sim`): while one is installed, every source of
//! chance the runtime has is drawn from one seed, so a seed replays exactly. Lock tokens, jitter,
//! the wall clock (from a fixed instant on tokio's paused clock; each client adds its own skew,
//! [`crate::clock::Wall`]), the origin of lease times, and the keys of hash maps whose order
//! matters ([`Hashing`]).
//!
//! With no world installed, which is always the case outside [`run`], everything is as without
//! the feature: the hooks answer `None` and the callers take their usual path.
//!
//! The seams (`clock`, `sync`, the store's tokens) ask this module alone, which asks nothing of
//! the runtime: the simulator itself, with its network and its Redis node, is `crate::sim`.
//!
//! Beside the world's one generator, [`Stream`]s are derived from the seed and labels (a client,
//! a call), so that a scenario's draws for one part do not move when another part is removed:
//! a failing scenario can shrink. [`sometimes`] counts the rare states a run reached.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::collections::hash_map::{DefaultHasher, RandomState};
use std::future::Future;
use std::hash::BuildHasher;
use std::time::Duration;

use tokio::time::Instant;

/// The wall clock of a simulation starts at 2026-01-01T00:00:00Z: any fixed instant would do.
const WALL_START_MS: u64 = 1_767_225_600_000;

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
    /// How often each rare state was reached ([`sometimes`]), over every world run on this
    /// thread since [`take_coverage`].
    static COVERAGE: RefCell<BTreeMap<&'static str, u64>> = const { RefCell::new(BTreeMap::new()) };
}

/// What a simulated world draws from: one generator, and where its time began.
struct World {
    /// The seed it was made from: [`Stream`]s derive from it.
    seed: u64,
    /// SplitMix64's state: small, and the same numbers on every platform and version.
    state: u64,
    /// Tokio's (paused) clock when the world began: lease times count from it.
    epoch: Instant,
}

impl World {
    fn next(&mut self) -> u64 {
        splitmix(&mut self.state)
    }
}

/// SplitMix64's step: the next number, advancing `state`.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A generator of its own for one part of a world (a client, a call, a link), derived from the
/// seed and the part's labels: what one part draws does not depend on what the others drew.
#[derive(Debug, Clone)]
pub struct Stream {
    state: u64,
}

impl Stream {
    /// The stream of `labels` under `seed`.
    pub fn of(seed: u64, labels: &[u64]) -> Self {
        let mut state = seed;
        for label in labels {
            let mut mixed = state ^ label.wrapping_mul(0xd6e8_feb8_6659_fd93);
            state = splitmix(&mut mixed);
        }
        Self { state }
    }

    /// A stream below this one: the same labels with `label` added.
    pub fn child(&self, label: u64) -> Self {
        Self::of(self.state, &[label])
    }

    /// The next number of the stream.
    pub fn number(&mut self) -> u64 {
        splitmix(&mut self.state)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.number() % n }
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// `true` about `percent` times in a hundred.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Whole milliseconds in `low..=high`.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.between(low, high))
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
    let installed = Installed::new(World {
        seed,
        state: seed,
        epoch,
    });
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

/// The stream of `labels` under the seed of this thread's world (seed 0 outside one).
pub fn stream(labels: &[u64]) -> Stream {
    Stream::of(with(|world| world.seed).unwrap_or_default(), labels)
}

/// Counts a rare state reached (`name` says which), while a world runs; nothing otherwise. A
/// fixed set of seeds is meant to reach each one.
pub fn sometimes(name: &'static str) {
    if installed() {
        COVERAGE.with(|counts| *counts.borrow_mut().entry(name).or_default() += 1);
    }
}

/// [`sometimes`] when `reached`: one line at a call site in the engine.
pub(crate) fn sometimes_if(reached: bool, name: &'static str) {
    if reached {
        sometimes(name);
    }
}

/// How often each rare state was reached on this thread since the last call, by name.
pub fn take_coverage() -> BTreeMap<&'static str, u64> {
    COVERAGE.with(|counts| std::mem::take(&mut *counts.borrow_mut()))
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
