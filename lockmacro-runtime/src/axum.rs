//! `LockError` as an HTTP response: 409 Conflict when busy, 503 Service Unavailable otherwise.

use axum_core::response::{IntoResponse, Response};
use http::StatusCode;

use crate::LockError;

impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        let status = match self {
            LockError::Busy { .. } => StatusCode::CONFLICT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, self.to_string()).into_response()
    }
}
