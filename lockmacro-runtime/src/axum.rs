//! `LockError` as an HTTP response: 409 Conflict when busy; 500 Internal Server Error for the
//! programmer's errors (`Config`, `InvalidKey`, `InvalidOptions`, `NotALock`: retrying cannot
//! help); 503
//! Service Unavailable otherwise (Redis down, lease lost, shutting down: worth a retry).
//!
//! The body names the lock but never the internals (a server address, an OS error): those go
//! to the log, for the operator, not to the HTTP client.

use axum_core::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

use crate::LockError;

impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        match &self {
            LockError::Busy { retry_after, .. } => {
                let mut response = (StatusCode::CONFLICT, self.to_string()).into_response();
                if let Some(retry_after) = retry_after {
                    // Whole seconds, rounded up, at least one.
                    let seconds = retry_after.as_millis().div_ceil(1000).max(1);
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(seconds as u64));
                }
                response
            }
            LockError::Config { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. }
            | LockError::NotALock { .. } => {
                tracing::error!(error = %self, "locked request answered 500: the lock is misconfigured");
                let body = match self.key() {
                    Some(key) => format!("lock `{key}` cannot be used; this is a server error"),
                    None => "the lock is misconfigured; this is a server error".to_owned(),
                };
                (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
            }
            _ => {
                tracing::warn!(error = %self, "locked request answered 503");
                let body = match self.key() {
                    Some(key) => format!("lock `{key}` is unavailable right now; try again later"),
                    None => "the lock service is unavailable right now; try again later".to_owned(),
                };
                (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
            }
        }
    }
}
