//! `lockmacro`: list, inspect, force-release and watch the locks lockmacro keeps in Redis.
//!
//! A thin layer of arguments and printing over the runtime's inspection API
//! ([`LockClient::list`], [`LockClient::inspect`], [`LockClient::force_release`],
//! [`LockClient::watch`], [`LockClient::health`]): it reaches every deployment the runtime does (one Redis, Sentinel,
//! a Cluster, a Redlock quorum) and reads locks through the runtime's one owner of their format.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use lockmacro_runtime::{Health, Holder, LockClient, LockError, LockEvent, LockInfo, LockKind};
use serde_json::json;

mod terminal;
use terminal::{escaped, json_line};

/// Look at and clear lockmacro's Redis locks: who holds a lock, for how long, who waits; free it.
#[derive(Parser)]
#[command(name = "lockmacro", version, after_help = EXIT_STATUS)]
struct Cli {
    /// Where the locks live: `redis://[user:password@]host:port[/db]`, `rediss://` for TLS
    /// (`#insecure` at the end skips certificate checks, for tests), or
    /// `redis+sentinel://host:26379[,host:26379]/service[/db]` (`rediss+sentinel://` for TLS)
    /// for the master the sentinels name. With `--cluster`, seed nodes of a Redis Cluster.
    /// Repeat `--url` once per master for a Redlock quorum (an odd number, at least 3).
    #[arg(
        long,
        env = "REDIS_URL",
        global = true,
        default_value = "redis://127.0.0.1:6379",
        value_delimiter = ' '
    )]
    url: Vec<String>,

    /// The URLs are nodes of a Redis Cluster: look at every master.
    #[arg(long, global = true)]
    cluster: bool,

    /// The namespace of the library's internal keys (`LockClientBuilder::namespace`).
    #[arg(long, global = true, default_value = "lockmacro")]
    namespace: String,

    /// A root certificate (PEM) to trust for `rediss://` instead of the system's roots.
    #[arg(long, global = true, value_name = "FILE")]
    tls_root: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

/// The exit statuses, as `--help` shows them.
const EXIT_STATUS: &str = "\
Exit status:
  0  done: the lock is held (inspect), released (release), listed or watched, the deployment ready (health)
  1  not held: `inspect` of a free key, `release` of a key nobody holds (or not confirmed); `health` not ready
  2  usage: bad arguments or configuration (a malformed URL, a cluster node without --cluster)
  3  error reaching or reading Redis (unreachable, refused, timed out, no Redlock majority)";

