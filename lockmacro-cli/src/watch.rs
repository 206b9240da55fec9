//! `lockmacro watch`: a lock's holders as they come and go, through Redis going away and back.

use std::io::Write;
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockEvent};
use serde_json::json;

use super::{Done, Failure, escaped, holder_json, json_line, millis, who, written};

/// Follows `key` until interrupted. While Redis is away (a restart, a failover, a network cut)
/// it says so once, waits for Redis with a growing pause, says when it answers again, and goes
/// on; only a failure that waiting cannot mend (a password refused, a port that is not Redis)
/// ends it.
pub(crate) async fn watch(locks: &LockClient, key: &str, json: bool) -> Result<Done, Failure> {
    let started = Instant::now();
    eprintln!("{}", escaped(&format!("watching `{key}` (Ctrl-C to stop)")));
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut events = locks.watch(key);
    let mut outage = Outage::default();
    loop {
        let event = tokio::select! {
            _ = &mut interrupted => return Ok(Done::Success),
            event = events.next() => event,
        };
        let Some(event) = event else {
            return Ok(Done::Success);
        };
        let at_ms = millis(started.elapsed());
        let at = at_ms as f64 / 1000.0;
        let line = match event {
            Err(error) if error.is_transient() => {
                let lost = Failure::from(error);
                notice(
                    json,
                    json!({"event": "disconnected", "key": key, "error": lost.json_error(), "at_ms": at_ms}),
                    &format!(
                        "lost Redis while watching `{key}`: {}; following again once it answers",
                        lost.message
                    ),
                )?;
                tokio::select! {
                    _ = &mut interrupted => return Ok(Done::Success),
                    back = outage.wait(locks, key) => back?,
                }
                let at_ms = millis(started.elapsed());
                notice(
                    json,
                    json!({"event": "reconnected", "key": key, "at_ms": at_ms}),
                    &format!("Redis answers again; following `{key}`"),
                )?;
                continue;
            }
            Err(error) => return Err(error.into()),
            Ok(LockEvent::Acquired { holder, .. }) if json => json_line(&json!({
                "event": "acquired",
                "key": key,
                "token_hint": holder.token_hint(),
                "holder": holder_json(&holder),
                "at_ms": at_ms,
            })),
            Ok(LockEvent::Acquired { token_hint, holder }) => escaped(&format!(
                "{at:9.3}s  {key}  acquired by {token_hint}…  {}",
                who(&holder)
            ))
            .into_owned(),
            Ok(LockEvent::Released) if json => {
                json_line(&json!({"event": "released", "key": key, "at_ms": at_ms}))
            }
            Ok(LockEvent::Released) => escaped(&format!("{at:9.3}s  {key}  released")).into_owned(),
            Ok(_) => continue,
        };
        let mut out = std::io::stdout().lock();
        written(writeln!(out, "{line}").and_then(|()| out.flush()))?;
    }
}

/// A notice of the watch itself: a line on stderr, and under `--json` an event line on stdout.
fn notice(json: bool, event: serde_json::Value, said: &str) -> Result<(), Failure> {
    eprintln!("lockmacro: {}", escaped(said));
    if json {
        let mut out = std::io::stdout().lock();
        written(writeln!(out, "{}", json_line(&event)).and_then(|()| out.flush()))?;
    }
    Ok(())
}

/// How a watch waits for Redis to come back: a pause that doubles from [`FIRST_PAUSE`] to
/// [`LONGEST_PAUSE`] between looks, starting over once Redis has answered for a while (so a
/// server that keeps dropping the watch is not asked ever faster).
#[derive(Default)]
struct Outage {
    pause: Duration,
    back_since: Option<Instant>,
}

const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

impl Outage {
    /// Returns once Redis answers a look at `key` again; a failure waiting cannot mend ends it.
    async fn wait(&mut self, locks: &LockClient, key: &str) -> Result<(), Failure> {
        if self
            .back_since
            .is_none_or(|since| since.elapsed() > 10 * LONGEST_PAUSE)
        {
            self.pause = FIRST_PAUSE;
        }
        loop {
            tokio::time::sleep(self.pause).await;
            self.pause = (self.pause * 2).min(LONGEST_PAUSE);
            match locks.inspect(key).await {
                Ok(_) => {
                    self.back_since = Some(Instant::now());
                    return Ok(());
                }
                Err(error) if error.is_transient() => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
}
