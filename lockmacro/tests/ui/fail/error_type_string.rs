use lockmacro_runtime::redis_lock;

#[redis_lock(prefix = "orders", key = id)]
async fn error_type_string(id: u64) -> Result<u64, String> {
    Ok(id)
}

fn main() {
    let _ = error_type_string;
}