#[derive(Subcommand)]
enum Command {
    /// List held locks: key, kind, time left, holders (who holds it), and the callers waiting.
    ///
    /// Scans in bounded steps (SCAN … COUNT 1000), printing as it goes, so it never blocks
    /// Redis and never holds every key in memory, even over millions of keys. The library's
    /// internal keys, and keys that are not locks of this library, are not shown.
    List {
        /// Only locks whose key starts with `PREFIX:` (the attribute's `prefix`).
        #[arg(long)]
        prefix: Option<String>,
        /// Print a JSON array of objects (`key`, `kind`, `ttl_ms`, `holders` — each with
        /// `token_hint`, `ttl_ms`, `host`, `pid`, `app`, `acquired_at_ms` —, `waiters`,
        /// `fencing_token`).
        #[arg(long)]
        json: bool,
    },
    /// Show one lock: its kind, its holders (tokens masked; the application, process id and
    /// host that took it, and when), time left, fencing counter and the callers waiting. Exits
    /// 1 when nobody holds it.
    Inspect {
        /// The lock's full key, e.g. `Business1:1024`.
        key: String,
        /// Print one JSON object (`null` when nobody holds it).
        #[arg(long)]
        json: bool,
    },
    /// Remove every holder of a lock now and announce it: waiters take it at once, and the
    /// holder's work is cancelled with `Lost` within a second, whatever its ttl. Exits 1 when
    /// nobody held it.
    ///
    /// Only a holder whose Redis user may not subscribe to lockmacro's channels (an ACL without
    /// channel access) learns of it later, at its next renewal (within a third of its ttl).
    Release {
        /// The lock's full key.
        key: String,
        /// Required: releasing a lock someone holds is a forced act.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Print a line each time the lock is acquired or becomes free (released, expired or
    /// forced), until interrupted.
    Watch {
        /// The lock's full key.
        key: String,
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Ask every server of the deployment (each Redlock master, each cluster node) whether it
    /// answers and how fast. Exits 0 when locks can be taken, 1 when not, 3 when no server
    /// answers.
    Health {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(Exit::Error, &format!("cannot start: {error}")),
    };
    match runtime.block_on(run(cli)) {
        Ok(Done::Success) => ExitCode::SUCCESS,
        Ok(Done::Failure(exit, message)) => fail(exit, &message),
        Err(error) => fail(Exit::of(&error), &error.to_string()),
    }
}

/// How a command ended, when nothing failed.
enum Done {
    Success,
    /// Exit with this status and message: a free key inspected or released, a refusal.
    Failure(Exit, String),
}

/// The exit statuses other than success ([`EXIT_STATUS`]).
#[derive(Clone, Copy)]
enum Exit {
    /// The lock is not held (or not released); the deployment is not ready.
    NotHeld = 1,
    /// Bad arguments or configuration (clap's own usage errors exit 2 too).
    Usage = 2,
    /// Redis could not be reached or read.
    Error = 3,
}

impl Exit {
    /// A configuration the arguments made is a usage error; anything else came from Redis.
    fn of(error: &LockError) -> Self {
        match error {
            LockError::Config { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. } => Self::Usage,
            _ => Self::Error,
        }
    }
}

fn fail(exit: Exit, message: &str) -> ExitCode {
    // One line, whatever the error's sources say.
    let line: Vec<&str> = message.split_whitespace().collect();
    eprintln!("lockmacro: {}", escaped(&line.join(" ")));
    ExitCode::from(exit as u8)
}

async fn run(cli: Cli) -> Result<Done, LockError> {
    if let Command::Health { json } = cli.command {
        // Built without I/O: a deployment that does not answer is what `health` reports.
        return health(&builder(&cli)?.build_lazy()?, json).await;
    }
    let locks = builder(&cli)?.build().await?;
    match cli.command {
        Command::List { prefix, json } => list(&locks, prefix.as_deref().unwrap_or(""), json).await,
        Command::Inspect { key, json } => inspect(&locks, &key, json).await,
        Command::Release { key, force, yes } => release(&locks, &key, force, yes).await,
        Command::Watch { key, json } => watch(&locks, &key, json).await,
        Command::Health { json } => health(&locks, json).await,
    }
}

/// A client builder for the deployment the arguments name.
fn builder(cli: &Cli) -> Result<lockmacro_runtime::LockClientBuilder, LockError> {
    let urls: Vec<&str> = cli
        .url
        .iter()
        .map(|url| url.trim())
        .filter(|url| !url.is_empty())
        .collect();
    let builder = if cli.cluster {
        LockClient::cluster_builder(&urls)
    } else if urls.len() > 1 {
        LockClient::redlock_builder(&urls)
    } else {
        LockClient::builder(urls.first().copied().unwrap_or_default())
    };
    let mut builder = builder
        .namespace(cli.namespace.as_str())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5));
    if let Some(path) = &cli.tls_root {
        let pem = std::fs::read(path).map_err(|error| LockError::Config {
            message: format!("cannot read the TLS root `{}`: {error}", path.display()),
        })?;
        builder = builder.tls_root_certificate(pem);
    }
    Ok(builder)
}

