//! `lockmacro`: list, inspect, force-release and watch the locks lockmacro keeps in Redis.
//!
//! A thin layer of arguments and printing over the runtime's inspection API
//! ([`LockClient::list`], [`LockClient::inspect`], [`LockClient::force_release`],
//! [`LockClient::watch`], [`LockClient::health`]): it reaches every deployment the runtime does (one Redis, Sentinel,
//! a Cluster, a Redlock quorum) and reads locks through the runtime's one owner of their format.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lockmacro_runtime::{Health, Holder, LockClient, LockError, LockInfo, LockKind, NodeHealth};
use serde_json::json;

mod terminal;
mod urls;
mod watch;
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

    /// Print JSON on stdout, always one value, failures included: `list` an array, `inspect` an
    /// object (`null` when free), `release` `{"key", "released"}`, `watch` one object per line,
    /// `health` an object; an error is `{"error": {"kind", "message"}}` (kind `usage`,
    /// `unavailable` or `refused`).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

/// The exit statuses, as `--help` shows them.
const EXIT_STATUS: &str = "\
Exit status:
  0  done: the lock is held (inspect), released (release), listed or watched, the deployment ready (health)
  1  not held: `inspect` of a free key, `release` of a key nobody holds (or not confirmed); `health` not ready
  2  usage: bad arguments or configuration (a malformed URL, a cluster node without --cluster)
  3  error reaching or reading Redis (unreachable, refused, timed out, no Redlock majority)
With --json, stdout holds one JSON value whatever the status (an error: {\"error\": {...}}).";

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
    },
    /// Show one lock: its kind, its holders (tokens masked; the application, process id and
    /// host that took it, and when), time left, fencing counter and the callers waiting. Exits
    /// 1 when nobody holds it.
    Inspect {
        /// The lock's full key, e.g. `Business1:1024`.
        key: String,
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
    ///
    /// While Redis is away (a restart, a failover) it says so on stderr and follows the lock
    /// again once Redis answers (looking after 0.2 s, then pauses doubling up to 5 s); only a
    /// refusal that waiting cannot mend (a password, an ACL, not Redis) ends it, with status 3.
    Watch {
        /// The lock's full key.
        key: String,
    },
    /// Ask every server of the deployment (each Redlock master, each cluster node) whether it
    /// answers and how fast, or refuses (a password, not Redis). Exits 0 when locks can be
    /// taken, 1 when not, 3 when no server answers.
    Health,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage(&error),
    };
    let json = cli.json;
    let ended = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(error) => Err(Failure::new(
            Exit::Error,
            "unavailable",
            format!("cannot start: {error}"),
        )),
    };
    match ended {
        Ok(Done::Success) => ExitCode::SUCCESS,
        Ok(Done::Failure(exit, message)) => fail(exit, &message),
        Err(failure) => {
            if json {
                // Nothing else is on stdout: a listing cut short printed its error itself.
                let _ = writeln!(std::io::stdout(), "{}", failure.json());
            }
            fail(failure.exit, &failure.message)
        }
    }
}

/// How a command ended, when nothing failed; its output (JSON included) is printed.
enum Done {
    Success,
    /// Exit with this status and message: a free key inspected or released, not ready.
    Failure(Exit, String),
}

/// Why a command could not do its job: the exit status, what kind of failure it is (what to do
/// about it), and what to say.
struct Failure {
    exit: Exit,
    kind: &'static str,
    message: String,
}

impl Failure {
    fn new(exit: Exit, kind: &'static str, message: String) -> Self {
        Self {
            exit,
            kind,
            message,
        }
    }

    fn usage(message: String) -> Self {
        Self::new(Exit::Usage, "usage", message)
    }

    /// `{"error": {"kind", "message"}}`: `usage` (fix the command), `unavailable` (trying again
    /// later may succeed), `refused` (someone must act: a password, an ACL, a port that is not
    /// Redis).
    fn json(&self) -> String {
        json_line(&json!({ "error": self.json_error() }))
    }

    /// `{"kind", "message"}`.
    fn json_error(&self) -> serde_json::Value {
        json!({"kind": self.kind, "message": self.message})
    }
}

impl From<LockError> for Failure {
    fn from(error: LockError) -> Self {
        let message = error.to_string();
        match error {
            LockError::Config { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. } => Self::usage(message),
            _ if error.is_transient() => Self::new(Exit::Error, "unavailable", message),
            _ => Self::new(Exit::Error, "refused", message),
        }
    }
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

fn fail(exit: Exit, message: &str) -> ExitCode {
    // One line, whatever the error's sources say.
    let line: Vec<&str> = message.split_whitespace().collect();
    eprintln!("lockmacro: {}", escaped(&line.join(" ")));
    ExitCode::from(exit as u8)
}

/// Clap's answer to the arguments: help and version as clap prints them, and a usage error
/// (exit 2) as clap says it, with its first line as a JSON error on stdout under `--json`.
fn usage(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let json = std::env::args_os().any(|arg| arg == "--json");
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) || !json
    {
        error.exit();
    }
    let said = error.render().to_string();
    let first = said.lines().next().unwrap_or_default();
    let message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    let _ = writeln!(std::io::stdout(), "{}", Failure::usage(message).json());
    let _ = error.print();
    ExitCode::from(Exit::Usage as u8)
}

