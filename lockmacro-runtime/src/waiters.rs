//! Waiting for a busy lock without polling: releases are announced on a per-key channel, and one
//! subscription per client, on the watchdog thread, wakes that client's waiters.
//!
//! A release wakes one waiter per client (FIFO, through [`Notify::notify_one`]), not all of
//! them, so a thousand waiters on one key do not stampede Redis. A waiter also sleeps no longer
//! than the holder's remaining lease (jittered), which covers a holder that died without
//! announcing anything, and a subscription lost with its connection.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};

use crate::backend::{Backend, ReleaseFeed};

pub(crate) struct WaitQueue {
    keys: Arc<Mutex<HashMap<String, Arc<KeyWaiters>>>>,
    commands: mpsc::UnboundedSender<Command>,
}

struct KeyWaiters {
    released: Notify,
    waiters: Mutex<usize>,
    /// Whether releases of this key are being heard right now.
    subscribed: watch::Sender<bool>,
}

enum Command {
    Watch(String),
    Unwatch(String),
}

/// One waiter's place in the queue of a key; leaving it (drop) unsubscribes the last one out.
pub(crate) struct Ticket<'a> {
    queue: &'a WaitQueue,
    key: String,
    waiters: Arc<KeyWaiters>,
}

impl WaitQueue {
    /// Starts the subscription task on the watchdog's runtime.
    pub(crate) fn start(backend: Arc<Backend>, background: &tokio::runtime::Handle) -> Self {
        let keys = Arc::new(Mutex::new(HashMap::new()));
        let (commands, received) = mpsc::unbounded_channel();
        background.spawn(listen(backend, keys.clone(), received));
        Self { keys, commands }
    }

    /// Joins the queue of `key`, subscribing to its releases if this is the first waiter.
    pub(crate) fn join(&self, key: &str) -> Ticket<'_> {
        let mut keys = lock(&self.keys);
        let waiters = keys
            .entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(KeyWaiters {
                    released: Notify::new(),
                    waiters: Mutex::new(0),
                    subscribed: watch::Sender::new(false),
                })
            })
            .clone();
        let first = {
            let mut count = lock(&waiters.waiters);
            *count += 1;
            *count == 1
        };
        drop(keys);
        if first {
            let _ = self.commands.send(Command::Watch(key.to_owned()));
        }
        Ticket {
            queue: self,
            key: key.to_owned(),
            waiters,
        }
    }
}

impl Ticket<'_> {
    /// Waits (at most `budget`) until releases of the key are heard, so none is missed after.
    pub(crate) async fn subscribed(&self, budget: Duration) {
        let mut subscribed = self.waiters.subscribed.subscribe();
        let _ = tokio::time::timeout(budget, subscribed.wait_for(|heard| *heard)).await;
    }

    /// Waits for a release of the key, or `fallback`, whichever comes first.
    pub(crate) async fn released_or(&self, fallback: Duration) {
        let _ = tokio::time::timeout(fallback, self.waiters.released.notified()).await;
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut keys = lock(&self.queue.keys);
        let mut count = lock(&self.waiters.waiters);
        *count -= 1;
        if *count == 0 {
            drop(count);
            if let Entry::Occupied(entry) = keys.entry(self.key.clone())
                && Arc::ptr_eq(entry.get(), &self.waiters)
            {
                entry.remove();
            }
            let _ = self.queue.commands.send(Command::Unwatch(self.key.clone()));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The subscription task: follows watch/unwatch commands and turns announcements into wake-ups.
async fn listen(
    backend: Arc<Backend>,
    keys: Arc<Mutex<HashMap<String, Arc<KeyWaiters>>>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut feed: Option<ReleaseFeed> = None;
    loop {
        let released = async {
            match feed.as_mut() {
                Some(feed) => feed.next_release().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                Some(Command::Watch(key)) => {
                    if feed.is_none() {
                        feed = reconnect(&backend, &keys).await;
                    }
                    let waiters = lock(&keys).get(&key).cloned();
                    // A reconnect just now has subscribed every waited-for key already.
                    if let (Some(live), Some(waiters)) = (feed.as_mut(), waiters)
                        && !*waiters.subscribed.borrow()
                    {
                        match live.watch(&key).await {
                            Ok(()) => { waiters.subscribed.send_replace(true); }
                            Err(failure) => {
                                tracing::debug!(key = %key, error = %failure, "cannot subscribe to releases; waiters fall back to the lease's remaining time");
                                feed = None;
                            }
                        }
                    }
                }
                Some(Command::Unwatch(key)) => {
                    if let Some(live) = feed.as_mut() && live.unwatch(&key).await.is_err() {
                        feed = None;
                    }
                }
                None => return,
            },
            key = released => match key {
                Some(key) => {
                    if let Some(waiters) = lock(&keys).get(&key) {
                        waiters.released.notify_one();
                    }
                }
                None => {
                    tracing::debug!("release subscription lost; resubscribing");
                    drop(feed.take());
                    for waiters in lock(&keys).values() {
                        waiters.subscribed.send_replace(false);
                        // Anyone waiting may have missed a release: let one of them look.
                        waiters.released.notify_one();
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    feed = reconnect(&backend, &keys).await;
                }
            },
        }
    }
}

/// Opens the subscription connection and subscribes every key that has waiters.
async fn reconnect(
    backend: &Backend,
    keys: &Mutex<HashMap<String, Arc<KeyWaiters>>>,
) -> Option<ReleaseFeed> {
    let mut feed = backend.release_feed().await.ok()?;
    let watched: Vec<(String, Arc<KeyWaiters>)> = lock(keys)
        .iter()
        .map(|(key, waiters)| (key.clone(), waiters.clone()))
        .collect();
    for (key, waiters) in watched {
        feed.watch(&key).await.ok()?;
        waiters.subscribed.send_replace(true);
    }
    Some(feed)
}
