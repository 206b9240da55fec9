use lockmacro_runtime::{LockError, redis_lock};

pub struct Order {
    pub id: u64,
}

#[redis_lock(prefix = "orders", key = order)]
async fn key_not_display(order: Order) -> Result<u64, LockError> {
    Ok(order.id)
}

fn main() {
    let _ = key_not_display;
}