fn kind_name(kind: LockKind) -> String {
    match kind {
        LockKind::Read => "read".to_owned(),
        LockKind::Permits(permits) => format!("permits:{permits}"),
        _ => "exclusive".to_owned(),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn seconds(duration: Duration) -> String {
    format!("{:.3} s", duration.as_secs_f64())
}

/// Who a holder is: `app (pid N) on host`, or that its lock's value does not say (a lock taken
/// by an older version).
fn who(holder: &Holder) -> String {
    match (holder.app(), holder.pid(), holder.host()) {
        (Some(app), Some(pid), Some(host)) => format!("{app} (pid {pid}) on {host}"),
        _ => "unknown (taken by an older version)".to_owned(),
    }
}

/// How long ago a holder took its lock, by this machine's clock.
fn since(holder: &Holder) -> Option<String> {
    let acquired = holder.acquired_at()?;
    let ago = std::time::SystemTime::now()
        .duration_since(acquired)
        .unwrap_or_default();
    Some(format!("{} ago", seconds(ago)))
}

/// When a holder took its lock, ms since the Unix epoch.
fn acquired_at_ms(holder: &Holder) -> Option<u64> {
    let since = holder
        .acquired_at()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(millis(since))
}

/// A holder as JSON: `token_hint`, `ttl_ms`, and who took it when (`null` when its value does
/// not say).
fn holder_json(holder: &Holder) -> serde_json::Value {
    json!({
        "token_hint": holder.token_hint(),
        "ttl_ms": millis(holder.time_left()),
        "host": holder.host(),
        "pid": holder.pid(),
        "app": holder.app(),
        "acquired_at_ms": acquired_at_ms(holder),
    })
}

fn as_json(lock: &LockInfo) -> serde_json::Value {
    let holders: Vec<serde_json::Value> = lock.holders().iter().map(holder_json).collect();
    json!({
        "key": lock.key(),
        "kind": kind_name(lock.kind()),
        "ttl_ms": millis(lock.time_left()),
        "holders": holders,
        "waiters": lock.waiters(),
        "fencing_token": lock.fencing_token(),
    })
}

/// Writes one line of human output, its control characters escaped ([`escaped`]).
fn say(out: &mut impl Write, line: &str) -> Result<(), LockError> {
    written(writeln!(out, "{}", escaped(line)))
}

fn written(result: std::io::Result<()>) -> Result<(), LockError> {
    result.map_err(|error| LockError::Config {
        message: format!("cannot write the output: {error}"),
    })
}

/// Prints the locks as they are scanned: one page at a time is in memory.
async fn list(locks: &LockClient, prefix: &str, json: bool) -> Result<Done, LockError> {
    let mut out = std::io::stdout().lock();
    let mut listed = locks.list(prefix);
    let mut count = 0usize;
    if json {
        written(write!(out, "["))?;
    }
    while let Some(lock) = listed.next().await {
        let lock = match lock {
            Ok(lock) => lock,
            Err(error) => {
                if json {
                    // What was printed stays one JSON value; the exit status says it is cut short.
                    written(writeln!(out, "]"))?;
                }
                return Err(error);
            }
        };
        if json {
            let separator = if count == 0 { "" } else { "," };
            written(write!(out, "{separator}{}", json_line(&as_json(&lock))))?;
        } else {
            if count == 0 {
                written(writeln!(
                    out,
                    "{:40}  {:12}  {:>12}  {:>7}  {:>7}  HELD BY",
                    "KEY", "KIND", "TIME LEFT", "HOLDERS", "WAITERS"
                ))?;
            }
            let held_by = match lock.holders() {
                [holder] => who(holder),
                holders => format!("{} holders", holders.len()),
            };
            written(writeln!(
                out,
                "{:40}  {:12}  {:>12}  {:>7}  {:>7}  {}",
                escaped(lock.key()),
                kind_name(lock.kind()),
                seconds(lock.time_left()),
                lock.holders().len(),
                lock.waiters(),
                escaped(&held_by),
            ))?;
        }
        count += 1;
    }
    if json {
        written(writeln!(out, "]"))?;
    } else if count == 0 {
        written(writeln!(out, "no locks held"))?;
    }
    Ok(Done::Success)
}

async fn inspect(locks: &LockClient, key: &str, json: bool) -> Result<Done, LockError> {
    let found = locks.inspect(key).await?;
    let mut out = std::io::stdout().lock();
    let Some(lock) = found else {
        if json {
            written(writeln!(out, "null"))?;
        }
        return Ok(Done::Failure(Exit::NotHeld, format!("`{key}` is not held")));
    };
    if json {
        written(writeln!(out, "{}", json_line(&as_json(&lock))))?;
        return Ok(Done::Success);
    }
    let mut lines = vec![
        format!("key:        {}", lock.key()),
        format!("kind:       {}", kind_name(lock.kind())),
        format!("time left:  {}", seconds(lock.time_left())),
    ];
    if lock.kind() == LockKind::Exclusive
        && let Some(holder) = lock.holders().first()
    {
        lines.push(format!(
            "holder:     {}…  {}",
            holder.token_hint(),
            who(holder)
        ));
        if let Some(since) = since(holder) {
            lines.push(format!("acquired:   {since}"));
        }
    } else {
        lines.push(format!("holders:    {}", lock.holders().len()));
        for holder in lock.holders() {
            let since = since(holder).map_or(String::new(), |since| format!(", acquired {since}"));
            lines.push(format!(
                "  {}…  {} left  {}{since}",
                holder.token_hint(),
                seconds(holder.time_left()),
                who(holder),
            ));
        }
    }
    lines.push(format!(
        "fencing:    {}",
        lock.fencing_token()
            .map_or("none".to_owned(), |fence| fence.to_string())
    ));
    lines.push(format!("waiters:    {}", lock.waiters()));
    for line in lines {
        say(&mut out, &line)?;
    }
    Ok(Done::Success)
}

async fn release(locks: &LockClient, key: &str, force: bool, yes: bool) -> Result<Done, LockError> {
    if !force {
        return Ok(Done::Failure(
            Exit::Usage,
            format!(
                "refusing to release `{key}` without --force: its holder's work would be cancelled with `Lost`"
            ),
        ));
    }
    if !yes && std::io::stdin().is_terminal() {
        let Some(lock) = locks.inspect(key).await? else {
            return Ok(Done::Failure(
                Exit::NotHeld,
                format!("`{key}` is not held; nothing released"),
            ));
        };
        let hints: Vec<String> = lock
            .holders()
            .iter()
            .map(|holder| format!("{}…, {}", holder.token_hint(), who(holder)))
            .collect();
        let question = format!(
            "Release `{key}` ({}, held by {})? [y/N] ",
            kind_name(lock.kind()),
            hints.join(", ")
        );
        eprint!("{}", escaped(&question));
        let mut answer = String::new();
        if std::io::stdin().lock().read_line(&mut answer).is_err()
            || !matches!(answer.trim(), "y" | "Y" | "yes")
        {
            return Ok(Done::Failure(Exit::NotHeld, "not released".to_owned()));
        }
    }
    if locks.force_release(key).await? {
        say(
            &mut std::io::stdout().lock(),
            &format!("{key}: released; its holder gets `Lost` within a second"),
        )?;
        Ok(Done::Success)
    } else {
        Ok(Done::Failure(
            Exit::NotHeld,
            format!("`{key}` is not held; nothing released"),
        ))
    }
}

async fn watch(locks: &LockClient, key: &str, json: bool) -> Result<Done, LockError> {
    let started = Instant::now();
    eprintln!("{}", escaped(&format!("watching `{key}` (Ctrl-C to stop)")));
    let mut events = locks.watch(key);
    loop {
        let event = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(Done::Success),
            event = events.next() => event,
        };
        let Some(event) = event else {
            return Ok(Done::Success);
        };
        let at_ms = millis(started.elapsed());
        let at = at_ms as f64 / 1000.0;
        let line = match event? {
            LockEvent::Acquired { holder, .. } if json => json_line(&json!({
                "event": "acquired",
                "key": key,
                "token_hint": holder.token_hint(),
                "holder": holder_json(&holder),
                "at_ms": at_ms,
            })),
            LockEvent::Acquired { token_hint, holder } => escaped(&format!(
                "{at:9.3}s  {key}  acquired by {token_hint}…  {}",
                who(&holder)
            ))
            .into_owned(),
            LockEvent::Released if json => {
                json_line(&json!({"event": "released", "key": key, "at_ms": at_ms}))
            }
            LockEvent::Released => escaped(&format!("{at:9.3}s  {key}  released")).into_owned(),
            _ => continue,
        };
        let mut out = std::io::stdout().lock();
        written(writeln!(out, "{line}").and_then(|()| out.flush()))?;
    }
}

/// Prints every server's answer; exit 0 when ready, 1 when not, 3 when none answers.
async fn health(locks: &LockClient, json: bool) -> Result<Done, LockError> {
    let health = locks.health().await;
    let mut out = std::io::stdout().lock();
    if json {
        written(writeln!(out, "{}", json_line(&health_json(&health))))?;
    } else {
        for line in health.to_string().lines() {
            say(&mut out, line)?;
        }
    }
    Ok(match (health.is_ready(), health.answering()) {
        (true, _) => Done::Success,
        (false, 0) => Done::Failure(
            Exit::Error,
            format!("no server answers: {}", health.verdict()),
        ),
        (false, _) => Done::Failure(Exit::NotHeld, format!("not ready: {}", health.verdict())),
    })
}

fn health_json(health: &Health) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = health
        .nodes()
        .iter()
        .map(|node| {
            json!({
                "address": node.address(),
                "role": node.role().to_string(),
                "answers": node.answers(),
                "latency_ms": node.latency().map(|latency| latency.as_secs_f64() * 1e3),
                "error": node.error(),
                "slots": node.slots(),
            })
        })
        .collect();
    json!({
        "deployment": health.deployment(),
        "ready": health.is_ready(),
        "verdict": health.verdict(),
        "nodes": nodes,
    })
}
