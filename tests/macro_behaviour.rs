//! `#[redis_lock]` end to end against real redis-server processes: the seed scenario, a method,
//! and an axum handler.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use common::{get, key_gone};
use http_body_util::BodyExt;
use lockmacro_runtime::axum::JsonLockError;
use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions, redis_lock};
use testkit::RedisServer;
use tokio::sync::oneshot;
use tower::ServiceExt;

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("no such user")]
    NoSuchUser,
}

struct Library {
    locks: LockClient,
    finished: Arc<AtomicBool>,
}

impl Library {
    /// The seed's method: 10 s of work under a 600 ms lease renewed at most 3 times.
    #[redis_lock(prefix = "Business1", key = user_id, ttl = "600ms", max_renewals = 3, client = self.locks)]
    async fn test_redis_lock(
        &self,
        user_id: u64,
        started: Option<oneshot::Sender<String>>,
    ) -> Result<String, AppError> {
        if let Some(started) = started {
            let _ = started.send(LockContext::current().unwrap().key().to_owned());
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        self.finished.store(true, Ordering::SeqCst);
        Ok(format!("book for {user_id}"))
    }

    #[redis_lock(prefix = "Business2", key = user_id, client = self.locks)]
    async fn lookup(&self, user_id: u64) -> Result<u64, AppError> {
        if user_id == 0 {
            return Err(AppError::NoSuchUser);
        }
        let doubled = self.double(user_id).await?;
        Ok(doubled)
    }

    /// Called from `lookup` on the same key: re-enters.
    #[redis_lock(prefix = "Business2", key = user_id, client = self.locks)]
    async fn double(&self, user_id: u64) -> Result<u64, LockError> {
        Ok(user_id * 2)
    }
}

async fn library(server: &RedisServer) -> Library {
    Library {
        locks: LockClient::builder(&server.url())
            .scan_interval(Duration::from_millis(100))
            .build()
            .await
            .unwrap(),
        finished: Arc::new(AtomicBool::new(false)),
    }
}

#[tokio::test]
async fn seed_scenario_busy_second_call_then_cancelled_after_renewals() {
    let server = RedisServer::start();
    let library = Arc::new(library(&server).await);
    let (started_tx, started) = oneshot::channel();
    let began = Instant::now();
    let first = tokio::spawn({
        let library = library.clone();
        async move { library.test_redis_lock(1024, Some(started_tx)).await }
    });
    assert_eq!(started.await.unwrap(), "Business1:1024");
    assert!(get(&server, "Business1:1024").await.is_some());

    let second = library.test_redis_lock(1024, None).await;
    assert!(
        matches!(second, Err(AppError::Lock(LockError::Busy { ref key, .. })) if key == "Business1:1024"),
        "{second:?}"
    );

    let first = first.await.unwrap();
    assert!(
        matches!(
            first,
            Err(AppError::Lock(LockError::RenewalsExhausted {
                renewals: 3,
                ..
            }))
        ),
        "{first:?}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "cancelled after 3 renewals, not after 10 s"
    );
    assert!(
        !library.finished.load(Ordering::SeqCst),
        "the work was dropped"
    );
    assert_eq!(
        get(&server, "Business1:1024").await,
        None,
        "released before returning"
    );
}

#[tokio::test]
async fn method_with_client_from_self_errors_and_reentrant_calls() {
    let server = RedisServer::start();
    let library = library(&server).await;
    assert_eq!(
        library.lookup(21).await.unwrap(),
        42,
        "nested call on the same key re-enters"
    );
    assert!(matches!(library.lookup(0).await, Err(AppError::NoSuchUser)));
    assert_eq!(
        get(&server, "Business2:0").await,
        None,
        "released after the early return"
    );
    assert_eq!(get(&server, "Business2:21").await, None);
}

#[derive(Clone)]
struct AppState {
    locks: LockClient,
    entered: Arc<tokio::sync::Notify>,
}

#[redis_lock(prefix = "borrow", key = user_id, client = state.locks, ttl = 5)]
async fn borrow_book(
    State(state): State<AppState>,
    Path(user_id): Path<u64>,
) -> Result<Json<String>, LockError> {
    state.entered.notify_one();
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(Json(format!("book lent to {user_id}")))
}

/// The router with `borrow_book`, and its state to watch the handler through.
async fn library_app(server: &RedisServer) -> (AppState, Router) {
    let state = AppState {
        locks: LockClient::connect(&server.url()).await.unwrap(),
        entered: Arc::new(tokio::sync::Notify::new()),
    };
    let app = Router::new()
        .route("/users/{user_id}/books", post(borrow_book))
        .with_state(state.clone());
    (state, app)
}

#[tokio::test]
async fn axum_handler_answers_409_while_a_first_request_holds_the_key() {
    let server = RedisServer::start();
    let (state, app) = library_app(&server).await;
    let request = || {
        Request::post("/users/1024/books")
            .body(Body::empty())
            .unwrap()
    };

    let first = tokio::spawn(app.clone().oneshot(request()));
    state.entered.notified().await;
    let second = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(second.status(), StatusCode::CONFLICT);
    let body = second.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("borrow:1024"),
        "the body names the key"
    );

    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(get(&server, "borrow:1024").await, None);
}

