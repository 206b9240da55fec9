//! An axum handler: extractors as arguments, the key from one of them.
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use lockmacro_runtime::{LockClient, LockError, redis_lock};

#[derive(Clone)]
struct AppState {
    locks: Arc<LockClient>,
}

enum AppError {
    Lock(LockError),
    NotFound,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            Self::Lock(error) => error.into_response(),
            Self::NotFound => axum::http::StatusCode::NOT_FOUND.into_response(),
        }
    }
}

#[redis_lock(prefix = "user", key = user_id, client = state.locks)]
async fn update_user(
    State(state): State<AppState>,
    Path(user_id): Path<u64>,
) -> Result<String, AppError> {
    let _ = state;
    if user_id == 0 {
        return Err(AppError::NotFound);
    }
    Ok(format!("updated {user_id}"))
}

#[redis_lock(prefix = "pair", key = format!("{a}:{b}"), client = state.locks, wait = "2s")]
async fn pair(
    State(state): State<AppState>,
    Path((a, b)): Path<(u32, String)>,
) -> Result<(), AppError> {
    let _ = (state, a, b);
    Ok(())
}

fn main() {
    let _app: fn(AppState) -> Router = |state| {
        Router::new()
            .route("/users/{user_id}", get(update_user))
            .route("/pairs/{a}/{b}", get(pair))
            .with_state(state)
    };
}
