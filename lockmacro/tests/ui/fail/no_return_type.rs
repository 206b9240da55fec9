use lockmacro_runtime::redis_lock;

#[redis_lock(prefix = "unit", key = id)]
async fn no_return_type(id: u64) {
    let _ = id;
}

fn main() {
    let _ = no_return_type;
}
