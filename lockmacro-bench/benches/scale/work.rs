//! What Redis and this process did over a phase of a curve (taking leases, releasing them,
//! listing keys): CPU of both, and each command's calls and time in Redis, which tell where the
//! time of a phase went.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::measure::{process_cpu, process_cpu_of};

/// What Redis and this process had done by a moment: CPU, and each command's calls and time.
pub struct Work {
    at: Instant,
    client_cpu: Duration,
    server_cpu: Duration,
    /// Per command: calls, and microseconds Redis spent in them.
    commands: HashMap<String, (u64, u64)>,
}

impl Work {
    pub async fn read(connection: &mut redis::aio::MultiplexedConnection, server_pid: u32) -> Self {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(connection)
            .await
            .expect("INFO commandstats");
        let field = |fields: &str, name: &str| -> Option<u64> {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        let commands = info
            .lines()
            .filter_map(|line| {
                let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = field(fields, "calls")?;
                let usec = field(fields, "usec")?;
                Some((name.to_owned(), (calls, usec)))
            })
            .collect();
        Self {
            at: Instant::now(),
            client_cpu: process_cpu(),
            server_cpu: process_cpu_of(server_pid),
            commands,
        }
    }

    /// What was done between `before` and `self`, as figures.
    pub fn since(&self, before: &Work) -> Value {
        let wall = (self.at - before.at).as_secs_f64();
        let share = |cpu: Duration| cpu.as_secs_f64() / wall * 100.0;
        let mut commands = serde_json::Map::new();
        for (name, &(calls, usec)) in &self.commands {
            let (calls_before, usec_before) = before.commands.get(name).copied().unwrap_or((0, 0));
            let (calls, usec) = (calls - calls_before, usec - usec_before);
            if calls > 0 && name != "info" {
                commands.insert(
                    name.clone(),
                    json!({"calls": calls, "redis_s": usec as f64 / 1e6,
                        "usec_per_call": usec as f64 / calls as f64}),
                );
            }
        }
        json!({
            "wall_s": wall,
            "client_cpu_percent": share(self.client_cpu - before.client_cpu),
            "redis_cpu_percent": share(self.server_cpu - before.server_cpu),
            "commands": commands,
        })
    }
}
