//! `lockmacro`: look at and clear the locks lockmacro keeps in Redis.
//!
//! It speaks to the servers directly (one Redis, the master a Sentinel names, every master of a
//! cluster, or each master of a Redlock quorum) and reads the layout the library's scripts
//! write: an exclusive lock is a string holding its holder's token; a read lock or permits are a
//! hash with a `kind` field and one field per holder (its token, holding its expiry in ms).

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use redis::aio::MultiplexedConnection;
use redis::cluster_routing::Slot;
use redis::{AsyncConnectionConfig, Value};
use serde_json::json;

/// Look at and clear lockmacro's Redis locks: what holds a lock, for how long, and clear it.
#[derive(Parser)]
#[command(name = "lockmacro", version)]
struct Cli {
    /// Where the locks live: `redis://[user:password@]host:port[/db]`, `rediss://` for TLS, or
    /// `redis+sentinel://host:26379[,host:26379]/service` for the master a Sentinel names.
    /// Repeat `--url` once per master for a Redlock quorum.
    #[arg(
        long,
        env = "REDIS_URL",
        global = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    url: Vec<String>,

    /// The URL is a node of a Redis Cluster: look at every master.
    #[arg(long, global = true)]
    cluster: bool,

    /// The namespace of the library's internal keys (`LockClientBuilder::namespace`).
    #[arg(long, global = true, default_value = "lockmacro")]
    namespace: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List held locks with their kind, time left and number of holders.
    ///
    /// Uses SCAN in bounded steps, so it never blocks Redis, even over millions of keys. The
    /// library's internal keys are not shown.
    List {
        /// Only locks whose key starts with `PREFIX:` (the attribute's `prefix`).
        #[arg(long)]
        prefix: Option<String>,
        /// Print a JSON array of objects (`key`, `kind`, `ttl_ms`, `holders`).
        #[arg(long)]
        json: bool,
    },
    /// Show one lock: its kind, its holders (tokens masked), time left, fencing counter and
    /// how many waiters are subscribed to its release.
    Inspect {
        /// The lock's full key, e.g. `Business1:1024`.
        key: String,
    },
    /// Delete a lock now and announce its release, so waiters take it at once.
    ///
    /// The holder is not stopped at once: it gets `Lost` at its next renewal (within a third of
    /// its ttl), so its work may still run for that long.
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
    /// Print a line each time the lock changes (acquired, renewed, released, expired), until
    /// interrupted.
    Watch {
        /// The lock's full key.
        key: String,
        /// How often to look, in milliseconds.
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
    },
}

/// One server that may hold locks.
struct Node {
    connection: MultiplexedConnection,
    /// Its address, without credentials.
    shown: String,
    clustered: bool,
}

/// What a key holds, as the library writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lock {
    Free,
    Exclusive {
        token: String,
        ttl_ms: i64,
    },
    Shared {
        kind: String,
        holders: Vec<(String, i64)>,
        ttl_ms: i64,
    },
}

type Failure = String;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `rediss://`: rustls with ring (an error only means a provider is installed already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(format!("cannot start: {error}")),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(message),
    }
}

fn fail(message: String) -> ExitCode {
    eprintln!("lockmacro: {message}");
    ExitCode::FAILURE
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let nodes = connect(&cli).await?;
    let names = Names {
        namespace: &cli.namespace,
    };
    match cli.command {
        Command::List { prefix, json } => list(&nodes, &names, prefix.as_deref(), json).await,
        Command::Inspect { key } => inspect(&nodes, &names, &key).await,
        Command::Release { key, force, yes } => release(&nodes, &names, &key, force, yes).await,
        Command::Watch { key, interval_ms } => {
            watch(&nodes, &key, Duration::from_millis(interval_ms.max(10))).await
        }
    }
}

// ---- Connecting ----

