//! The `axum` feature: [`LockError`](crate::LockError) as an HTTP response, and a live locks
//! page an application mounts under its own admin path and auth layer.
//!
//! - `LockError: IntoResponse`: 409 Conflict when busy (with `Retry-After` when the wait can be
//!   estimated), 500 for what needs someone to act (not [`is_transient`](crate::LockError::is_transient):
//!   a refused password or ACL, a misconfigured lock), 503 Service Unavailable otherwise (with
//!   `Retry-After`), as text.
//!   [`JsonLockError`] answers the same as JSON; [`LockErrorResponse`] gives the parts for a
//!   body of the application's own.
//! - [`locks_page`]: a `Router` listing the locks held, with their holders, time left, fencing
//!   token and waiters, refreshed in place, and a live view of one key streamed from
//!   [`LockClient::watch`](crate::LockClient::watch) as Server-Sent Events. Read-only unless
//!   the application enables [`force_release`](LocksPage::force_release).
//!
//! # The locks page
//!
//! Routes, relative to where the application nests [`LocksPage::router`] (with
//! `nest_service`, so that the page answers with and without a trailing slash):
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the page: the locks held (`?prefix=` filters), and the live view of `?watch=KEY` |
//! | `GET /table?prefix=` | the table with its counts, which the page's script fetches in place |
//! | `GET /events?key=` | [`LockClient::watch`](crate::LockClient::watch) as Server-Sent Events (`acquired`, `released`) |
//! | `POST /release` | a forced release, only when enabled |
//! | `GET /page.js`, `/page.css` | the page's own script and style: no build step, no framework |
//!
//! **Safe by default.** Read-only unless enabled; the page checks no credentials, so it goes
//! under the application's own auth layer. [`LocksPage::prefixes`] limits it to some locks,
//! whatever a request asks. Every key and holder is escaped, and the page's
//! `Content-Security-Policy` runs only its own script and forbids framing. A forced release
//! is a `POST` from the page itself: same origin (`Sec-Fetch-Site`, or `Origin` against
//! `Host`), carrying a token that must match the page's `HttpOnly`, `SameSite=Strict` cookie,
//! for the holder the confirmation named (if another holds the key by then, nothing is
//! released). The token is bound to the browser, not to a user: the page does not know the
//! application's users. Stateless, it works across instances behind a load balancer.
//!
//! **What an open page costs Redis.** The script refreshes the table every
//! [`refresh_every`](LocksPage::refresh_every) while its tab is visible (not at all while it
//! is hidden), and never sooner than 20 times the last listing took, so listing keeps Redis
//! busy at most 5% of the time per open page. A refresh is one listing:
//! `SCAN … COUNT 1000` steps through the keyspace until it ends or
//! [`list_budget`](LocksPage::list_budget) runs out, and one look per lock key the steps
//! return: every lock found is counted, the first [`limit`](LocksPage::limit) listed. The
//! counts read "at least" when the budget ran out first. A live view is one watch (a subscribed connection of its own, and a look every
//! [`WATCH_POLL`](crate::WATCH_POLL)), closed while its tab is hidden; at most
//! [`live_views`](LocksPage::live_views) are open at once. Its answers are gzipped for a
//! browser that accepts it (a table of 5 000 locks: 1.85 MB of HTML, 65 KB gzipped), its live
//! events not.

mod csrf;
mod escape;
mod page;
mod render;
mod response;

pub use page::{LocksPage, locks_page};
pub use response::{JsonLockError, LockErrorResponse, UNAVAILABLE_RETRY_AFTER};
