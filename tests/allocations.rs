//! Heap allocations of an uncontended Redlock cycle (three masters), counted by a global
//! allocator: the acquire alone, and the whole cycle (acquire, release). Figures are printed
//! (`--no-capture`); the bounds are loose guards against a return of per-acquire allocations,
//! not measurements.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockOptions};
use testkit::Redlock;

/// Counts every allocation and reallocation, on every thread.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
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
            .acquire(key, options.clone())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    const CYCLES: u64 = 2_000;
    let (mut acquiring, mut cycling) = (0, 0);
    for _ in 0..CYCLES {
        let options = options.clone();
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