async fn connect(cli: &Cli) -> Result<Vec<Node>, Failure> {
    let mut nodes = Vec::new();
    for url in &cli.url {
        let url = url.trim();
        let client = if url.contains("+sentinel://") {
            master_of_sentinels(url).await?
        } else {
            open(url)?
        };
        let node = node(&client, cli.cluster).await?;
        if cli.cluster {
            nodes.extend(cluster_masters(&client, &node).await?);
        } else {
            nodes.push(node);
        }
    }
    Ok(nodes)
}

fn open(url: &str) -> Result<redis::Client, Failure> {
    redis::Client::open(url).map_err(|error| format!("invalid URL `{}`: {error}", redact(url)))
}

async fn node(client: &redis::Client, clustered: bool) -> Result<Node, Failure> {
    let shown = client.get_connection_info().addr().to_string();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    let connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|error| format!("cannot reach Redis at {shown}: {error}"))?;
    Ok(Node {
        connection,
        shown,
        clustered,
    })
}

/// The masters of the cluster `seed` belongs to, from `CLUSTER NODES`, with the seed's
/// scheme and credentials.
async fn cluster_masters(client: &redis::Client, seed: &Node) -> Result<Vec<Node>, Failure> {
    let listing: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut seed.connection.clone())
        .await
        .map_err(|error| format!("{} is not a cluster node: {error}", seed.shown))?;
    let info = client.get_connection_info();
    let mut masters = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 3 || !fields[2].contains("master") || fields[2].contains("fail") {
            continue;
        }
        let address = fields[1].split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = address.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse() else { continue };
        let addr = match info.addr() {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let master = redis::Client::open(info.clone().set_addr(addr))
            .map_err(|error| format!("cluster node {address}: {error}"))?;
        masters.push(node(&master, true).await?);
    }
    Ok(masters)
}

/// The master the sentinels of `url` name (`redis+sentinel://[auth@]h1:p1,h2:p2/service[/db]`).
async fn master_of_sentinels(url: &str) -> Result<redis::Client, Failure> {
    let bad = |why: &str| format!("invalid URL `{}`: {why}", redact(url));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let tls = scheme.starts_with("rediss") || scheme.starts_with("valkeys");
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (format!("{auth}@"), rest),
        None => (String::new(), rest),
    };
    let mut parts = rest.split('/');
    let hosts = parts.next().unwrap_or_default();
    let service = parts
        .next()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("no service name"))?;
    let db = parts.next().map(|db| format!("/{db}")).unwrap_or_default();
    let mut last = bad("no sentinel given");
    for sentinel in hosts.split(',').filter(|h| !h.is_empty()) {
        let client = open(&format!("redis://{sentinel}"))?;
        let mut connection = match node(&client, false).await {
            Ok(node) => node.connection,
            Err(error) => {
                last = error;
                continue;
            }
        };
        let named: Result<Option<(String, u16)>, _> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(service)
            .query_async(&mut connection)
            .await;
        match named {
            Ok(Some((host, port))) => {
                let scheme = if tls { "rediss" } else { "redis" };
                return open(&format!("{scheme}://{auth}{host}:{port}{db}"));
            }
            Ok(None) => last = format!("sentinel {sentinel} knows no service `{service}`"),
            Err(error) => last = format!("sentinel {sentinel}: {error}"),
        }
    }
    Err(last)
}

/// `url` with any password replaced.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(start), Some(at)) if at > start => {
            let auth = &url[start + 3..at];
            match auth.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..start + 3], &url[at..]),
                None => format!("{}***{}", &url[..start + 3], &url[at..]),
            }
        }
        _ => url.to_owned(),
    }
}

// ---- Names of the library's internal keys ----

struct Names<'a> {
    namespace: &'a str,
}

impl Names<'_> {
    fn internal(&self, key: &str) -> bool {
        key.starts_with(&format!("{}:", self.namespace))
    }

    fn fencing_counter(&self, key: &str, node: &Node) -> String {
        in_slot_of(key, &format!("{}:fence:", self.namespace), node.clustered)
    }

    fn release_channel(&self, key: &str, node: &Node) -> String {
        in_slot_of(
            key,
            &format!("{}:released:", self.namespace),
            node.clustered,
        )
    }
}

