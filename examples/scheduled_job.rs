//! A scheduled job run once per period by three processes whose timers fire a little apart
//! (ShedLock's `lockAtLeastFor`): `hold_at_least` keeps the job's key after the job is done, so
//! a process that fires late finds it busy and skips the period instead of running it again.
//!
//! Run with `cargo run --example scheduled_job` (Redis at `REDIS_URL`, by default
//! `redis://127.0.0.1:6379`). Three clients, as three processes would have, each run the job
//! on a 2 s `tokio::time::interval`, 200 ms after one another; the job takes 50 ms. It prints,
//! period by period, which process ran the job and which skipped it, and ends after four
//! periods (exit code 1 if a period ran the job other than once). Without `hold_at_least` the
//! key would be free 50 ms into each period, and every process would run the job.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, redis_lock};

const PERIOD: Duration = Duration::from_secs(2);
const APART: Duration = Duration::from_millis(200);
const PERIODS: u32 = 4;

/// One of the processes.
struct Process {
    name: char,
    locks: LockClient,
    started: Instant,
    /// Which process ran the job, per period: shared here only to check the run at its end.
    runs: Arc<Mutex<Vec<(u32, char)>>>,
}

impl Process {
    /// The job: at most once per period across the processes. It is held at least 1.5 s from
    /// the moment it was taken, whenever it ends: longer than the processes' timers are apart,
    /// shorter than a period.
    #[redis_lock(prefix = "jobs", key = run, hold_at_least = "1500ms", client = self.locks)]
    async fn report(&self, run: u32, period: u32) -> Result<(), LockError> {
        self.say(&format!("period {period}: ran the job"));
        self.runs.lock().unwrap().push((period, self.name));
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    }

    async fn schedule(&self, run: u32) -> Result<(), LockError> {
        let mut timer = tokio::time::interval(PERIOD);
        for period in 1..=PERIODS {
            timer.tick().await;
            match self.report(run, period).await {
                Ok(()) => {}
                Err(LockError::Busy { retry_after, .. }) => self.say(&format!(
                    "period {period}: skipped, already run (free again in {:?})",
                    retry_after.unwrap_or_default()
                )),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn say(&self, line: &str) {
        let at = self.started.elapsed().as_secs_f64();
        println!("[{at:>5.2}s] process {}: {line}", self.name);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // One key per run of the example, so that a run right after another starts afresh.
    let run = std::process::id();
    let started = Instant::now();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut processes = tokio::task::JoinSet::new();
    for (offset, name) in (0u32..).zip(['A', 'B', 'C']) {
        let process = Process {
            name,
            locks: LockClient::connect(&url).await?,
            started,
            runs: runs.clone(),
        };
        processes.spawn(async move {
            tokio::time::sleep(APART * offset).await;
            process.schedule(run).await
        });
    }
    while let Some(finished) = processes.join_next().await {
        finished??;
    }
    let runs = runs.lock().unwrap();
    let once_each =
        (1..=PERIODS).all(|period| runs.iter().filter(|(p, _)| *p == period).count() == 1);
    println!("{} runs in {PERIODS} periods: {runs:?}", runs.len());
    if !once_each {
        eprintln!("a period ran the job other than once");
        std::process::exit(1);
    }
    Ok(())
}
