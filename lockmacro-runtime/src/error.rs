//! The one error type of the crate: every way a locked call can end without running to completion.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// Why a locked call did not run, or did not run to its end.
///
/// A function under `#[redis_lock]` returns `Result<T, E>` with `E: From<LockError>`, so these
/// arrive in the caller's own error type. Every variant that concerns one lock names its key.
///
/// `Debug` leaves out what is not there (`Redis` without a key shows no `key: None`), so an
/// `Err` returned from `main` reads as the failure itself.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner holds the lock (and `wait`, if set, ran out). The work never ran.
    #[error("lock `{key}` is held by another owner")]
    Busy {
        /// The Redis key of the lock.
        key: String,
        /// How long a caller coming back now may wait, when known: the callers waiting ahead of
        /// it, each served in the time the key's waiters have lately been served, else the
        /// holder's remaining lease (on Redlock, until a majority of the masters would be
        /// free). A fair `Retry-After`. A call that fails fast learns it too, as does each
        /// look of a waiting call. `None` when it could not be read (the look failed).
        retry_after: Option<std::time::Duration>,
    },

    /// The lease was extended `max_renewals` times and its last lease ran out before the work
    /// finished, so the work was cancelled and the lock released.
    #[error(
        "lock `{key}` used all {renewals} renewals before the work finished; the work was cancelled"
    )]
    RenewalsExhausted {
        /// The Redis key of the lock.
        key: String,
        /// How many extensions were made.
        renewals: u32,
    },

    /// The lease ended under the work: the key was found taken by another owner or gone, or no
    /// extension was confirmed before the local deadline (Redis paused or unreachable), as
    /// `reason` says. The work was cancelled. Match it with `LockError::Lost { .. }`.
    #[error("lock `{key}` was lost before the work finished ({reason}); the work was cancelled")]
    Lost {
        /// The Redis key of the lock.
        key: String,
        /// What the lease's end was found to be.
        reason: LostReason,
    },

    /// Redis could not be reached, did not answer in time, or answered with an error. When this
    /// comes from acquiring, the work never ran.
    #[error("redis failed{}: {source}", for_key(key))]
    Redis {
        /// The Redis key of the lock, when the failure concerns one.
        key: Option<String>,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// Redlock: fewer than a majority of the masters answered (the others failed, timed out,
    /// or the answers split between free and busy), so the lock is neither taken nor known to
    /// be held by another owner. The work never ran; anything taken on a minority was undone.
    #[error(
        "lock `{key}`: only {answered} of the {needed} Redlock masters needed for a majority answered alike"
    )]
    NoQuorum {
        /// The Redis key of the lock.
        key: String,
        /// How many masters agreed on the largest answer.
        answered: usize,
        /// How many make a majority.
        needed: usize,
    },

    /// The client was shut down ([`LockClient::shutdown`](crate::LockClient::shutdown)): work
    /// held under it was cancelled and its lock released, and no lock is taken through it (or
    /// its clones) any more.
    #[error("lock `{key}`: the lock client was shut down; the work was not run or was cancelled")]
    ShutDown {
        /// The Redis key of the lock.
        key: String,
    },

    /// The lock's key holds something that is not a lock of this library (a string of another
    /// application, a hash without lockmacro's `kind` field, a list…). lockmacro never writes
    /// such a key: the work never ran, and the key is left as it was. Lock keys are
    /// `"{prefix}:{key}"`: choose a prefix no other data lives under.
    #[error(
        "lock `{key}` cannot be taken: the key holds {found}, not a lock of lockmacro, and is left as it is; use a prefix no other data lives under"
    )]
    NotALock {
        /// The Redis key of the lock.
        key: String,
        /// What the key holds instead (its type, never its contents).
        found: String,
    },

    /// The key rendered empty or longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN). Checked before any I/O.
    #[error("invalid lock key `{key}`: {reason}")]
    InvalidKey {
        /// The key as rendered (shortened when long).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The lock's options cannot be used: a `ttl` that is zero, shorter than
    /// [`MIN_TTL`](crate::MIN_TTL) or longer than [`MAX_TTL`](crate::MAX_TTL), a zero `wait` or
    /// `hold_at_least`, zero `permits` (see [`LockOptions`](crate::LockOptions)'s validation),
    /// fencing on Redlock, a reader asking for its own key's write lock. Checked before any
    /// I/O; the work never ran.
    #[error("invalid lock options: {message}")]
    InvalidOptions {
        /// What is wrong and how to fix it.
        message: String,
    },

    /// The client could not be configured: a malformed URL, an unsupported scheme, no tokio runtime.
    #[error("invalid lock client configuration: {message}")]
    Config {
        /// What is wrong, with any password redacted.
        message: String,
    },
}