/// As the library names a key's companions: on a cluster, in the key's slot (its hash tag, or
/// the whole key as one).
fn in_slot_of(key: &str, prefix: &str, clustered: bool) -> String {
    let plain = format!("{prefix}{key}");
    if !clustered || Slot::for_key(&plain) == Slot::for_key(key) {
        plain
    } else {
        format!("{prefix}{{{key}}}")
    }
}

// ---- Reading a lock ----

/// What `key` holds on `node`; `Err` when it is not a lock.
async fn read_lock(node: &Node, key: &str) -> Result<Lock, Failure> {
    let mut connection = node.connection.clone();
    let (kind, ttl_ms, now): (String, i64, (u64, u64)) = redis::pipe()
        .cmd("TYPE")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .cmd("TIME")
        .query_async(&mut connection)
        .await
        .map_err(|error| format!("Redis at {}: {error}", node.shown))?;
    match kind.as_str() {
        "none" => Ok(Lock::Free),
        "string" => {
            let token: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("Redis at {}: {error}", node.shown))?;
            Ok(token.map_or(Lock::Free, |token| Lock::Exclusive { token, ttl_ms }))
        }
        "hash" => {
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("Redis at {}: {error}", node.shown))?;
            let now_ms = (now.0 * 1000 + now.1 / 1000) as i64;
            let mut kind = None;
            let mut holders = Vec::new();
            for (field, value) in fields {
                if field == "kind" {
                    kind = Some(value);
                } else if let Ok(expiry) = value.parse::<i64>()
                    && expiry > now_ms
                {
                    holders.push((field, expiry - now_ms));
                }
            }
            let kind = kind.ok_or_else(|| not_a_lock(key, "a hash without the `kind` field"))?;
            holders.sort();
            Ok(Lock::Shared {
                kind,
                holders,
                ttl_ms,
            })
        }
        other => Err(not_a_lock(key, &format!("a {other}"))),
    }
}

fn not_a_lock(key: &str, what: &str) -> Failure {
    format!("`{key}` is not a lock (it holds {what})")
}

