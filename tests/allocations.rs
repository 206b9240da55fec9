//! Heap allocations of an uncontended Redlock cycle (three masters), counted by a global
//! allocator: the acquire alone, and the whole cycle (acquire, release). Figures are printed
//! (`--no-capture`); the bounds are loose guards against a return of per-acquire allocations,
//! not measurements.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockOptions};
use testkit::Redlock;

/// Counts every allocation and reallocation, on every thread.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The sizes of the first allocations after [`record_sizes`], up to 64 of them.
static SIZES: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static RECORDED: AtomicUsize = AtomicUsize::new(usize::MAX);

fn note(layout: Layout) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let at = RECORDED.load(Ordering::Relaxed);
    if at < SIZES.len()
        && RECORDED
            .compare_exchange(at, at + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        SIZES[at].store(layout.size(), Ordering::Relaxed);
    }
}

/// Starts recording the sizes of allocations.
fn record_sizes() {
    RECORDED.store(0, Ordering::Relaxed);
}

/// The sizes recorded since [`record_sizes`], largest first; stops recording.
fn recorded_sizes() -> Vec<usize> {
    let recorded = RECORDED
        .swap(usize::MAX, Ordering::Relaxed)
        .min(SIZES.len());
    let mut sizes: Vec<usize> = SIZES[..recorded]
        .iter()
        .map(|size| size.load(Ordering::Relaxed))
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout);
        // SAFETY: as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout);
        // SAFETY: as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(Layout::from_size_align(new_size, layout.align()).unwrap_or(layout));
        // SAFETY: as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Allocations per Redlock acquire, and per acquire and release, averaged over 2 000 cycles
/// (after 200 to warm up). Everything the process allocates meanwhile counts: the client's
/// connection tasks and background work too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_cycle_allocations() {
    let quorum = Redlock::start(3);
    let locks = LockClient::redlock_builder(quorum.urls())
        .build()
        .await
        .unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let key = "alloc:redlock";
    for _ in 0..200 {
        locks
            .acquire(key, options)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // The sizes of one acquire's allocations (the largest is the acquire's boxed future).
    record_sizes();
    let lease = locks.acquire(key, options).await.unwrap();
    let sizes = recorded_sizes();
    lease.release().await.unwrap();
    eprintln!("one Redlock acquire allocated (bytes, largest first): {sizes:?}");
    const CYCLES: u64 = 2_000;
    let (mut acquiring, mut cycling) = (0, 0);
    for _ in 0..CYCLES {
        let before = allocations();
        let lease = locks.acquire(key, options).await.unwrap();
        let acquired = allocations();
        lease.release().await.unwrap();
        let released = allocations();
        acquiring += acquired - before;
        cycling += released - before;
    }
    let (per_acquire, per_cycle) = (
        acquiring as f64 / CYCLES as f64,
        cycling as f64 / CYCLES as f64,
    );
    eprintln!(
        "Redlock over 3 masters: {per_acquire:.1} allocations per acquire, {per_cycle:.1} per \
         acquire and release"
    );
    assert!(per_acquire < 200.0, "{per_acquire} allocations per acquire");
}
