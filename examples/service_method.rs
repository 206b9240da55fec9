//! `#[redis_lock]` on service methods: the client comes from `self`, the key from an argument.
//!
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run --example service_method`

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockError, redis_lock};

#[derive(Debug, Clone)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[derive(Debug)]
#[allow(dead_code)] // printed with Debug
struct Receipt {
    order_id: u64,
    charged_cents: u64,
}

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error("order {0} is already paid")]
    AlreadyPaid(u64),
    #[error(transparent)]
    Lock(#[from] LockError),
}

struct PaymentService {
    locks: LockClient,
    tenant: String,
}

impl PaymentService {
    /// At most one payment per order at a time across every instance of the service; a second
    /// attempt waits up to 2 s for the first to finish.
    #[redis_lock(prefix = "payments", key = order.id, client = self.locks, ttl = "5s", wait = "2s")]
    async fn pay(&self, order: &Order) -> Result<Receipt, PaymentError> {
        if order.amount_cents == 0 {
            return Err(PaymentError::AlreadyPaid(order.id));
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // the payment provider
        Ok(Receipt {
            order_id: order.id,
            charged_cents: order.amount_cents,
        })
    }

    /// One nightly settlement per tenant: the key comes from `self`, renewals are unlimited.
    #[redis_lock(prefix = "settlement", key = self.tenant, client = self.locks, ttl = 10, max_renewals = unlimited)]
    async fn settle(&mut self) -> Result<usize, LockError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(42)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut service = PaymentService {
        locks: LockClient::connect(&url).await?,
        tenant: "acme".into(),
    };
    let order = Order {
        id: 7,
        amount_cents: 1_999,
    };
    // Two concurrent payments of one order: the second waits for the first, then runs.
    let (a, b) = tokio::join!(service.pay(&order), service.pay(&order));
    println!("first:  {a:?}");
    println!("second: {b:?}");
    println!("settled: {:?}", service.settle().await?);
    Ok(())
}
