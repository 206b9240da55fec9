//! `crate = "..."` reaches the runtime under another name, and a local module named like the
//! runtime crate does not capture the generated paths.
extern crate lockmacro_runtime as renamed;

#[allow(dead_code)]
mod lockmacro_runtime {
    pub(crate) mod __private {}
    pub(crate) struct LockOptions;
}

use renamed::{LockError, redis_lock};

#[redis_lock(crate = "renamed", prefix = "renamed", key = id, ttl = 1)]
async fn through_renamed(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

mod nested {
    use super::renamed::{LockError, redis_lock};

    /// The default path is absolute, so the local `lockmacro_runtime` module is not in its way.
    #[redis_lock(prefix = "default", key = id)]
    pub(crate) async fn through_default(id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[redis_lock(crate = "::renamed", prefix = "absolute")]
    pub(crate) async fn through_absolute() -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {
    let _ = (
        through_renamed,
        nested::through_default,
        nested::through_absolute,
    );
}