/// The node that holds `key` (on a cluster, the master of its slot), and what it holds.
async fn find<'n>(nodes: &'n [Node], key: &str) -> Result<Option<(&'n Node, Lock)>, Failure> {
    let mut first_error = None;
    for node in nodes {
        match read_lock(node, key).await {
            Ok(Lock::Free) => {}
            Ok(lock) => return Ok(Some((node, lock))),
            // A cluster master that does not serve the key's slot says MOVED.
            Err(error) if node.clustered && error.to_lowercase().contains("moved") => {}
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(None),
    }
}

/// The first 4 characters of a token: enough to tell holders apart, not enough to forge one.
fn mask(token: &str) -> String {
    let shown: String = token.chars().take(4).collect();
    format!("{shown}…")
}

// ---- Commands ----

/// SCAN's glob characters in `text`, escaped.
fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

async fn list(
    nodes: &[Node],
    names: &Names<'_>,
    prefix: Option<&str>,
    json: bool,
) -> Result<(), Failure> {
    let pattern = prefix.map_or_else(|| "*".to_owned(), |p| format!("{}:*", escape_glob(p)));
    let mut rows = Vec::new();
    for node in nodes {
        let mut connection = node.connection.clone();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("Redis at {}: {error}", node.shown))?;
            let keys: Vec<String> = keys
                .into_iter()
                .filter(|key| !names.internal(key))
                .collect();
            if !keys.is_empty() {
                let mut look = redis::pipe();
                for key in &keys {
                    look.cmd("TYPE")
                        .arg(key)
                        .cmd("PTTL")
                        .arg(key)
                        .cmd("HLEN")
                        .arg(key);
                }
                // HLEN on a string is an error reply: read the replies as values.
                let replies: Vec<Value> =
                    look.ignore_errors()
                        .query_async(&mut connection)
                        .await
                        .map_err(|error| format!("Redis at {}: {error}", node.shown))?;
                for (key, reply) in keys.into_iter().zip(replies.chunks(3)) {
                    let kind = match &reply[0] {
                        Value::SimpleString(kind) => kind.as_str(),
                        _ => continue,
                    };
                    let ttl_ms = match reply[1] {
                        Value::Int(ttl) => ttl,
                        _ => continue,
                    };
                    let (kind, holders) = match kind {
                        "string" => ("exclusive", 1),
                        "hash" => match reply[2] {
                            Value::Int(fields) if fields > 1 => ("shared", fields - 1),
                            _ => continue,
                        },
                        _ => continue, // not a lock
                    };
                    rows.push((key, kind, ttl_ms, holders));
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    rows.sort();
    let mut out = std::io::stdout().lock();
    let written = if json {
        let items: Vec<_> = rows
            .iter()
            .map(|(key, kind, ttl_ms, holders)| json!({"key": key, "kind": kind, "ttl_ms": ttl_ms, "holders": holders}))
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(items))
    } else if rows.is_empty() {
        writeln!(out, "no locks held")
    } else {
        let width = rows.iter().map(|row| row.0.len()).max().unwrap_or(3).max(3);
        let mut written = writeln!(
            out,
            "{:width$}  {:9}  {:>10}  HOLDERS",
            "KEY", "KIND", "TTL"
        );
        for (key, kind, ttl_ms, holders) in &rows {
            written = written.and(writeln!(
                out,
                "{key:width$}  {kind:9}  {:>10}  {holders}",
                ttl(*ttl_ms)
            ));
        }
        written
    };
    written.map_err(|error| format!("cannot write: {error}"))
}

fn ttl(ms: i64) -> String {
    if ms < 0 {
        "no expiry".to_owned()
    } else {
        format!("{:.3} s", ms as f64 / 1000.0)
    }
}

async fn inspect(nodes: &[Node], names: &Names<'_>, key: &str) -> Result<(), Failure> {
    let Some((node, lock)) = find(nodes, key).await? else {
        println!("{key}: not held");
        return Ok(());
    };
    let mut connection = node.connection.clone();
    let subscribers = if node.clustered {
        "SHARDNUMSUB"
    } else {
        "NUMSUB"
    };
    let (fence, waiters): (Option<u64>, (String, u64)) = redis::pipe()
        .cmd("GET")
        .arg(names.fencing_counter(key, node))
        .cmd("PUBSUB")
        .arg(subscribers)
        .arg(names.release_channel(key, node))
        .query_async(&mut connection)
        .await
        .map_err(|error| format!("Redis at {}: {error}", node.shown))?;
    println!("key:        {key}");
    println!("server:     {}", node.shown);
    match &lock {
        Lock::Exclusive { token, ttl_ms } => {
            println!("kind:       exclusive");
            println!("holder:     {}", mask(token));
            println!("time left:  {}", ttl(*ttl_ms));
        }
        Lock::Shared {
            kind,
            holders,
            ttl_ms,
        } => {
            println!("kind:       {kind}");
            println!("time left:  {}", ttl(*ttl_ms));
            println!("holders:    {}", holders.len());
            for (token, left) in holders {
                println!("  {}  {} left", mask(token), ttl(*left));
            }
        }
        Lock::Free => {}
    }
    println!(
        "fencing:    {}",
        fence.map_or("none".to_owned(), |fence| fence.to_string())
    );
    println!(
        "waiters:    {} client(s) subscribed to its release",
        waiters.1
    );
    Ok(())
}

/// Deletes a lock of any kind and announces the release as the library's release script does.
const FORCE_RELEASE: &str = r"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return 0 end
if kind ~= 'string' and not (kind == 'hash' and redis.call('HEXISTS', KEYS[1], 'kind') == 1) then
  return -1
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[3], ARGV[2], ARGV[1])
return 1
";

async fn release(
    nodes: &[Node],
    names: &Names<'_>,
    key: &str,
    force: bool,
    yes: bool,
) -> Result<(), Failure> {
    if !force {
        return Err(format!(
            "refusing to release `{key}` without --force: its holder may still be working (it learns it lost the lock only at its next renewal)"
        ));
    }
    let Some((owner, lock)) = find(nodes, key).await? else {
        println!("{key}: not held; nothing released");
        return Ok(());
    };
    if !yes && std::io::stdin().is_terminal() {
        let holder = match &lock {
            Lock::Exclusive { token, .. } => format!("held by {}", mask(token)),
            Lock::Shared { holders, kind, .. } => format!("{kind}, {} holder(s)", holders.len()),
            Lock::Free => String::new(),
        };
        eprint!("Release `{key}` ({holder})? [y/N] ");
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .map_err(|error| format!("cannot read the answer: {error}"))?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Err("not released".to_owned());
        }
    }
    let stamp = format!("forced:{}", std::process::id());
    // On a cluster only the master of the key's slot holds it; a Redlock lock is on each master.
    let targets: Vec<&Node> = if owner.clustered {
        vec![owner]
    } else {
        nodes.iter().collect()
    };
    let mut released = false;
    for node in targets {
        let announce = if node.clustered {
            "SPUBLISH"
        } else {
            "PUBLISH"
        };
        let outcome: Result<i64, _> = redis::Script::new(FORCE_RELEASE)
            .key(key)
            .arg(&stamp)
            .arg(names.release_channel(key, node))
            .arg(announce)
            .invoke_async(&mut node.connection.clone())
            .await;
        match outcome {
            Ok(1) => released = true,
            Ok(-1) => return Err(not_a_lock(key, "something else")),
            Ok(_) => {}
            Err(error) => return Err(format!("Redis at {}: {error}", node.shown)),
        }
    }
    if released {
        println!("{key}: released; its holder gets `Lost` at its next renewal");
    } else {
        println!("{key}: not held; nothing released");
    }
    Ok(())
}

