//! A bound on the requests one client has on the wire at once, that costs the usual call two
//! atomic operations.
//!
//! tokio's `Semaphore` would do, but returning its permit always takes the mutex of its wait
//! queue: two mutexes per lock cycle shared by every thread calling in, for a queue that is empty
//! unless a flood of callers arrives at once. Here a turn is a count taken with one atomic
//! compare-and-swap; only callers that find every turn out park, on a [`Notify`].

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// At most `limit` turns out at once; later callers wait for one to come back.
pub(super) struct Turns {
    limit: usize,
    taken: AtomicUsize,
    /// Callers parked for a turn: a returned turn wakes one only when there are any.
    parked: AtomicUsize,
    returned: Notify,
}

/// One turn, given back when dropped.
pub(super) struct Turn<'a>(&'a Turns);

impl Turns {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            taken: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            returned: Notify::new(),
        }
    }

    /// A turn, waiting for one to come back when all are out. Cancel safe: a caller dropped
    /// while parked holds nothing (a wake-up it swallowed is passed on by `Notify`).
    pub(super) async fn take(&self) -> Turn<'_> {
        if let Some(turn) = self.try_take() {
            return turn;
        }
        self.parked.fetch_add(1, Ordering::SeqCst);
        let _unpark = Unpark(&self.parked);
        loop {
            let returned = self.returned.notified();
            let mut returned = std::pin::pin!(returned);
            // Listening before looking again: a turn returned after the look wakes us.
            returned.as_mut().enable();
            if let Some(turn) = self.try_take() {
                return turn;
            }
            returned.await;
        }
    }

    /// A turn if one is free. Never counts past the limit, not even for a moment: a look that
    /// finds none free changes nothing, so only a turn given back wakes a parked caller.
    fn try_take(&self) -> Option<Turn<'_>> {
        // SeqCst, as `parked`: a caller that counted itself parked and then found every turn
        // out is seen as parked by whoever gives one back after that look.
        self.taken
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |taken| {
                (taken < self.limit).then_some(taken + 1)
            })
            .ok()
            .map(|_| Turn(self))
    }

    /// Turns out now.
    #[cfg(test)]
    fn out(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let turns = self.0;
        turns.taken.fetch_sub(1, Ordering::SeqCst);
        if turns.parked.load(Ordering::SeqCst) > 0 {
            turns.returned.notify_one();
        }
    }
}

/// Counts a parked caller out again, however it leaves.
struct Unpark<'a>(&'a AtomicUsize);

impl Drop for Unpark<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::Turns;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_more_than_the_limit_out_and_every_caller_served() {
        let turns = Arc::new(Turns::new(3));
        let (out, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let callers: Vec<_> = (0..200)
            .map(|_| {
                let (turns, out, most) = (turns.clone(), out.clone(), most.clone());
                tokio::spawn(async move {
                    let _turn = turns.take().await;
                    let now = out.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    out.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for caller in callers {
            tokio::time::timeout(Duration::from_secs(10), caller)
                .await
                .expect("every caller gets a turn")
                .expect("a caller");
        }
        assert!(most.load(Ordering::SeqCst) <= 3, "{most:?} out at once");
        assert_eq!(turns.out(), 0);
    }

    #[tokio::test]
    async fn a_caller_dropped_while_parked_takes_no_turn_with_it() {
        let turns = Turns::new(1);
        let first = turns.take().await;
        {
            let parked = turns.take();
            let parked = std::pin::pin!(parked);
            assert!(futures_util::poll!(parked).is_pending());
        }
        drop(first);
        let again = tokio::time::timeout(Duration::from_secs(1), turns.take()).await;
        assert!(again.is_ok(), "the turn came back");
        assert_eq!(turns.out(), 1);
    }
}