#[tokio::test]
async fn axum_handler_dropped_by_a_hung_up_client_releases_the_lock() {
    let server = RedisServer::start();
    let (state, app) = library_app(&server).await;
    let call =
        tokio::spawn(app.oneshot(Request::post("/users/7/books").body(Body::empty()).unwrap()));
    state.entered.notified().await;
    call.abort(); // what axum does when the client hangs up: the handler future is dropped
    key_gone(&server, "borrow:7", Duration::from_secs(2)).await;
}

/// Answers its lock's errors in the form `E` gives them: text (`LockError`) or JSON
/// (`JsonLockError`).
#[redis_lock(prefix = "reserve", key = user_id, client = state.locks, ttl = 5, wait = "100ms")]
async fn reserve_book<E: From<LockError>>(
    State(state): State<AppState>,
    Path(user_id): Path<u64>,
) -> Result<Json<String>, E> {
    state.entered.notify_one();
    Ok(Json(format!("book reserved for {user_id}")))
}

/// A request that waited for a busy lock learned how long its holder has left: the 409 says
/// when to come back. An app that answers JSON chooses JSON for the lock's errors too (the
/// handler's error type is `JsonLockError`): the same 409 and `Retry-After`, a JSON body.
#[tokio::test]
async fn axum_409_after_a_wait_carries_retry_after_within_the_holders_lease() {
    let server = RedisServer::start();
    let (state, _) = library_app(&server).await;
    let app = Router::new()
        .route(
            "/users/{user_id}/reservations",
            post(reserve_book::<LockError>),
        )
        .route(
            "/json/users/{user_id}/reservations",
            post(reserve_book::<JsonLockError>),
        )
        .with_state(state.clone());
    let held = state
        .locks
        .acquire("reserve:5", LockOptions::new().ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    let response = app
        .clone()
        .oneshot(
            Request::post("/users/5/reservations")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let retry_after: u64 = response.headers()[axum::http::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&retry_after), "Retry-After: {retry_after}");

    let response = app
        .oneshot(
            Request::post("/json/users/5/reservations")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let headers = response.headers().clone();
    assert_eq!(
        headers[axum::http::header::CONTENT_TYPE],
        "application/json"
    );
    let retry_after = headers[axum::http::header::RETRY_AFTER].to_str().unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!(
            r#"{{"error":"busy","key":"reserve:5","message":"lock `reserve:5` is held by another owner","retry_after":{retry_after}}}"#
        )
    );
    held.release().await.unwrap();
}

/// Redis down: 503 with a `Retry-After`, and a body that names the lock but not the server or
/// the OS error (those go to the log).
#[tokio::test]
async fn axum_503_hides_the_internals_of_a_redis_failure() {
    let mut server = RedisServer::start();
    let (_, app) = library_app(&server).await;
    let port = server.port().to_string();
    server.kill();
    let response = app
        .oneshot(Request::post("/users/9/books").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "1");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("borrow:9"), "the body names the key: {body}");
    for internal in [port.as_str(), "127.0.0.1", "refused", "os error"] {
        assert!(
            !body.contains(internal),
            "{internal:?} leaked into {body:?}"
        );
    }
}

