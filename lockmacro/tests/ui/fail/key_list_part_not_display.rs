use lockmacro_runtime::{LockError, redis_lock};

pub struct Account {
    pub id: u64,
}

#[redis_lock(prefix = "accounts", key = [from.id, to])]
async fn key_list_part_not_display(from: Account, to: Account) -> Result<u64, LockError> {
    Ok(from.id + to.id)
}

fn main() {
    let _ = key_list_part_not_display;
}
