//! What every workload measures with: percentiles and medians, the round trip to Redis, Redis's
//! own command counters, and this process's CPU time and memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

/// How many times each compared system runs in a workload, interleaved A B A B …; figures are
/// the medians over these repetitions, which damps the noise of a shared machine.
pub const REPS: usize = 5;

/// The `q`-quantile (0..=1) of `values`, nearest rank; `NaN` when there are none.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of one figure over the repetitions.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.into_iter().collect();
    percentile(&values, 0.5)
}

pub fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// Per-operation latencies of one run, in microseconds.
#[derive(Default)]
pub struct Latencies(Vec<f64>);

impl Latencies {
    pub fn record(&mut self, took: Duration) {
        self.0.push(micros(took));
    }

    pub fn extend(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    pub fn p50(&self) -> f64 {
        percentile(&self.0, 0.5)
    }

    pub fn p99(&self) -> f64 {
        percentile(&self.0, 0.99)
    }
}

/// The median `PING` round trip on `connection`: the unit handoff latency is expressed in.
pub async fn ping_rtt(connection: &mut MultiplexedConnection) -> Duration {
    let mut rtts = Vec::with_capacity(200);
    for _ in 0..200 {
        let sent = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(connection)
            .await
            .expect("PING");
        rtts.push(micros(sent.elapsed()));
    }
    Duration::from_secs_f64(percentile(&rtts, 0.5) / 1e6)
}

/// `INFO commandstats`: calls per command since the server started.
#[derive(Clone, Default)]
pub struct CommandStats(HashMap<String, u64>);

/// Commands the benchmark itself sends to read its figures, left out of every count.
const OURS: [&str; 2] = ["info", "ping"];

impl CommandStats {
    pub async fn read(connection: &mut MultiplexedConnection) -> Self {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(connection)
            .await
            .expect("INFO commandstats");
        let stats = info
            .lines()
            .filter_map(|line| {
                let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = fields.strip_prefix("calls=")?.split(',').next()?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect();
        Self(stats)
    }

    /// Calls of `command` between `before` and `self`.
    pub fn since(&self, before: &CommandStats, command: &str) -> u64 {
        let calls = |stats: &CommandStats| stats.0.get(command).copied().unwrap_or(0);
        calls(self).saturating_sub(calls(before))
    }

    /// Every command Redis ran between `before` and `self`, those scripts ran inside included
    /// (a script call counts itself and each command it runs); the benchmark's own left out.
    pub fn commands_since(&self, before: &CommandStats) -> u64 {
        self.0
            .keys()
            .filter(|command| !OURS.contains(&command.as_str()))
            .map(|command| self.since(before, command))
            .sum()
    }
}

/// The process id of the server `connection` talks to, from `INFO server`.
pub async fn server_pid(connection: &mut MultiplexedConnection) -> u32 {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(connection)
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:")?.trim().parse().ok())
        .expect("process_id in INFO server")
}

/// CPU time (user + system) of process `pid` so far, from `/proc` (10 ms resolution).
pub fn process_cpu_of(pid: u32) -> Duration {
    cpu_from_stat(&format!("/proc/{pid}/stat"))
}

/// CPU time (user + system) of this process so far.
pub fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The ids of this process's threads named `name` (as `/proc/self/task/*/comm` shows it).
pub fn threads_named(name: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| {
            let task = task.ok()?;
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            (comm.trim_end() == name).then(|| task.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

/// CPU time (user + system) of thread `tid` of this process so far, from `/proc`.
pub fn thread_cpu(tid: u32) -> Duration {
    cpu_from_stat(&format!("/proc/self/task/{tid}/stat"))
}

/// User + system CPU time in a `/proc/…/stat` file.
fn cpu_from_stat(path: &str) -> Duration {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the parenthesised name: state is field 3, utime 14 and stime 15.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: `sysconf` has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64(ticks as f64 / per_second)
}

/// Heap bytes this process has allocated and not freed (glibc's `mallinfo2`, every arena):
/// unlike resident memory, it does not read zero when freed memory of an earlier workload is
/// reused.
pub fn heap_in_use() -> u64 {
    // SAFETY: `mallinfo2` has no preconditions; it only reads the allocator's counters.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

/// Resident memory of this process in bytes, from `/proc/self/statm`.
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse().ok())
        .unwrap_or(0);
    // SAFETY: `sysconf` has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    pages * page
}
