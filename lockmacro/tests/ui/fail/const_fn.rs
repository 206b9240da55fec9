use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "constant")]
const fn const_fn() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = const_fn;
}
