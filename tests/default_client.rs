//! The process-wide default client keeps working across tokio runtimes created and dropped in turn.

use std::time::Duration;

use lockmacro_runtime::{LockContext, LockOptions, default_client};
use testkit::RedisServer;

#[test]
fn default_client_serves_three_runtimes_in_turn() {
    let server = RedisServer::start();
    // SAFETY: this test binary has a single test, so no other thread reads the environment.
    unsafe { std::env::set_var("REDIS_URL", server.url()) };

    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let renewals = runtime.block_on(async {
            let options = LockOptions::new()
                .ttl(Duration::from_millis(300))
                .unlimited_renewals();
            default_client()
                .unwrap()
                .run_locked(format!("rounds:{round}"), options, async {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    LockContext::current().unwrap().renewals()
                })
                .await
        });
        let renewals = renewals.unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert!(
            renewals >= 1,
            "round {round}: the watchdog outlives earlier runtimes"
        );
        drop(runtime);
    }
}