/// Why a lease was lost ([`LockError::Lost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// An extension found the key held by another owner (another token, or a value of another
    /// kind): the lease had run out or was removed, and the key was taken again.
    Taken,
    /// An extension found the key gone, or no live hold of ours in it: it expired, was removed
    /// (`force_release`, `lockmacro release --force`, a `DEL`, a flush), or a restart or failover
    /// lost it.
    Gone,
    /// No extension was confirmed before the lease's local deadline: Redis was slow, paused or
    /// unreachable. Whether the key is still there is unknown; it expires with its lease.
    Unconfirmed,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Taken => "another owner holds it now",
            Self::Gone => "the key was gone: expired, force-released, deleted, or lost to a restart or failover",
            Self::Unconfirmed => {
                "no renewal was confirmed before the lease ran out: Redis was slow or unreachable"
            }
        })
    }
}

impl std::fmt::Debug for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy { key, retry_after } => {
                let mut debug = f.debug_struct("Busy");
                debug.field("key", key);
                if let Some(retry_after) = retry_after {
                    debug.field("retry_after", retry_after);
                }
                debug.finish()
            }
            Self::RenewalsExhausted { key, renewals } => f
                .debug_struct("RenewalsExhausted")
                .field("key", key)
                .field("renewals", renewals)
                .finish(),
            Self::Lost { key, reason } => f
                .debug_struct("Lost")
                .field("key", key)
                .field("reason", reason)
                .finish(),
            Self::Redis { key, source } => {
                let mut debug = f.debug_struct("Redis");
                if let Some(key) = key {
                    debug.field("key", key);
                }
                debug.field("source", source).finish()
            }
            Self::NoQuorum {
                key,
                answered,
                needed,
            } => f
                .debug_struct("NoQuorum")
                .field("key", key)
                .field("answered", answered)
                .field("needed", needed)
                .finish(),
            Self::ShutDown { key } => f.debug_struct("ShutDown").field("key", key).finish(),
            Self::NotALock { key, found } => f
                .debug_struct("NotALock")
                .field("key", key)
                .field("found", found)
                .finish(),
            Self::InvalidKey { key, reason } => f
                .debug_struct("InvalidKey")
                .field("key", key)
                .field("reason", reason)
                .finish(),
            Self::InvalidOptions { message } => f
                .debug_struct("InvalidOptions")
                .field("message", message)
                .finish(),
            Self::Config { message } => f.debug_struct("Config").field("message", message).finish(),
        }
    }
}

/// A store's failure as the `source` of a [`LockError::Redis`], with the store's verdict on
/// whether it heals, for [`LockError::is_transient`]: the store judges, this module knows none.
pub(crate) struct Shared {
    source: Arc<dyn Error + Send + Sync>,
    /// What the store judged of the failure when it made the error.
    healing: Option<Healing>,
}

impl Shared {
    pub(crate) fn new(source: Arc<dyn Error + Send + Sync>, healing: Option<Healing>) -> Self {
        Self { source, healing }
    }

    pub(crate) fn healing(&self) -> Option<Healing> {
        self.healing
    }
}

/// Why a failure may pass on its own: what a waiting call waits out, and how the metrics count
/// its looks made again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Healing {
    /// A connection lost, refused or reset, or no answer in time.
    Unreachable,
    /// A failover under way: `READONLY`, `MOVED`, `ASK`, `CLUSTERDOWN`, `TRYAGAIN`, `LOADING`,
    /// `MASTERDOWN`, or no master known to the sentinels.
    Failover,
    /// A grant no replica acknowledged in time (it was undone).
    Unacknowledged,
    /// A grant confirmed only after its lease's local deadline (its acknowledgement waited on a
    /// slow replica, say): the lease may have lapsed already, so its work does not start.
    Late,
    /// Fewer than a majority of Redlock's masters answered alike.
    NoQuorum,
}

