//! `#[redis_lock]` on an axum 0.8 handler: one request per user at a time, 409 for the others.
//!
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum_handler`, then
//! `curl -X POST localhost:3000/users/1024/books` twice at once: one 200, one 409 Conflict.
//!
//! It starts whether Redis is up or not (`build_lazy`: no I/O until the first lock): while Redis
//! is down, locked requests answer 503 Service Unavailable, and they work again once it is back.
//!
//! On SIGTERM (or Ctrl-C) it shuts down gracefully: the lock client first (work still holding a
//! lock is cancelled with a 503 and every lock released at once, instead of staying held for its
//! ttl), then the server.
//!
//! With `ADMIN_AUTHORIZATION` set, the live locks page is at
//! <http://127.0.0.1:3000/admin/locks>, behind the app's own auth layer (here HTTP Basic: set
//! it to `Basic $(printf admin:secret | base64)`, and the browser asks for `admin` / `secret`).
//! It lists the `borrow` locks with their holders and waiters, follows one live, and can
//! force-release one after a confirmation. Without it, there is no admin route at all.

use std::time::Duration;

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use lockmacro_runtime::axum::locks_page;
use lockmacro_runtime::{LockClient, LockError, redis_lock};

#[derive(Clone)]
struct AppState {
    locks: LockClient,
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("user {0} not found")]
    NotFound(u64),
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            // 409 Conflict when busy, 500 for a misconfigured lock, 503 otherwise (Redis
            // down: try again later), with the key in the body.
            AppError::Lock(lock) => lock.into_response(),
            AppError::NotFound(_) => (StatusCode::NOT_FOUND, self.to_string()).into_response(),
        }
    }
}

/// Borrows a book for a user. If the client hangs up, axum drops this future and the lock is
/// released in the background at once.
#[redis_lock(prefix = "borrow", key = user_id, client = state.locks, ttl = 3)]
async fn borrow_book(
    State(state): State<AppState>,
    Path(user_id): Path<u64>,
) -> Result<Json<String>, AppError> {
    if user_id == 0 {
        return Err(AppError::NotFound(user_id));
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // the slow part
    Ok(Json(format!("book lent to user {user_id}")))
}

/// The application's routes; the locks page under `/admin` when `admin_authorization` (the
/// `Authorization` header an operator must send) is given.
fn app(state: AppState, admin_authorization: Option<String>) -> Router {
    let app = Router::new()
        .route("/users/{user_id}/books", post(borrow_book))
        .with_state(state.clone());
    let Some(expected) = admin_authorization else {
        return app;
    };
    let admin = Router::new()
        // `nest_service`: `/admin/locks` and `/admin/locks/` both answer.
        .nest_service(
            "/locks",
            locks_page(state.locks)
                .prefixes(["borrow"])
                .force_release(true)
                .router(),
        )
        // The page checks no credentials itself: the app's auth layer guards every route of it.
        .layer(middleware::from_fn_with_state(
            Arc::<str>::from(expected),
            admins_only,
        ));
    app.nest("/admin", admin)
}

/// The app's own auth check, here HTTP Basic against one expected header (a real app uses its
/// sessions or its identity provider). A browser asks for the password on the 401.
async fn admins_only(State(expected): State<Arc<str>>, request: Request, next: Next) -> Response {
    let given = request.headers().get(header::AUTHORIZATION);
    if given.is_some_and(|given| given.as_bytes() == expected.as_bytes()) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, r#"Basic realm="admin""#)],
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Lazy: the app starts (and answers 503 on locked routes) even while Redis is down; a
    // malformed URL is still refused here.
    let locks = LockClient::builder(&url).build_lazy()?;
    let state = AppState {
        locks: locks.clone(),
    };
    let admin_authorization = std::env::var("ADMIN_AUTHORIZATION").ok();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    if admin_authorization.is_some() {
        println!("locks page: http://{}/admin/locks", listener.local_addr()?);
    }
    axum::serve(listener, app(state, admin_authorization))
        .with_graceful_shutdown(async move {
            terminated().await;
            // Before the server waits for its requests: the locked ones end now, their locks
            // released, rather than holding up the exit (or their locks) for a whole lease.
            if let Err(error) = locks.shutdown().await {
                eprintln!("lock client shutdown: {error}");
            }
        })
        .await?;
    Ok(())
}

/// SIGTERM (how a deploy stops a service) or Ctrl-C.
async fn terminated() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
