//! The `#[redis_lock]` attribute. Use it through `lockmacro-runtime`, which re-exports it and
//! holds everything the generated code calls.
//!
//! The attribute is built in three named stages: `attr` reads the arguments, `valid` checks
//! the function, `expand` writes the locked function.

mod attr;
mod expand;
mod valid;

use proc_macro::TokenStream;

/// Runs an `async fn` only while this process holds a Redis lock, keeps the lock's lease alive
/// while the function runs, and releases the lock on every exit path.
///
/// ```
/// use std::time::Duration;
///
/// use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions, redis_lock};
///
/// #[derive(Debug, thiserror::Error)]
/// enum AppError {
///     #[error(transparent)]
///     Lock(#[from] LockError), // what `#[redis_lock]` needs: `AppError: From<LockError>`
///     #[error("user {0} has no book")]
///     NoBook(u64),
/// }
///
/// struct Library {
///     locks: LockClient,
/// }
///
/// impl Library {
///     #[redis_lock(prefix = "Business1", key = user_id, client = self.locks, ttl = 3, max_renewals = 3)]
///     async fn borrow_book(&self, user_id: u64) -> Result<String, AppError> {
///         // Runs only while this process holds key "Business1:<user_id>".
///         if user_id == 0 {
///             return Err(AppError::NoBook(user_id));
///         }
///         let lock = LockContext::current().expect("inside a locked call");
///         assert_eq!(lock.key(), format!("Business1:{user_id}"));
///         tokio::time::sleep(Duration::from_secs(5)).await; // renewed while it runs
///         Ok(format!("a book for user {user_id}"))
///     }
/// }
///
/// #[tokio::main(flavor = "current_thread", start_paused = true)]
/// async fn main() {
///     // In memory (feature `test-util`), so this example runs without Redis; in production,
///     // `LockClient::builder("redis://127.0.0.1:6379").build().await?`.
///     let library = Library { locks: LockClient::in_memory() };
///     assert_eq!(library.borrow_book(1024).await.unwrap(), "a book for user 1024");
///     assert!(matches!(library.borrow_book(0).await, Err(AppError::NoBook(0))));
///
///     // While another process holds the key, a call fails fast without running its body.
///     let other_process = library.locks.memory_hooks().expect("in memory").client();
///     let held = other_process.acquire("Business1:1024", LockOptions::new()).await.unwrap();
///     let busy = library.borrow_book(1024).await;
///     assert!(matches!(busy, Err(AppError::Lock(LockError::Busy { .. }))));
///     held.release().await.unwrap();
/// }
/// ```
///
/// # Arguments
///
/// In any order, each at most once. `prefix` is required; every other argument has a default.
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `prefix = "..."` | key namespace: a non-empty string literal, without a trailing `:` (the attribute puts the `:` between prefix and key) | required |
/// | `key = <expr>` | an expression over the parameters (`user_id`, `order.id`, `self.tenant`, `format!("{a}:{b}")`) whose value is `Display`, evaluated once by reference before acquiring; the Redis key is `"{prefix}:{key}"` | none: the key is the prefix alone, one mutex for every call |
/// | `key = [a, b, ...]` | several keys, each as `key`, locked all or none in one atomic attempt: `[a, b]` and `[b, a]` exclude each other and never deadlock; exclusive, unfenced and not fair; at most 64 keys | — |
/// | `ttl = 3` / `ttl = "500ms"` / `ttl = LOCK_TTL` | lease length: integer seconds, or a string with unit `ms`, `s`, `m` or `h` (both checked at compile time); or any other expression of type `Duration` or integer seconds (`u64`, `u32`): `LOCK_TTL`, `CONFIG.lock_ttl`, `self.ttl`, evaluated once by reference before acquiring and checked then | 30 s |
/// | `max_renewals = 3` / `max_renewals = unlimited` | how many times the lease may be extended; `0` means at most one ttl | 3 |
/// | `wait = "5s"` / `wait = WAIT` | how long to wait for a busy lock (same forms as `ttl`) | no wait: fail fast with `LockError::Busy` |
/// | `hold_at_least = "5m"` / `hold_at_least = HOLD` | once the body started, the key is not freed before this long after it was taken, on every exit path (ShedLock's `lockAtLeastFor`: a job scheduled on several instances runs once per period); same forms as `ttl` | freed at release |
/// | `client = <expr>` | an expression of type `LockClient`, `&LockClient` or anything that derefs to one (`self.locks`, `state.locks`), evaluated once and cloned | the process-wide default client |
/// | `fencing = true` | also hand out a fencing token that strictly increases per key (`LockContext::fencing_token`) | `false` |
/// | `mode = read` / `mode = write` | `read`: shared with other readers of the key, excluded by a writer; `write`: exclusive (the default, spelled out) | exclusive |
/// | `permits = N` | at most `N` (≥ 1) holders of the key at once, a semaphore | exclusive |
/// | `fair = true` | waiters are served in arrival order across processes, and nobody barges past them | `false` |
/// | `crate = "path"` | path of the runtime crate in generated code, for a renamed dependency or a re-export (as `#[tokio::main(crate = "...")]`) | `::lockmacro_runtime` |
///
/// # The function
///
/// It must be an `async fn` (with a body) that returns `Result<T, E>` where
/// `E: From<LockError>`; `LockError` itself will do. Methods (`&self`, `&mut self`), generics,
/// `impl Trait` arguments and patterns such as axum's `Path(user_id): Path<u64>` work, and so do
/// methods of an `#[async_trait]` impl (with `#[async_trait]` above `#[redis_lock]`). Its
/// signature, attributes and docs are kept as written, and an unused locked function gets the
/// compiler's dead-code warning as any function does.
///
/// # What the call does
///
/// 1. Evaluates `key`, `client` and any length given as an expression once, by reference, before
///    the body takes its parameters: the key never moves out of a parameter, and the client is
///    cloned, so the body may still move what they borrowed.
/// 2. Acquires the lock. When it is busy, the call returns `Err(LockError::Busy.into())` without
///    running the body (after waiting up to `wait`, if given); when Redis fails,
///    `Err(LockError::Redis { .. }.into())`. A zero `ttl`, `wait` or `hold_at_least` given as an
///    expression is `LockError::InvalidOptions`, before any I/O, as the attribute refuses the
///    literal.
/// 3. Runs the body, whose `return` and `?` behave as in the undecorated function, while the
///    client's watchdog extends the lease up to `max_renewals` times. When the lease cannot be
///    kept, the body is cancelled at its next `.await` and the call returns
///    `LockError::RenewalsExhausted` or `LockError::Lost`, converted into `E`.
/// 4. Releases the lock on every exit path: return, `?`, panic, cancellation, or the caller
///    dropping the future.
///
/// The returned future is `Send` when the body's is.
///
/// # Panics
///
/// A call on a tokio runtime built without timers or IO panics with tokio's own message, which
/// names the builder call to add (`enable_all`); `#[tokio::main]` and `#[tokio::test]` enable
/// both. Outside any tokio runtime, the call returns `LockError::Config`.
///
/// # Errors at compile time
///
/// Each is reported at the offending tokens with what to write instead, and every one at once:
///
/// | what is written | what the error says |
/// |---|---|
/// | no `prefix` | add `prefix = "..."` |
/// | `prefix = ""`, `prefix = "books:"`, `prefix = PREFIX` | name the lock with a non-empty string literal; the `:` is added between prefix and key (write `prefix = "books"`) |
/// | `key = usr` where no parameter is `usr` | the key names no parameter; the message lists the parameters |
/// | `key = ""` | every call would be refused (`InvalidKey`): name what to lock, or omit `key` |
/// | `key = []` | list the keys to lock together, or omit `key` |
/// | `key = [..]` with `mode = read`, `permits`, `fencing = true` or `fair = true` | a lock over several keys is exclusive, unfenced and not fair: each at its own argument |
/// | a `key` (or a key of a list) that is not `Display` | the compiler's "doesn't implement `Display`", at that key |
/// | `ttl = 0`, `wait = "0s"`, `hold_at_least = 0` | greater than zero: omit `wait` to fail fast, omit `hold_at_least` to free the key at release |
/// | `ttl = 3s`, `ttl = "3"`, `ttl = "1.5s"`, `ttl = "5 s"`, `ttl = "2d"`, `ttl = "2w"` | the unit goes inside the string, right after a whole number (`"3s"`, `"1500ms"`, `"5s"`, `"48h"`); units are `ms`, `s`, `m`, `h` |
/// | a `ttl`, `wait` or `hold_at_least` literal over `u64::MAX` milliseconds | too large |
/// | a `ttl`, `wait` or `hold_at_least` expression of another type (`f64`) | take a `Duration` or integer seconds |
/// | `max_renewals = "3"`, `max_renewals = -1` | a non-negative integer or `unlimited` |
/// | `fencing = 1`, `fair = "yes"` | `true` or `false` |
/// | `mode = exclusive`, `permits = 0`, `permits = N`, `mode` with `permits` | `read` or `write`; at least 1; an integer literal; not both |
/// | `client = url` of another type | the compiler's "expected `&LockClient`", at the expression |
/// | `crate = lockmacro_runtime`, `crate = "not a path"` | a string literal holding a path |
/// | an unknown argument: `max_renewal`, `timeout`, `tll` | the argument meant (`max_renewals`; `wait` or `ttl`; `ttl`), else the list of arguments |
/// | an argument twice, without `=` or a value, or no `,` between two | give each argument once, as `name = value`, separated by commas |
/// | a sync `fn`, a `const fn`, a variadic, or an item that is no function | an `async fn` with a body (in a trait impl: declare it `async fn` in the trait too, or use `#[async_trait]`) |
/// | no return type, or one that is not `Result<T, E>` | return `Result<T, E>` with `E: From<LockError>` |
/// | an error type without `From<LockError>` (`Result<T, String>`) | implement `From<LockError>` (with thiserror: a variant holding `#[from] LockError`) |
///
/// Generated code names the runtime as `::lockmacro_runtime`: a crate that renamed the
/// dependency says where it is with `crate = "..."`, and one without it gets the compiler's
/// "unresolved crate `lockmacro_runtime`".
#[proc_macro_attribute]
pub fn redis_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::redis_lock(args.into(), item.into()).into()
}
