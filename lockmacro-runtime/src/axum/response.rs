//! `LockError` as an HTTP response: 409 Conflict when busy; 500 Internal Server Error for the
//! programmer's errors (`Config`, `InvalidKey`, `InvalidOptions`, `NotALock`: retrying cannot help); 503
//! Service Unavailable otherwise (Redis down, lease lost, shutting down: worth a retry).
//!
//! The body names the lock but never the internals (a server address, an OS error): those go
//! to the log, for the operator, not to the HTTP client. [`LockErrorResponse`] holds what the
//! response says, for an application that shapes its own body; [`JsonLockError`] is the same
//! response as JSON.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::escape::json_string;
use crate::LockError;

/// The `Retry-After` of a 503: about how long a client takes to reconnect after Redis comes
/// back, so a retry that soon is not wasted on the same outage.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the HTTP response to a [`LockError`] says: its status, when to retry, a short code and
/// a message that names the lock but no internals. `LockError`'s own `IntoResponse` sends it
/// as text; [`json`](Self::json) sends it as JSON; an application that wants another body takes
/// the parts:
///
/// ```
/// use axum::Json;
/// use axum::response::{IntoResponse, Response};
/// use lockmacro_runtime::LockError;
/// use lockmacro_runtime::axum::LockErrorResponse;
///
/// enum AppError {
///     Lock(LockError),
/// }
///
/// impl IntoResponse for AppError {
///     fn into_response(self) -> Response {
///         match self {
///             AppError::Lock(error) => {
///                 let answer = LockErrorResponse::new(&error);
///                 // Status and `Retry-After` from the library, the body in the app's own shape.
///                 let body = Json(format!("{}: {}", answer.code(), answer.message()));
///                 (answer.status(), answer.headers(), body).into_response()
///             }
///         }
///     }
/// }
///
/// let busy = LockError::Busy { key: "borrow:1".into(), retry_after: None };
/// assert_eq!(AppError::Lock(busy).into_response().status(), 409);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockErrorResponse {
    status: StatusCode,
    code: &'static str,
    key: Option<String>,
    message: String,
    retry_after: Option<Duration>,
}

impl LockErrorResponse {
    /// What to answer for `error`. Logs it for the operator, with its internals (a 500 as an
    /// error, a 503 as a warning; a 409 is the lock working, not logged).
    pub fn new(error: &LockError) -> Self {
        let key = error.key().map(str::to_owned);
        match error {
            LockError::Busy { retry_after, .. } => Self {
                status: StatusCode::CONFLICT,
                code: "busy",
                message: error.to_string(),
                key,
                retry_after: *retry_after,
            },
            LockError::Config { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. }
            | LockError::NotALock { .. } => {
                tracing::error!(%error, "locked request answered 500: the lock is misconfigured");
                let message = match &key {
                    Some(key) => format!("lock `{key}` cannot be used; this is a server error"),
                    None => "the lock is misconfigured; this is a server error".to_owned(),
                };
                Self {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    code: "misconfigured",
                    message,
                    key,
                    retry_after: None,
                }
            }
            _ => {
                tracing::warn!(%error, "locked request answered 503");
                let message = match &key {
                    Some(key) => format!("lock `{key}` is unavailable right now; try again later"),
                    None => "the lock service is unavailable right now; try again later".to_owned(),
                };
                Self {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "unavailable",
                    message,
                    key,
                    retry_after: Some(UNAVAILABLE_RETRY_AFTER),
                }
            }
        }
    }

    /// 409 Conflict when busy, 500 for the programmer's errors, 503 otherwise.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// `"busy"` (409), `"misconfigured"` (500) or `"unavailable"` (503): a stable word for a
    /// client's code to match on.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The lock's Redis key, when the error concerns one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// One sentence for a person: names the lock, never a server address or an OS error.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// When to try again: the holder's lease when a 409's wait learned it,
    /// [`UNAVAILABLE_RETRY_AFTER`] for a 503, none for a 500.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// `Retry-After` in whole seconds (rounded up, at least one) when there is one: the headers
    /// to send with a body of the application's own.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(seconds) = self.retry_after_seconds() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        headers
    }

    /// The response with a JSON body, `Content-Type: application/json`:
    /// `{"error":"busy","key":"borrow:1","message":"lock `borrow:1` is held by another owner","retry_after":3}`
    /// (`key` and `retry_after`, in seconds, are `null` when unknown).
    pub fn json(&self) -> Response {
        let body = format!(
            r#"{{"error":{},"key":{},"message":{},"retry_after":{}}}"#,
            json_string(self.code),
            self.key
                .as_deref()
                .map_or_else(|| "null".to_owned(), json_string),
            json_string(&self.message),
            self.retry_after_seconds()
                .map_or_else(|| "null".to_owned(), |seconds| seconds.to_string()),
        );
        let content_type = [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )];
        (self.status, self.headers(), content_type, body).into_response()
    }

    fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after
            .map(|wait| (wait.as_millis().div_ceil(1000) as u64).max(1))
    }
}

