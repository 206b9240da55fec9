use lockmacro_runtime::redis_lock;

#[redis_lock(prefix = "count", key = id)]
async fn return_not_result(id: u64) -> u32 {
    id as u32
}

fn main() {
    let _ = return_not_result;
}
