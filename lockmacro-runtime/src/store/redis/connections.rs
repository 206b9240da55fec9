//! One connection per tokio runtime, opened once however many callers ask at the same time.
//!
//! A multiplexed connection's driver task lives on the runtime that opened it and dies with it,
//! so each runtime that calls in gets its own: the hot path stays on the caller's runtime (no hop
//! to another thread), and the client's own background runtime is just one more caller.
//!
//! Opening is single-flight per runtime (concurrent first callers wait for one attempt), and a
//! failed attempt backs off with jitter: until the pause is over, callers fail at once with the
//! last error instead of each opening a socket, so an outage costs a handful of connection
//! attempts a second, not thousands.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::Id;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::clock::Backoff;
use crate::rt::{self, Driver};
use crate::store::StoreError;

/// Connections of type `C`, one per runtime.
pub(crate) struct PerRuntime<C> {
    slots: Mutex<Vec<Slot<C>>>,
}

struct Slot<C> {
    runtime: Id,
    /// Closed once the runtime is gone: a task on that runtime holds the receiver.
    runtime_alive: oneshot::Sender<()>,
    /// Held while a connection is being opened, so only one caller opens it.
    opening: Arc<tokio::sync::Mutex<()>>,
    live: Option<(C, u64)>,
    backoff: Backoff,
    /// After a failed attempt: no new attempt before this, callers get `last_error`.
    retry_at: Option<Instant>,
    last_error: Option<StoreError>,
}

/// A connection lent for one call, with the generation to invalidate if it proves broken.
#[derive(Clone)]
pub(crate) struct Lent<C> {
    pub(crate) connection: C,
    pub(crate) generation: u64,
}

impl<C: Clone> PerRuntime<C> {
    pub(crate) fn new() -> Self {
        Self {
            slots: Mutex::new(Vec::new()),
        }
    }

    /// The current runtime's connection, opened with `open` when there is none. `open` bounds
    /// itself (by the connect timeout) and names the server in its errors.
    pub(crate) async fn lend<F, Fut>(&self, open: F) -> Result<Lent<C>, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, StoreError>>,
    {
        let runtime = rt::require_all(&[Driver::Time, Driver::Io])?;
        let opening = match self.ready(runtime)? {
            Ready::Lent(lent) => return Ok(lent),
            Ready::Open(opening) => opening,
        };
        let _turn = opening.lock().await;
        // Whoever held the turn before may have opened it, or failed and set a pause.
        if let Ready::Lent(lent) = self.ready(runtime)? {
            return Ok(lent);
        }
        // Boxed: opening is rare and its future large; inline, every call's future would be as
        // large (copied on each request, connection open or not).
        let opened = Box::pin(open()).await;
        let mut slots = self.lock();
        let Some(slot) = slots.iter_mut().find(|slot| slot.runtime == runtime) else {
            // The runtime went away meanwhile; lend the connection for this one call.
            return opened.map(|connection| Lent {
                connection,
                generation: u64::MAX,
            });
        };
        match opened {
            Ok(connection) => {
                static GENERATION: AtomicU64 = AtomicU64::new(0);
                let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
                slot.live = Some((connection.clone(), generation));
                slot.backoff.reset();
                slot.retry_at = None;
                slot.last_error = None;
                Ok(Lent {
                    connection,
                    generation,
                })
            }
            Err(error) => {
                let pause = slot.backoff.next_delay();
                slot.retry_at = Some(Instant::now() + pause);
                slot.last_error = Some(error.clone());
                tracing::debug!(error = %error, retry_in = ?pause, "cannot connect to redis");
                Err(error)
            }
        }
    }

    /// The live connection, a pause's error, or the turn to open one.
    fn ready(&self, runtime: Id) -> Result<Ready<C>, StoreError> {
        let mut slots = self.lock();
        // The usual case first: this runtime (alive, since it runs us) has its connection.
        if let Some((connection, generation)) = slots
            .iter()
            .find(|slot| slot.runtime == runtime)
            .and_then(|slot| slot.live.as_ref())
        {
            return Ok(Ready::Lent(Lent {
                connection: connection.clone(),
                generation: *generation,
            }));
        }
        slots.retain(|slot| !slot.runtime_alive.is_closed());
        let slot = match slots.iter().position(|slot| slot.runtime == runtime) {
            Some(index) => &mut slots[index],
            None => {
                let (runtime_alive, dropped_with_runtime) = oneshot::channel::<()>();
                // Ends when the runtime shuts down (closing `runtime_alive`) or the slot goes.
                tokio::spawn(async move {
                    let _ = dropped_with_runtime.await;
                });
                slots.push(Slot {
                    runtime,
                    runtime_alive,
                    opening: Arc::default(),
                    live: None,
                    backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
                    retry_at: None,
                    last_error: None,
                });
                slots.last_mut().expect("just pushed")
            }
        };
        if let (Some(retry_at), Some(error)) = (slot.retry_at, &slot.last_error)
            && Instant::now() < retry_at
        {
            return Err(error.clone());
        }
        Ok(Ready::Open(slot.opening.clone()))
    }

    /// Never lends the connection of `generation` again: it proved broken or out of step.
    pub(crate) fn invalidate(&self, generation: u64) {
        for slot in self.lock().iter_mut() {
            if slot.live.as_ref().is_some_and(|(_, g)| *g == generation) {
                slot.live = None;
            }
        }
    }

    /// The server answers again (a probe heard it): every runtime may open its connection at
    /// once rather than sit out its pause after the last failure.
    pub(crate) fn retry_now(&self) {
        for slot in self.lock().iter_mut() {
            slot.retry_at = None;
        }
    }

    /// Drops every connection, e.g. when the server behind them is no longer the master.
    pub(crate) fn invalidate_all(&self) {
        for slot in self.lock().iter_mut() {
            slot.live = None;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot<C>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

enum Ready<C> {
    Lent(Lent<C>),
    Open(Arc<tokio::sync::Mutex<()>>),
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Opens with `outcome`, counting the attempts.
    async fn open(
        connections: &PerRuntime<u32>,
        attempts: &AtomicUsize,
        outcome: Result<u32, &str>,
    ) -> Result<u32, StoreError> {
        let lent = connections.lend(|| async {
            attempts.fetch_add(1, Ordering::SeqCst);
            outcome.map_err(|why| StoreError::unavailable(why.to_owned()))
        });
        lent.await.map(|lent| lent.connection)
    }

    // Paused time: the pause (75 ms or more) cannot run out between the two opens.
    #[tokio::test(start_paused = true)]
    async fn a_failed_open_is_sat_out_until_the_server_is_known_to_answer_again() {
        let (connections, attempts) = (PerRuntime::new(), AtomicUsize::new(0));
        assert!(open(&connections, &attempts, Err("refused")).await.is_err());
        // Within the pause the last error comes back without a new attempt.
        let again = open(&connections, &attempts, Ok(7)).await;
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
        assert!(again.unwrap_err().to_string().contains("refused"));
        // A sign that it answers (a probe, a master switched) ends the pause.
        connections.retry_now();
        assert_eq!(open(&connections, &attempts, Ok(7)).await.unwrap(), 7);
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }
}