impl Healing {
    /// The metrics label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::Failover => "failover",
            Self::Unacknowledged => "unacknowledged",
            Self::Late => "late",
            Self::NoQuorum => "no_quorum",
        }
    }
}

/// As the error it shares: the wrapper is no news to whoever reads the `Debug` output.
impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
}

impl Error for Shared {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.source()
    }
}

fn for_key(key: &Option<String>) -> String {
    key.as_deref()
        .map(|key| format!(" for lock `{key}`"))
        .unwrap_or_default()
}

impl LockError {
    /// Whether trying again later may succeed with nobody changing anything: the lock was
    /// busy or lost, Redis was unreachable, slow or in a failover, no Redlock majority
    /// answered, the client was shutting down. `false` for what needs someone to act: a
    /// refused password or ACL, a server that does not speak Redis's protocol, a script's
    /// error, a key that is not a lock, invalid options or configuration, renewals used up.
    ///
    /// The axum integration answers 503 for a transient failure and 500 for the rest; a
    /// waiting call waits out what is transient and ends at once on the rest.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Busy { .. }
            | Self::Lost { .. }
            | Self::NoQuorum { .. }
            | Self::ShutDown { .. } => true,
            Self::Redis { .. } => self.healing().is_some(),
            Self::RenewalsExhausted { .. }
            | Self::NotALock { .. }
            | Self::InvalidKey { .. }
            | Self::InvalidOptions { .. }
            | Self::Config { .. } => false,
        }
    }

    /// Why a failure to reach or hear from the deployment may pass on its own; `None` for
    /// every other error.
    pub(crate) fn healing(&self) -> Option<Healing> {
        match self {
            // What the store judged when it made the error; anything else is taken to heal.
            Self::Redis { source, .. } => source
                .downcast_ref::<Shared>()
                .map_or(Some(Healing::Unreachable), Shared::healing),
            Self::NoQuorum { .. } => Some(Healing::NoQuorum),
            _ => None,
        }
    }

    /// The Redis key this error concerns, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Busy { key, .. }
            | Self::RenewalsExhausted { key, .. }
            | Self::Lost { key, .. }
            | Self::InvalidKey { key, .. }
            | Self::NoQuorum { key, .. }
            | Self::NotALock { key, .. }
            | Self::ShutDown { key } => Some(key),
            Self::Redis { key, .. } => key.as_deref(),
            Self::Config { .. } | Self::InvalidOptions { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LockError;

    #[test]
    fn what_heals_is_transient_and_what_needs_someone_is_not() {
        use crate::store::{Refused, StoreError};
        let transient = |error: StoreError| error.into_lock_error(Some("k")).is_transient();
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(transient(StoreError::unavailable(
            ::redis::RedisError::from(reset)
        )));
        let readonly = ::redis::RedisError::from((
            ::redis::ErrorKind::Server(::redis::ServerErrorKind::ReadOnly),
            "READONLY You can't write against a read only replica.",
        ));
        assert!(transient(StoreError::unavailable(readonly)));
        assert!(transient(StoreError::NoQuorum {
            answered: 1,
            needed: 2
        }));
        let script = ::redis::RedisError::from((
            ::redis::ErrorKind::Server(::redis::ServerErrorKind::ResponseError),
            "ERR user_script:1: Script attempted to access nonexistent global variable",
        ));
        assert!(!transient(StoreError::unavailable(script)));
        let wrong_password = Refused::WrongPassword {
            server: "127.0.0.1:6379".into(),
            reason: "WRONGPASS".into(),
        };
        assert!(!transient(StoreError::unavailable(wrong_password)));
        assert!(
            !LockError::Config {
                message: "bad url".into()
            }
            .is_transient()
        );
        assert!(
            LockError::Busy {
                key: "k".into(),
                retry_after: None
            }
            .is_transient()
        );
    }

    #[test]
    fn debug_leaves_out_what_is_not_there() {
        let error = LockError::Redis {
            key: None,
            source: "connection refused".into(),
        };
        assert_eq!(
            format!("{error:?}"),
            r#"Redis { source: "connection refused" }"#
        );
        let error = LockError::Busy {
            key: "k".into(),
            retry_after: None,
        };
        assert_eq!(format!("{error:?}"), r#"Busy { key: "k" }"#);
    }
}
