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
/// ```ignore
/// use lockmacro_runtime::{LockError, redis_lock};
///
/// #[derive(Debug)]
/// struct Book {
///     title: String,
/// }
///
/// #[derive(Debug, thiserror::Error)]
/// enum AppError {
///     #[error(transparent)]
///     Lock(#[from] LockError), // what `#[redis_lock]` needs: `AppError: From<LockError>`
///     #[error("user {0} has no book")]
///     NoBook(u64),
/// }
///
/// #[redis_lock(prefix = "Business1", key = user_id, ttl = 3, max_renewals = 3)]
/// async fn borrow_book(user_id: u64) -> Result<Book, AppError> {
///     // Runs only while this process holds Redis key "Business1:<user_id>".
///     if user_id == 0 {
///         return Err(AppError::NoBook(user_id));
///     }
///     Ok(Book { title: format!("a book for user {user_id}") })
/// }
/// ```
///
/// (`ignore` here only because this crate cannot depend on its runtime; the same code is
/// compiled as a doctest of `lockmacro-runtime`, from its README.)
///
/// # Arguments
///
/// In any order, each at most once.
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `prefix = "..."` | key namespace: a non-empty string literal | required |
/// | `key = <expr>` | an expression over the parameters (`user_id`, `order.id`, `self.tenant`, `format!("{a}:{b}")`) whose value is `Display`; the Redis key is `"{prefix}:{key}"`. A lone lowercase name must be a parameter | none: the key is the prefix alone, one mutex for every call |
/// | `ttl = 3` / `ttl = "500ms"` / `ttl = LOCK_TTL` | lease length: integer seconds, or a string with unit `ms`, `s`, `m` or `h` (both checked at compile time, not zero); or any other expression of type `Duration` or integer seconds (`u64`, `u32`): `LOCK_TTL`, `CONFIG.lock_ttl`, `self.ttl`, evaluated once by reference before acquiring, and refused with `LockError::InvalidOptions` when zero | 30 s |
/// | `max_renewals = 3` / `max_renewals = unlimited` | how many times the lease may be extended; `0` means at most one ttl | 3 |
/// | `wait = "5s"` / `wait = WAIT` | how long to wait for a busy lock (same forms as `ttl`); not zero | no wait: fail fast with `LockError::Busy` |
/// | `client = <expr>` | an expression of type `LockClient`, `&LockClient` or anything that derefs to one (`self.locks`, `state.locks`) | the process-wide default client |
/// | `fencing = true` | also hand out a fencing token that strictly increases per key | `false` |
/// | `mode = read` / `mode = write` | `read`: shared with other readers of the key, excluded by a writer; `write`: exclusive (the default, spelled out) | exclusive |
/// | `permits = N` | at most `N` (≥ 1) holders of the key at once, a semaphore; not with `mode` | exclusive |
/// | `fair = true` | waiters are served in arrival order across processes, and nobody barges past them | `false` |
/// | `crate = "path"` | path of the runtime crate in generated code, for a renamed dependency or a re-export | `::lockmacro_runtime` |
///
/// # The function
///
/// It must be an `async fn` (with a body) that returns `Result<T, E>` where
/// `E: From<LockError>`; `LockError` itself will do. Methods (`&self`, `&mut self`), generics,
/// `impl Trait` arguments and patterns such as axum's `Path(user_id): Path<u64>` work, and so do
/// methods of an `#[async_trait]` impl. Its signature, attributes and docs are kept as written.
///
/// # What the call does
///
/// 1. Evaluates `key` and `client` once, by reference, before the body takes its parameters:
///    the key never moves out of a parameter, and the client is cloned, so the body may still
///    move what they borrowed.
/// 2. Acquires the lock. When it is busy, the call returns `Err(LockError::Busy.into())` without
///    running the body (after waiting up to `wait`, if given); when Redis fails,
///    `Err(LockError::Redis { .. }.into())`.
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
/// A missing `async`, a return type that is not such a `Result`, an unknown, duplicated or
/// ill-typed argument, an empty `prefix`, a zero `ttl` or `wait` literal, `permits = 0`, a `mode`
/// other than `read`/`write`, `mode` with `permits`, a `ttl` expression of another type than
/// `Duration` or integer seconds: each is a compile error at the offending tokens that says what
/// to write instead, all reported at once. So is a `key` that is a lone name but no parameter
/// (the message lists the parameters), an error type without `From<LockError>`, and a sync
/// method (in a trait impl: declare it `async fn` in the trait, or use `#[async_trait]`).
/// Generated code names the runtime as `::lockmacro_runtime`: a crate that renamed the
/// dependency says where it is with `crate = "..."`, and one without it gets the compiler's
/// "unresolved crate `lockmacro_runtime`".
#[proc_macro_attribute]
pub fn redis_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::redis_lock(args.into(), item.into()).into()
}
