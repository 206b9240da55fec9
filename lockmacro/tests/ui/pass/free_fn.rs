//! Free functions, as the design card writes them.
use lockmacro_runtime::{LockError, redis_lock};

/// What the locked function returns.
pub struct Book {
    /// Its id.
    pub id: u64,
}

#[redis_lock(prefix = "Business1", key = user_id, ttl = 3, max_renewals = 3)]
async fn test_redis_lock(user_id: u64) -> Result<Book, LockError> {
    Ok(Book { id: user_id })
}

/// No `key`: one lock for every call, as for a scheduled job.
#[redis_lock(prefix = "nightly-report", max_renewals = unlimited, ttl = "2m")]
async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

#[redis_lock(
    crate = "::lockmacro_runtime",
    fencing = true,
    wait = "5s",
    client = lockmacro_runtime::default_client()?,
    ttl = "500ms",
    max_renewals = 0,
    key = format!("{a}:{b}"),
    prefix = "pair",
)]
async fn pair(a: u32, b: String) -> Result<String, LockError> {
    Ok(b)
}

#[redis_lock(prefix = "orders", key = order.id, wait = 1, fencing = false)]
async fn ship(order: Order) -> Result<Order, LockError> {
    Ok(order)
}

/// Another return type.
pub struct Order {
    /// Its id.
    pub id: u64,
}

fn main() {
    let _ = (test_redis_lock, nightly_report, pair, ship);
}
