//! Generated transfers between accounts, the case `key = [from, to]` is for: random transfers
//! between random accounts, made at once by two clients (as two processes would), each a
//! read-modify-write of two balances stored in plain Redis keys, under a lock over both
//! accounts. Opposite transfers (`[a, b]` and `[b, a]`) run side by side: none may deadlock (each
//! case has a deadline) and no update may be lost (every balance ends exactly where the
//! transfers put it, so the total is unchanged). Without the lock the interleaved
//! read-modify-writes lose updates.

mod common;

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockOptions};
use proptest::prelude::*;
use redis::AsyncCommands;
use testkit::{Deployment, SingleRedis};

const ACCOUNTS: usize = 4;
const OPENING: i64 = 100;

#[derive(Debug, Clone)]
struct Transfer {
    client: usize,
    from: usize,
    to: usize,
    amount: i64,
    start: Duration,
}

fn transfers() -> impl Strategy<Value = Vec<Transfer>> {
    let transfer = (0usize..2, 0..ACCOUNTS, 0..ACCOUNTS, 1i64..=20, 0u64..20).prop_map(
        |(client, from, to, amount, start)| Transfer {
            client,
            from,
            to,
            amount,
            start: Duration::from_millis(start),
        },
    );
    prop::collection::vec(transfer, 2..=12)
}

/// Runs `transfers` at once on `clients`, balances under `bank`; the balances at the end.
async fn run(
    redis: &redis::aio::MultiplexedConnection,
    clients: &[LockClient],
    bank: &str,
    transfers: &[Transfer],
) -> Vec<i64> {
    let balance = |account: usize| format!("{bank}:balance:{account}");
    let mut connection = redis.clone();
    for account in 0..ACCOUNTS {
        let () = connection.set(balance(account), OPENING).await.unwrap();
    }
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = transfers
        .iter()
        .cloned()
        .map(|transfer| {
            let (locks, mut connection) = (clients[transfer.client].clone(), redis.clone());
            let (from, to) = (balance(transfer.from), balance(transfer.to));
            let keys = [transfer.from, transfer.to].map(|account| format!("{bank}:{account}"));
            tokio::spawn(async move {
                tokio::time::sleep_until(started + transfer.start).await;
                let options = LockOptions::new()
                    .ttl(Duration::from_secs(5))
                    .wait(Duration::from_secs(30));
                locks
                    .run_locked_many(keys, options, async {
                        // Read, pause, write: another writer in between would be overwritten.
                        let left: i64 = connection.get(&from).await.unwrap();
                        tokio::task::yield_now().await;
                        let () = connection.set(&from, left - transfer.amount).await.unwrap();
                        let right: i64 = connection.get(&to).await.unwrap();
                        tokio::task::yield_now().await;
                        let () = connection.set(&to, right + transfer.amount).await.unwrap();
                    })
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap()
            .expect("every transfer gets both accounts");
    }
    let mut balances = Vec::new();
    for account in 0..ACCOUNTS {
        balances.push(connection.get(balance(account)).await.unwrap());
    }
    balances
}

/// The balances the transfers make, in any order.
fn expected(transfers: &[Transfer]) -> Vec<i64> {
    let mut balances = vec![OPENING; ACCOUNTS];
    for transfer in transfers {
        balances[transfer.from] -= transfer.amount;
        balances[transfer.to] += transfer.amount;
    }
    balances
}

#[test]
fn transfers_in_two_processes_never_deadlock_and_lose_no_update() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = SingleRedis::start();
    let (clients, connection) = runtime.block_on(async {
        let clients = vec![redis.client().await, redis.another_client().await];
        (clients, redis.server.connection().await)
    });
    let ran = common::run_generated("transfers", 32, 32, &transfers(), |case, transfers| {
        let bank = format!("bank{case}");
        let run = run(&connection, &clients, &bank, &transfers);
        let balances = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(60), run).await })
            .map_err(|_| TestCaseError::fail("the transfers deadlocked"))?;
        let total: i64 = balances.iter().sum();
        prop_assert_eq!(total, OPENING * ACCOUNTS as i64, "the total changed");
        prop_assert_eq!(balances, expected(&transfers));
        Ok(())
    });
    eprintln!("{ran} generated cases of transfers");
}
