use lockmacro_runtime::redis_lock;

#[derive(Debug)]
pub struct AppError;

#[redis_lock(prefix = "orders", key = id)]
async fn error_without_from(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = error_without_from;
}
