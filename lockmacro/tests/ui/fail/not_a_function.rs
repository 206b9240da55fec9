use lockmacro_runtime::redis_lock;

#[redis_lock(prefix = "users")]
struct NotAFunction;

trait Locked {
    #[redis_lock(prefix = "users")]
    async fn no_body(&self) -> Result<(), lockmacro_runtime::LockError>;
}

fn main() {}