async fn watch(nodes: &[Node], key: &str, interval: Duration) -> Result<(), Failure> {
    let started = Instant::now();
    let mut last = Lock::Free;
    let mut ticker = tokio::time::interval(interval);
    let say = |what: String| {
        let at = started.elapsed().as_secs_f64();
        println!("{at:9.3}s  {key}  {what}");
        let _ = std::io::stdout().flush();
    };
    say(format!(
        "watching every {} ms (Ctrl-C to stop)",
        interval.as_millis()
    ));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = ticker.tick() => {}
        }
        let now = find(nodes, key).await?.map_or(Lock::Free, |(_, lock)| lock);
        for line in changes(&last, &now, interval) {
            say(line);
        }
        last = now;
    }
}

/// The changes from `before` to `after`, one line each.
fn changes(before: &Lock, after: &Lock, interval: Duration) -> Vec<String> {
    let holders = |lock: &Lock| -> Vec<(String, i64)> {
        match lock {
            Lock::Free => Vec::new(),
            Lock::Exclusive { token, ttl_ms } => vec![(token.clone(), *ttl_ms)],
            Lock::Shared { holders, .. } => holders.clone(),
        }
    };
    let (before, after) = (holders(before), holders(after));
    let mut lines = Vec::new();
    for (token, left) in &before {
        if !after.iter().any(|(other, _)| other == token) {
            // A lease that had about a tick left ran out; anything else was given back.
            let how = if *left <= 2 * interval.as_millis() as i64 {
                "expired"
            } else {
                "released"
            };
            lines.push(format!("{how} by {}", mask(token)));
        }
    }
    for (token, left) in &after {
        match before.iter().find(|(other, _)| other == token) {
            None => lines.push(format!("acquired by {} ({} left)", mask(token), ttl(*left))),
            Some((_, earlier)) if *left > *earlier + 20 => {
                lines.push(format!("renewed by {} ({} left)", mask(token), ttl(*left)));
            }
            Some(_) => {}
        }
    }
    lines
}