/// An app whose Redis is down when it starts still starts (`build_lazy`), answers 503 while
/// Redis is down, and takes locks again once Redis is back, with no restart of the app.
#[tokio::test]
async fn axum_app_started_with_redis_down_answers_503_until_redis_is_back() {
    let mut server = RedisServer::start();
    server.kill();
    let state = AppState {
        locks: LockClient::builder(&server.url())
            .connect_timeout(Duration::from_millis(300))
            .build_lazy()
            .expect("a lazy client needs no Redis to start"),
        entered: Arc::new(tokio::sync::Notify::new()),
    };
    let app = Router::new()
        .route("/users/{user_id}/books", post(borrow_book))
        .with_state(state);
    let request = || Request::post("/users/3/books").body(Body::empty()).unwrap();
    let down = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Kept until the end: dropping the handle stops the server.
    let _server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = app.clone().oneshot(request()).await.unwrap().status();
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            Instant::now() < deadline,
            "still {status} 10 s after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[redis_lock(prefix = "shelf", key = name.trim(), client = state.locks)]
async fn shelve(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<String>, LockError> {
    Ok(Json(format!("{name} shelved")))
}

/// A key that cannot be used is the programmer's error, not an outage: 500, not 503 (a client
/// retrying would get the same answer).
#[tokio::test]
async fn axum_invalid_key_answers_500_not_503() {
    let server = RedisServer::start();
    let (state, _) = library_app(&server).await;
    let app = Router::new()
        .route("/shelves/{name}", post(shelve))
        .with_state(state);
    // A name of blanks: the key part renders empty, `InvalidKey`.
    let response = app
        .oneshot(Request::post("/shelves/%20").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// What `main` prints when it returns the error of a client that cannot reach Redis: the
/// failure, without empty fields (`key: None`, `hint: ""`) or internal wrappers.
#[tokio::test]
async fn debug_of_an_unreachable_redis_shows_no_empty_fields() {
    let mut server = RedisServer::start();
    server.kill();
    let error = LockClient::builder(&server.url())
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect_err("nothing listens there");
    let debug = format!("{error:?}");
    assert!(
        debug.starts_with("Redis { source: Unreachable { server: "),
        "{debug}"
    );
    for empty in ["key: None", "hint: \"\"", "Shared("] {
        assert!(!debug.contains(empty), "{empty:?} in {debug}");
    }
}

struct Bank {
    locks: LockClient,
}

struct Account {
    id: u64,
}

impl Bank {
    /// Both accounts at once, in the order the caller names them.
    #[redis_lock(prefix = "accounts", key = [from.id, to.id], wait = "10s", client = self.locks)]
    async fn transfer(
        &self,
        from: &Account,
        to: &Account,
        inside: Option<oneshot::Sender<Vec<String>>>,
        leave: Option<oneshot::Receiver<()>>,
    ) -> Result<Vec<String>, LockError> {
        let keys = LockContext::current().unwrap().keys().to_vec();
        if let Some(inside) = inside {
            let _ = inside.send(keys.clone());
        }
        if let Some(leave) = leave {
            let _ = leave.await;
        }
        Ok(keys)
    }
}

#[tokio::test]
async fn a_key_list_locks_every_key_and_opposite_calls_wait_for_each_other() {
    let server = RedisServer::start();
    let bank = Arc::new(Bank {
        locks: LockClient::builder(&server.url()).build().await.unwrap(),
    });
    let (a, b) = (Account { id: 1 }, Account { id: 2 });
    let (inside_tx, inside) = oneshot::channel();
    let (leave, leave_rx) = oneshot::channel();
    let first = tokio::spawn({
        let bank = bank.clone();
        async move {
            let (a, b) = (Account { id: 1 }, Account { id: 2 });
            bank.transfer(&a, &b, Some(inside_tx), Some(leave_rx)).await
        }
    });
    let keys = inside.await.unwrap();
    assert_eq!(keys, ["accounts:1", "accounts:2"]);
    for key in &keys {
        assert!(get(&server, key).await.is_some(), "`{key}` held");
    }
    // The opposite transfer waits for the first to finish, and then holds both.
    let opposite = tokio::spawn({
        let bank = bank.clone();
        async move { bank.transfer(&b, &a, None, None).await }
    });
    common::eventually(
        Duration::from_secs(5),
        "the opposite transfer parked",
        || async { bank.locks.waiting("accounts:2") == 1 },
    )
    .await;
    assert!(!opposite.is_finished());
    leave.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), keys);
    let reversed = tokio::time::timeout(Duration::from_secs(5), opposite)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(reversed, ["accounts:2", "accounts:1"]);
    for key in &keys {
        key_gone(&server, key, Duration::from_secs(2)).await;
    }
}
