//! `LockError` as an HTTP response: 409 Conflict when busy; 500 Internal Server Error for what
//! needs someone to act ([`LockError::is_transient`] is false: a refused password or ACL, a
//! server that does not speak Redis's protocol, a script error, a key that is not a lock,
//! invalid options or configuration: retrying cannot help); 503 Service Unavailable otherwise
//! (Redis down, lease lost, shutting down: worth a retry).
//!
//! The body names the lock but never the internals (a server address, an OS error): those go
//! to the log, for the operator, not to the HTTP client. [`LockErrorResponse`] holds what the
//! response says, for an application that shapes its own body; [`JsonLockError`] is the same
//! response as JSON.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::escape::json_string;
use crate::LockError;

/// The `Retry-After` of a 503: about how long a client takes to reconnect after Redis comes
/// back, so a retry that soon is not wasted on the same outage.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How often a refusal that goes on is logged again at error level: a wrong password fails every
/// request the same way until someone acts, so it is logged when it begins, not per request.
const REFUSAL_REMINDER: Duration = Duration::from_secs(60);

/// The last refusal logged at error level (see [`Refusals`]), process-wide.
static REFUSALS: Mutex<Refusals> = Mutex::new(Refusals { last: None });

/// Which refusals are news for the log: one that differs from the last logged, the first after
/// an outage was answered 503 in between, or the same one [`REFUSAL_REMINDER`] after it was
/// last logged. The others go to the log at debug level.
struct Refusals {
    /// What the last refusal logged said, and when it was logged.
    last: Option<(String, Instant)>,
}

impl Refusals {
    /// Whether `refusal`, answered at `now`, is logged at error level; remembers it if so.
    fn is_news(&mut self, refusal: &str, now: Instant) -> bool {
        let repeated = self.last.as_ref().is_some_and(|(said, at)| {
            said == refusal && now.saturating_duration_since(*at) < REFUSAL_REMINDER
        });
        if !repeated {
            self.last = Some((refusal.to_owned(), now));
        }
        !repeated
    }

    /// A transient failure was answered: a refusal after it is news again.
    fn forget(&mut self) {
        self.last = None;
    }
}

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
    /// What to answer for `error`. Logs it for the operator, with its internals: a 503 as a
    /// warning; a 500 as an error when it is news (it differs from the last one logged, follows
    /// an outage, or was last logged a minute ago), else at debug level, so that a wrong
    /// password is not logged once per request; a 409 is the lock working, not logged.
    pub fn new(error: &LockError) -> Self {
        let key = error.key().map(str::to_owned);
        if let LockError::Busy { retry_after, .. } = error {
            return Self {
                status: StatusCode::CONFLICT,
                code: "busy",
                message: error.to_string(),
                key,
                retry_after: *retry_after,
            };
        }
        if !error.is_transient() {
            log_refusal(error);
            let message = match &key {
                Some(key) => format!("lock `{key}` cannot be used; this is a server error"),
                None => "the lock is misconfigured; this is a server error".to_owned(),
            };
            return Self {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: "misconfigured",
                message,
                key,
                retry_after: None,
            };
        }
        tracing::warn!(%error, "locked request answered 503");
        refusals().forget();
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

    /// 409 Conflict when busy, 500 for what needs someone to act, 503 otherwise.
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

    /// When to try again: for a 409, `Busy`'s `retry_after` (how fast the key's waiters have
    /// lately been served, times those ahead, when Redis observed it; else the holder's
    /// remaining lease); [`UNAVAILABLE_RETRY_AFTER`] for a 503; none for a 500.
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

fn refusals() -> std::sync::MutexGuard<'static, Refusals> {
    REFUSALS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Logs a 500's `error`: at error level when it is news ([`Refusals`]), else at debug level.
/// Compared without its key (a wrong password refuses every key alike), except where the key
/// is the problem.
fn log_refusal(error: &LockError) {
    let refusal = match error {
        LockError::Redis { source, .. } => source.to_string(),
        other => other.to_string(),
    };
    if refusals().is_news(&refusal, Instant::now()) {
        tracing::error!(%error, "locked request answered 500: retrying cannot help until someone acts (logged again when it changes, or in a minute)");
    } else {
        tracing::debug!(%error, "locked request answered 500");
    }
}

/// The text form: `text/plain` with the message.
impl IntoResponse for LockErrorResponse {
    fn into_response(self) -> Response {
        (self.status, self.headers(), self.message).into_response()
    }
}

/// 409 Conflict when busy, 500 for what needs someone to act, 503 otherwise, as text; with
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
    use std::time::{Duration, Instant};

    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;

    use super::{JsonLockError, LockErrorResponse, Refusals};
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

    /// A refused password fails every request alike until someone acts: no retry will help, so
    /// no `Retry-After`, and no warning as for an outage.
    #[test]
    fn a_refusal_is_a_500_without_retry_after() {
        use crate::store::{Refused, StoreError};
        let refused = StoreError::unavailable(Refused::WrongPassword {
            server: "127.0.0.1:6379".into(),
            reason: "WRONGPASS".into(),
        })
        .into_lock_error(Some("borrow:1"));
        assert!(!refused.is_transient());
        let answer = LockErrorResponse::new(&refused);
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer.code(), "misconfigured");
        assert_eq!(answer.retry_after(), None);
        assert!(
            !answer.message().contains("127.0.0.1"),
            "{}",
            answer.message()
        );
        let response = refused.into_response();
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn a_refusal_is_news_when_it_changes_after_an_outage_or_a_minute_on() {
        let mut refusals = Refusals { last: None };
        let start = Instant::now();
        assert!(refusals.is_news("wrong password", start));
        for second in 1..60 {
            let now = start + Duration::from_secs(second);
            assert!(!refusals.is_news("wrong password", now), "{second} s on");
        }
        assert!(refusals.is_news("ACL refused", start + Duration::from_secs(1)));
        assert!(refusals.is_news("wrong password", start + Duration::from_secs(2)));
        assert!(!refusals.is_news("wrong password", start + Duration::from_secs(3)));
        refusals.forget();
        assert!(refusals.is_news("wrong password", start + Duration::from_secs(4)));
        assert!(refusals.is_news("wrong password", start + Duration::from_secs(64)));
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
