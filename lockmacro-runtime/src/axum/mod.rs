//! The `axum` feature: [`LockError`](crate::LockError) as an HTTP response, and a live locks
//! page an application mounts under its own admin path and auth layer.
//!
//! - `LockError: IntoResponse`: 409 Conflict when busy (with `Retry-After` when the holder's
//!   lease is known), 500 for the programmer's errors (`Config`, `InvalidKey`,
//!   `InvalidOptions`), 503 Service Unavailable otherwise (with `Retry-After`), as text.
//!   [`JsonLockError`] answers the same as JSON; [`LockErrorResponse`] gives the parts for a
//!   body of the application's own.
//! - [`locks_page`]: a `Router` listing the locks held, with their holders, time left, fencing
//!   token and waiters, refreshed in place, and a live view of one key streamed from
//!   [`LockClient::watch`](crate::LockClient::watch) as Server-Sent Events. Read-only unless
//!   the application enables [`force_release`](LocksPage::force_release).

mod csrf;
mod escape;
mod page;
mod render;
mod response;

pub use page::{LocksPage, locks_page};
pub use response::{JsonLockError, LockErrorResponse, UNAVAILABLE_RETRY_AFTER};
