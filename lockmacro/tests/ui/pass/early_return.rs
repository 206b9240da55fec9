//! Early returns (`?`, `return`) from the locked body, with an error of the user's own.
use lockmacro_runtime::{LockError, redis_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
    Negative,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        Self::Parse(error)
    }
}

/// `?` converts into the declared error and `return` leaves the body, as without the attribute.
#[redis_lock(prefix = "parse", key = text)]
async fn parse(text: String) -> Result<u64, AppError> {
    let number: i64 = text.trim().parse()?;
    if number < 0 {
        return Err(AppError::Negative);
    }
    for _ in 0..3 {
        if number == 7 {
            return Ok(7);
        }
    }
    let _ = AppError::Lock;
    Ok(number as u64)
}

fn main() {
    let _ = parse;
    let _ = |error: AppError| match error {
        AppError::Lock(error) => error.to_string(),
        AppError::Parse(error) => error.to_string(),
        AppError::Negative => String::new(),
    };
}
