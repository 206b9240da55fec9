//! Generic functions, `impl Trait` arguments and return types, borrowed arguments.
use std::fmt::Display;

use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "generic", key = id)]
async fn generic<K: Display + Send, V>(id: K, value: V) -> Result<V, LockError>
where
    V: Send,
{
    Ok(value)
}

#[redis_lock(prefix = "impl-arg", key = name)]
async fn impl_argument(name: impl Display + Send) -> Result<String, LockError> {
    Ok(name.to_string())
}

#[redis_lock(prefix = "impl-return", key = id)]
async fn impl_return(id: u8) -> Result<impl Display, LockError> {
    Ok(id)
}

#[redis_lock(prefix = "borrowed", key = name)]
async fn borrowed<'a>(name: &'a str) -> Result<&'a str, LockError> {
    Ok(name)
}

fn main() {
    let _ = generic::<u8, ()>;
    let _unpolled = impl_argument("x");
    let _ = impl_return;
    let _ = borrowed;
}
