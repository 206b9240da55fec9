use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "books:", key = book_id)]
async fn prefix_trailing_colon(book_id: u64) -> Result<u64, LockError> {
    Ok(book_id)
}

fn main() {
    let _ = prefix_trailing_colon;
}