/// The text form: `text/plain` with the message.
impl IntoResponse for LockErrorResponse {
    fn into_response(self) -> Response {
        (self.status, self.headers(), self.message).into_response()
    }
}

/// 409 Conflict when busy, 500 for the programmer's errors, 503 otherwise, as text; with
/// `Retry-After` on a 503, and on a 409 when the holder's lease is known.
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        LockErrorResponse::new(&self).into_response()
    }
}

/// A [`LockError`] answered as JSON ([`LockErrorResponse::json`]). It converts from
/// `LockError`, so a handler under `#[redis_lock]` can return it as its error type:
///
/// ```
/// use axum::Json;
/// use lockmacro_runtime::axum::JsonLockError;
/// use lockmacro_runtime::{LockClient, redis_lock};
///
/// #[redis_lock(prefix = "borrow", key = user_id, client = locks)]
/// async fn borrow(locks: &LockClient, user_id: u64) -> Result<Json<u64>, JsonLockError> {
///     Ok(Json(user_id))
/// }
/// ```
///
/// A handler with an error type of its own calls [`LockErrorResponse::json`] from its
/// `IntoResponse`, as [`LockErrorResponse`] shows for any other body.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct JsonLockError(pub LockError);

impl From<LockError> for JsonLockError {
    fn from(error: LockError) -> Self {
        Self(error)
    }
}

impl IntoResponse for JsonLockError {
    fn into_response(self) -> Response {
        LockErrorResponse::new(&self.0).json()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;

    use super::{JsonLockError, LockErrorResponse};
    use crate::LockError;

    fn unavailable() -> LockError {
        LockError::Redis {
            key: Some("borrow:9".into()),
            source: "connection refused (os error 111) at 127.0.0.1:6379".into(),
        }
    }

    #[test]
    fn a_503_says_when_to_retry() {
        let response = unavailable().into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn a_409_rounds_retry_after_up_to_whole_seconds() {
        let busy = |retry_after| LockError::Busy {
            key: "borrow:1".into(),
            retry_after,
        };
        let response = busy(Some(Duration::from_millis(2100))).into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        let response = busy(Some(Duration::from_millis(1))).into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let response = busy(None).into_response();
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn a_500_has_no_retry_after() {
        let response = LockError::InvalidOptions {
            message: "ttl is zero".into(),
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn the_text_body_is_the_default() {
        let response = unavailable().into_response();
        assert!(
            response.headers()[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
    }

    #[test]
    fn json_names_the_lock_escaped_and_hides_the_internals() {
        let busy = LockError::Busy {
            key: "borrow:\"1\"\\</script>\n".into(),
            retry_after: Some(Duration::from_millis(1500)),
        };
        let answer = LockErrorResponse::new(&busy);
        let body = json_body(&answer);
        assert_eq!(
            body,
            r#"{"error":"busy","key":"borrow:\"1\"\\\u003c/script>\n","message":"lock `borrow:\"1\"\\\u003c/script>\n` is held by another owner","retry_after":2}"#
        );
        let body = json_body(&LockErrorResponse::new(&unavailable()));
        assert_eq!(
            body,
            r#"{"error":"unavailable","key":"borrow:9","message":"lock `borrow:9` is unavailable right now; try again later","retry_after":1}"#
        );
        let body = json_body(&LockErrorResponse::new(&LockError::Config {
            message: "bad url".into(),
        }));
        assert_eq!(
            body,
            r#"{"error":"misconfigured","key":null,"message":"the lock is misconfigured; this is a server error","retry_after":null}"#
        );
    }

    #[test]
    fn json_lock_error_answers_json_with_the_same_status_and_headers() {
        let response = JsonLockError::from(unavailable()).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    fn json_body(answer: &LockErrorResponse) -> String {
        let response = answer.json();
        let body = response.into_body();
        let bytes = futures_util::FutureExt::now_or_never(axum::body::to_bytes(body, usize::MAX))
            .expect("a ready body")
            .expect("a body");
        String::from_utf8(bytes.to_vec()).expect("UTF-8")
    }
}
