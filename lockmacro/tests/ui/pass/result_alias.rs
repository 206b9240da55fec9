//! A function whose `Result` is an alias, or the alias of another module.
use lockmacro_runtime::{LockError, redis_lock};

/// The application's error.
#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

type AppResult<T> = Result<T, AppError>;

mod io {
    pub(crate) type Result<T> = std::result::Result<T, super::AppError>;
}

#[redis_lock(prefix = "alias", key = id)]
async fn through_alias(id: u64) -> AppResult<u64> {
    Ok(id)
}

#[redis_lock(prefix = "alias-named-result", key = id)]
async fn through_one_argument_result(id: u64) -> io::Result<u64> {
    Ok(id)
}

#[redis_lock(prefix = "full-path", key = id)]
async fn through_full_path(id: u64) -> std::result::Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = (
        through_alias,
        through_one_argument_result,
        through_full_path,
    );
}