async fn run(cli: Cli) -> Result<Done, Failure> {
    let json = cli.json;
    if let Command::Health = cli.command {
        // Built without I/O: a deployment that does not answer is what `health` reports.
        return health(&builder(&cli)?.build_lazy()?, json).await;
    }
    let locks = builder(&cli)?.build().await?;
    match cli.command {
        Command::List { prefix } => list(&locks, prefix.as_deref().unwrap_or(""), json).await,
        Command::Inspect { key } => inspect(&locks, &key, json).await,
        Command::Release { key, force, yes } => release(&locks, &key, force, yes, json).await,
        Command::Watch { key } => watch::watch(&locks, &key, json).await,
        Command::Health => health(&locks, json).await,
    }
}

/// A client builder for the deployment the arguments name.
fn builder(cli: &Cli) -> Result<lockmacro_runtime::LockClientBuilder, Failure> {
    let urls: Vec<&str> = cli
        .url
        .iter()
        .map(|url| url.trim())
        .filter(|url| !url.is_empty())
        .collect();
    for url in &urls {
        urls::check(url).map_err(Failure::usage)?;
    }
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
        let pem = std::fs::read(path).map_err(|error| {
            Failure::usage(format!(
                "cannot read the TLS root `{}`: {error}",
                path.display()
            ))
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
fn say(out: &mut impl Write, line: &str) -> Result<(), Failure> {
    written(writeln!(out, "{}", escaped(line)))
}

fn written(result: std::io::Result<()>) -> Result<(), Failure> {
    result.map_err(|error| Failure::usage(format!("cannot write the output: {error}")))
}

/// Prints the locks as they are scanned: one page at a time is in memory.
async fn list(locks: &LockClient, prefix: &str, json: bool) -> Result<Done, Failure> {
    let mut out = std::io::stdout().lock();
    let mut listed = locks.list(prefix);
    let mut count = 0usize;
    while let Some(lock) = listed.next().await {
        let lock = match lock {
            Ok(lock) => lock,
            Err(error) if json && count > 0 => {
                // The array is half printed: the error ends it, so stdout stays one JSON value.
                let failure = Failure::from(error);
                written(writeln!(out, ",{}]", failure.json()))?;
                return Ok(Done::Failure(failure.exit, failure.message));
            }
            Err(error) => return Err(error.into()),
        };
        if json {
            let separator = if count == 0 { "[" } else { "," };
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
        written(writeln!(out, "{}", if count == 0 { "[]" } else { "]" }))?;
    } else if count == 0 {
        written(writeln!(out, "no locks held"))?;
    }
    Ok(Done::Success)
}

async fn inspect(locks: &LockClient, key: &str, json: bool) -> Result<Done, Failure> {
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

async fn release(
    locks: &LockClient,
    key: &str,
    force: bool,
    yes: bool,
    json: bool,
) -> Result<Done, Failure> {
    if !force {
        return Err(Failure::usage(format!(
            "refusing to release `{key}` without --force: its holder's work would be cancelled with `Lost`"
        )));
    }
    let not_released = |why: String| {
        if json {
            let answer = json!({"key": key, "released": false});
            written(writeln!(std::io::stdout(), "{}", json_line(&answer)))?;
        }
        Ok(Done::Failure(Exit::NotHeld, why))
    };
    let not_held = || format!("`{key}` is not held; nothing released");
    if !yes && std::io::stdin().is_terminal() {
        let Some(lock) = locks.inspect(key).await? else {
            return not_released(not_held());
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
            return not_released("not released".to_owned());
        }
    }
    if !locks.force_release(key).await? {
        return not_released(not_held());
    }
    let mut out = std::io::stdout().lock();
    if json {
        let answer = json!({"key": key, "released": true});
        written(writeln!(out, "{}", json_line(&answer)))?;
    } else {
        say(
            &mut out,
            &format!("{key}: released; its holder gets `Lost` within a second"),
        )?;
    }
    Ok(Done::Success)
}

/// Prints every server's answer; exit 0 when ready, 1 when not, 3 when none answers.
async fn health(locks: &LockClient, json: bool) -> Result<Done, Failure> {
    let health = locks.health().await;
    let mut out = std::io::stdout().lock();
    if json {
        written(writeln!(out, "{}", json_line(&health_json(&health))))?;
    } else {
        for line in health.to_string().lines() {
            say(&mut out, line)?;
        }
    }
    let refused = health.nodes().iter().find(|node| node.refused());
    Ok(match (health.is_ready(), health.answering()) {
        (true, _) => Done::Success,
        (false, 0) => match refused.and_then(NodeHealth::error) {
            Some(why) => Done::Failure(Exit::Error, format!("refused: {why}")),
            None => Done::Failure(
                Exit::Error,
                format!("no server answers: {}", health.verdict()),
            ),
        },
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
                "refused": node.refused(),
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
