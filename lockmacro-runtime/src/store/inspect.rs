//! How each deployment reads, lists and force-releases locks, for the inspection API
//! (`crate::inspect`).
//!
//! A key is a lock only when it holds what the library writes ([`protocol`]): a string whose
//! value is one of our lock values, or a hash with our `kind` field and live holders. A listing
//! sorts the keys it scans with plain pipelined reads first, so a key that is no lock costs no
//! script. Every look at a lock is one script (`scripts/inspect.lua`) on the master that owns the
//! key, so what it reports is one atomic look; a forced release (`scripts/force_release.lua`)
//! removes only what that look
//! found, and announces it on the key's release channel so that waiters look again at once.
//!
//! Redis deployments (one server, Sentinel, Cluster) supply [`Commands`]: a command routed by
//! key, and a command sent to each master in turn for `SCAN`. Redlock combines its masters'
//! looks into the quorum's view; the in-memory store answers from its own state.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use redis::Value;

use super::protocol::{self, Names};
use super::redis::server::Server;
use super::redis::{RedisStore, Request};
use super::scripts;
use super::{BoxFuture, StoreError};
use crate::options::LockKind;

/// Keys asked for per `SCAN` step, and so at most how many locks one page holds.
pub(crate) const SCAN_COUNT: usize = 1000;

/// Looks in flight at once while a page is read: the connection pipelines them. Redis runs a
/// client's pipelined scripts back to back, so other clients wait behind as many as are in
/// flight: with 64, a `PING` took 0.58 ms (p50) while 200 000 locks were listed; with 16,
/// 0.3 ms, and the listing took about as long as with 64 before unrelated keys were sorted out.
const LOOKS_IN_FLIGHT: usize = 16;

/// What holds a lock key now, as the store read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) key: String,
    pub(crate) kind: LockKind,
    /// Each holder's value (`protocol::LockValue`: its token, when it took the lock and who
    /// it is) and time left.
    pub(crate) holders: Vec<(String, Duration)>,
    /// The key's fencing counter, if fencing was used on it.
    pub(crate) fencing: Option<u64>,
    /// Callers known to wait: see `LockInfo::waiters`.
    pub(crate) waiters: usize,
    /// The caller an exclusive lock is reserved for ([`protocol::Reservation`]): its value
    /// (token and origin) and when it began waiting (ms since the Unix epoch, its clock).
    pub(crate) reserved_for: Option<(String, u64)>,
}

/// Where a listing goes on: which master, and where on it (`""`: from the start).
#[derive(Debug, Clone, Default)]
pub(crate) struct Cursor {
    pub(crate) node: usize,
    pub(crate) position: String,
    /// The masters being scanned, found on the first page (a cluster's, by address).
    pub(crate) nodes: Option<Arc<[String]>>,
}

/// One page of a listing.
#[derive(Debug, Default)]
pub(crate) struct Page {
    pub(crate) locks: Vec<Snapshot>,
    /// `None` once every master was scanned.
    pub(crate) next: Option<Cursor>,
}

/// What a Redis deployment offers inspection: commands routed by key, and to each master.
pub(crate) trait Commands: Send + Sync {
    /// The names the deployment keeps beside its locks.
    fn names(&self) -> &Names;

    /// A cluster: names placed in the key's slot, sharded release channels.
    fn is_cluster(&self) -> bool;

    /// `cmd` on the master that owns `key`.
    fn on_key<'a>(
        &'a self,
        key: &'a str,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<Value, StoreError>>;

    /// The masters that hold keys, each named for [`on_master`](Self::on_master).
    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;

    /// `request` on `master`, as named by [`masters`](Self::masters): a pipeline's replies as
    /// one array, each error reply in its place.
    fn on_master<'a>(
        &'a self,
        master: &'a str,
        request: Request<'a>,
    ) -> BoxFuture<'a, Result<Value, StoreError>>;
}

/// A name beside `key`, placed in its slot on a cluster.
fn beside(
    commands: &dyn Commands,
    key: &str,
    name: impl Fn(&str) -> String,
) -> Result<String, StoreError> {
    if commands.is_cluster() {
        Ok(Names::in_slot(key, name(""))?)
    } else {
        Ok(name(key))
    }
}

fn announce_mark(commands: &dyn Commands) -> &'static str {
    if commands.is_cluster() { "sharded" } else { "" }
}

/// One atomic look at `key`.
pub(crate) async fn look(
    commands: &dyn Commands,
    key: &str,
) -> Result<Option<Snapshot>, StoreError> {
    let names = commands.names();
    let mut cmd = scripts::evalsha_inspect();
    cmd.arg(key)
        .arg(beside(commands, key, |k| names.fencing_counter(k))?)
        .arg(beside(commands, key, |k| names.waiters(k))?);
    let reply = commands.on_key(key, &cmd).await?;
    Ok(read_look(key, reply))
}

/// Marks `key` as followed by a watch, for [`protocol::WATCH_MARK_LIFE`]: until then each of
/// its releases is announced (a key named as its release channel, see [`protocol`]).
pub(crate) async fn mark_watched(commands: &dyn Commands, key: &str) -> Result<(), StoreError> {
    let mark = beside(commands, key, |k| commands.names().release_channel(k))?;
    let cmd = scripts::watch(key, &mark, protocol::WATCH_MARK_LIFE);
    commands.on_key(key, &cmd).await.map(drop)
}

/// What inspect.lua's reply means; `None` for a key that holds no lock of ours.
fn read_look(key: &str, reply: Value) -> Option<Snapshot> {
    let Value::Array(fields) = reply else {
        return None;
    };
    let mut fields = fields.into_iter();
    let ktype = text(fields.next()?)?;
    let fencing = text(fields.next()?)?.parse().ok();
    let waiters = usize::try_from(int(fields.next()?)?).unwrap_or(0);
    let mut reserved_for = None;
    let (kind, holders) = match ktype.as_str() {
        "string" => {
            let value = text(fields.next()?)?;
            let left = protocol::remaining(int(fields.next()?)?).filter(|left| !left.is_zero())?;
            let stored = protocol::Stored::parse(&value)?;
            reserved_for = stored
                .reserved
                .map(|reservation| (reservation.value.to_owned(), reservation.since_ms));
            (LockKind::Exclusive, vec![(stored.holder.to_owned(), left)])
        }
        "hash" => {
            let kind = protocol::parse_shared_kind(&text(fields.next()?)?)?;
            let mut holders = Vec::new();
            while let (Some(value), Some(left)) = (fields.next(), fields.next()) {
                let left = u64::try_from(int(left)?).ok()?;
                let value = text(value)?;
                protocol::LockValue::parse(&value)?;
                holders.push((value, Duration::from_millis(left)));
            }
            (kind, holders)
        }
        _ => return None,
    };
    if holders.is_empty() {
        return None;
    }
    Some(Snapshot {
        key: key.to_owned(),
        kind,
        holders,
        fencing,
        waiters,
        reserved_for,
    })
}

fn text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => Some(text),
        Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

fn int(value: Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(n),
        other => text(other)?.parse().ok(),
    }
}

/// Removes every holder of `key` and announces it: `true` when there was one. What is removed
/// is what a look found just before, so a lock taken in between is never removed unseen.
pub(crate) async fn force_release(commands: &dyn Commands, key: &str) -> Result<bool, StoreError> {
    // The key may change hands between the look and the removal: look again, a few times.
    for _ in 0..8 {
        let Some(found) = look(commands, key).await? else {
            return Ok(false);
        };
        let (kind, token) = match protocol::shared_kind_tag(found.kind) {
            Some(tag) => (tag, String::new()),
            None => (
                "x".to_owned(),
                found
                    .holders
                    .first()
                    .map(|(value, _)| protocol::holder_token(value).to_owned())
                    .unwrap_or_default(),
            ),
        };
        let mut cmd = scripts::evalsha_force_release();
        cmd.arg(key)
            .arg(beside(commands, key, |k| {
                commands.names().release_channel(k)
            })?)
            .arg(announce_mark(commands))
            .arg(kind)
            .arg(token);
        if int(commands.on_key(key, &cmd).await?).unwrap_or(0) > 0 {
            announce_forced(commands, key).await;
            return Ok(true);
        }
    }
    Err(StoreError::unavailable(format!(
        "`{key}` changed hands on every attempt to release it; try again"
    )))
}

/// Tells every client holding a lease that `key` was freed by force
/// ([`protocol::FORCED_RELEASES`]), so that its holder stops at once. The key is freed either
/// way: an announcement that fails leaves the holder to its next renewal.
async fn announce_forced(commands: &dyn Commands, key: &str) {
    let forced = protocol::FORCED_RELEASES;
    let announced = async {
        let channel = beside(commands, forced, |k| commands.names().release_channel(k))?;
        let mut cmd = redis::cmd(if commands.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        });
        cmd.arg(channel).arg(key);
        commands.on_key(forced, &cmd).await
    };
    if let Err(error) = announced.await {
        tracing::debug!(key = %key, error = %error, "a forced release could not be announced to its holder; it learns at its next renewal");
    }
}

/// One page of the locks whose key starts with `prefix:` (`""`: every lock): one `SCAN` step
/// on one master, the keys that may be locks sorted out cheaply ([`candidates`]), and each of
/// those looked at (many at once, pipelined on the connection).
pub(crate) async fn scan(
    commands: &dyn Commands,
    prefix: &str,
    cursor: Cursor,
) -> Result<Page, StoreError> {
    let (node, keys, next) = scan_keys(commands, prefix, cursor).await?;
    let keys = candidates(commands, &node, keys).await?;
    let looks: Vec<Result<Option<Snapshot>, StoreError>> = stream::iter(keys)
        .map(|key| async move { look(commands, &key).await })
        .buffered(LOOKS_IN_FLIGHT)
        .collect()
        .await;
    // The locks found, or the first failure.
    let locks = looks
        .into_iter()
        .filter_map(Result::transpose)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Page { locks, next })
}

/// The bytes of a string key read to tell whether it holds a lock: far more than a lock's
/// value, and a bound on what an unrelated large value costs to read.
const PEEK_BYTES: usize = 4096;

/// The keys among `keys` (all on master `node`) that may be locks, sorted out with plain reads
/// pipelined to `node`, so that a key that is no lock costs Redis no script: a `GETRANGE` of
/// each key's first [`PEEK_BYTES`] (a string that holds no token of ours is no lock), then an
/// `HGET` of the `kind` field of each key that is not a string (a hash without our kind is no
/// lock). A key whose read failed (moved meanwhile, say) stays a candidate: the look decides.
async fn candidates(
    commands: &dyn Commands,
    node: &str,
    keys: Vec<String>,
) -> Result<Vec<String>, StoreError> {
    if keys.is_empty() {
        return Ok(keys);
    }
    let mut peeks = redis::pipe();
    peeks.ignore_errors();
    for key in &keys {
        peeks.cmd("GETRANGE").arg(key).arg(0).arg(PEEK_BYTES - 1);
    }
    let peeked = replies(
        commands.on_master(node, Request::Pipeline(&peeks)).await?,
        &keys,
    )?;
    let mut found = Vec::new();
    let mut not_strings = Vec::new();
    for (key, reply) in keys.into_iter().zip(peeked) {
        match reply {
            Value::BulkString(value) => {
                if may_hold_a_lock(&value) {
                    found.push(key);
                }
            }
            // Gone since the scan.
            Value::Nil => {}
            Value::ServerError(error) if error.code() == "WRONGTYPE" => not_strings.push(key),
            _ => found.push(key),
        }
    }
    if not_strings.is_empty() {
        return Ok(found);
    }
    let mut kinds = redis::pipe();
    kinds.ignore_errors();
    for key in &not_strings {
        kinds.cmd("HGET").arg(key).arg(protocol::KIND_FIELD);
    }
    let kinds = replies(
        commands.on_master(node, Request::Pipeline(&kinds)).await?,
        &not_strings,
    )?;
    for (key, reply) in not_strings.into_iter().zip(kinds) {
        match reply {
            Value::BulkString(tag) => {
                let ours = std::str::from_utf8(&tag)
                    .is_ok_and(|tag| protocol::parse_shared_kind(tag).is_some());
                if ours {
                    found.push(key);
                }
            }
            Value::Nil => {}
            Value::ServerError(error) if error.code() == "WRONGTYPE" => {}
            _ => found.push(key),
        }
    }
    Ok(found)
}

/// Whether a string key whose value starts with `head` (its first [`PEEK_BYTES`]) may be an
/// exclusive lock: a lock's value, or a longer value that begins with a token.
fn may_hold_a_lock(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    if head.len() < PEEK_BYTES {
        return protocol::exclusive_holder(&text).is_some();
    }
    [32, 36]
        .iter()
        .any(|&len| text.get(..len).is_some_and(protocol::is_token))
}

/// A pipeline's replies, one per key of `keys`.
fn replies(reply: Value, keys: &[String]) -> Result<Vec<Value>, StoreError> {
    match reply {
        Value::Array(replies) if replies.len() == keys.len() => Ok(replies),
        other => Err(StoreError::unavailable(format!(
            "a reply of the wrong shape to {} reads: {other:?}",
            keys.len()
        ))),
    }
}

/// One `SCAN` step on `cursor`'s master: that master, the keys found (internal names left
/// out), and where to go on.
async fn scan_keys(
    commands: &dyn Commands,
    prefix: &str,
    mut cursor: Cursor,
) -> Result<(String, Vec<String>, Option<Cursor>), StoreError> {
    let nodes = match &cursor.nodes {
        Some(nodes) => nodes.clone(),
        None => {
            if !commands.is_cluster() {
                refuse_a_cluster_node(commands).await?;
            }
            let nodes: Arc<[String]> = commands.masters().await?.into();
            cursor.nodes = Some(nodes.clone());
            nodes
        }
    };
    let Some(node) = nodes.get(cursor.node).cloned() else {
        return Ok((String::new(), Vec::new(), None));
    };
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(if cursor.position.is_empty() {
        "0"
    } else {
        &cursor.position
    })
    .arg("MATCH")
    .arg(protocol::lock_pattern(prefix))
    .arg("COUNT")
    .arg(SCAN_COUNT);
    let reply = commands.on_master(&node, Request::Cmd(&cmd)).await?;
    let (position, found): (String, Vec<Vec<u8>>) =
        redis::from_redis_value(reply).map_err(StoreError::unavailable)?;
    let names = commands.names();
    let keys = found
        .into_iter()
        .filter_map(|key| String::from_utf8(key).ok())
        .filter(|key| !names.is_internal(key))
        .collect();
    if position == "0" {
        cursor.node += 1;
        cursor.position.clear();
    } else {
        cursor.position = position;
    }
    let next = (cursor.node < nodes.len()).then_some(cursor);
    Ok((node, keys, next))
}

/// One line of a `CLUSTER NODES` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterNode {
    /// `host:port`.
    pub(crate) address: String,
    pub(crate) master: bool,
    /// Flagged `fail` or `noaddr`.
    pub(crate) failed: bool,
    /// How many slots it serves.
    pub(crate) slots: usize,
}

/// Every node of a `CLUSTER NODES` reply.
pub(crate) fn cluster_nodes(nodes: &str) -> Vec<ClusterNode> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags: Vec<&str> = fields.get(2)?.split(',').collect();
            let address = fields.get(1)?.split(['@', ',']).next()?.to_owned();
            let slots = fields
                .iter()
                .skip(8)
                .filter(|range| !range.starts_with('['))
                .map(|range| match range.split_once('-') {
                    Some((first, last)) => {
                        let (first, last) = (first.parse::<usize>(), last.parse::<usize>());
                        match (first, last) {
                            (Ok(first), Ok(last)) if last >= first => last - first + 1,
                            _ => 0usize,
                        }
                    }
                    None => usize::from(range.parse::<u16>().is_ok()),
                })
                .sum();
            Some(ClusterNode {
                address,
                master: flags.contains(&"master"),
                failed: flags
                    .iter()
                    .any(|flag| *flag == "fail" || *flag == "noaddr"),
                slots,
            })
        })
        .collect()
}

/// The masters that serve slots, as `host:port`, from a `CLUSTER NODES` reply.
pub(crate) fn cluster_masters(nodes: &str) -> Vec<String> {
    let mut masters: Vec<String> = cluster_nodes(nodes)
        .into_iter()
        .filter(|node| node.master && !node.failed && node.slots > 0)
        .map(|node| node.address)
        .collect();
    masters.sort();
    masters
}

/// A cluster node taken for one server would list only its own share of the locks, as if that
/// were all of them: refused, with what to do instead.
async fn refuse_a_cluster_node(commands: &dyn Commands) -> Result<(), StoreError> {
    let mut info = redis::cmd("INFO");
    info.arg("cluster");
    let reply = commands.on_master("", Request::Cmd(&info)).await?;
    let clustered = text(reply).is_some_and(|info| info.contains("cluster_enabled:1"));
    if clustered {
        let found = "listing it would show only its own share of the locks";
        return Err(StoreError::from(super::redis::a_cluster_node(&found)));
    }
    Ok(())
}

/// Redlock: the quorum's view of `key`, from every master's look. A holder counts when a
/// majority of the masters name it; its time left is the time until fewer than a majority do.
pub(crate) async fn quorum_look(
    masters: &[RedisStore<Server>],
    key: &str,
) -> Result<Option<Snapshot>, StoreError> {
    let looks = futures_util::future::join_all(
        masters
            .iter()
            .map(|master| look(master as &dyn Commands, key)),
    )
    .await;
    quorum_view(key, looks)
}

/// [`mark_watched`] on every master; done once a majority has the mark (a release is
/// announced by each master that runs it, so a watch hears it from those).
pub(crate) async fn quorum_mark_watched(
    masters: &[RedisStore<Server>],
    key: &str,
) -> Result<(), StoreError> {
    let outcomes = futures_util::future::join_all(
        masters
            .iter()
            .map(|master| mark_watched(master as &dyn Commands, key)),
    )
    .await;
    let quorum = masters.len() / 2 + 1;
    let answered = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    if answered >= quorum {
        return Ok(());
    }
    Err(StoreError::short_of_quorum(outcomes, answered, quorum))
}

fn quorum_view(
    key: &str,
    looks: Vec<Result<Option<Snapshot>, StoreError>>,
) -> Result<Option<Snapshot>, StoreError> {
    let quorum = looks.len() / 2 + 1;
    let answered: Vec<Option<Snapshot>> = looks
        .iter()
        .filter_map(|l| l.as_ref().ok().cloned())
        .collect();
    if answered.len() < quorum {
        return Err(looks
            .into_iter()
            .find_map(Result::err)
            .unwrap_or(StoreError::NoQuorum {
                answered: answered.len(),
                needed: quorum,
            }));
    }
    let found: Vec<&Snapshot> = answered.iter().flatten().collect();
    let Some(first) = found.first() else {
        return Ok(None);
    };
    // Holders by token: a value may differ from master to master (a waiter's reservation
    // written at different looks), its token not.
    let mut holders: Vec<(String, Duration)> = Vec::new();
    let mut tokens: Vec<&str> = found
        .iter()
        .flat_map(|snapshot| {
            snapshot
                .holders
                .iter()
                .map(|(value, _)| protocol::holder_token(value))
        })
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    for token in tokens {
        let held: Vec<&(String, Duration)> = found
            .iter()
            .filter_map(|snapshot| {
                snapshot
                    .holders
                    .iter()
                    .find(|(value, _)| protocol::holder_token(value) == token)
            })
            .collect();
        if held.len() >= quorum {
            let mut lefts: Vec<Duration> = held.iter().map(|(_, left)| *left).collect();
            lefts.sort_unstable_by_key(|left| std::cmp::Reverse(*left));
            holders.push((held[0].0.clone(), lefts[quorum - 1]));
        }
    }
    if holders.is_empty() {
        return Ok(None);
    }
    Ok(Some(Snapshot {
        key: key.to_owned(),
        kind: first.kind,
        holders,
        // Fencing is refused on Redlock: no counter is the quorum's.
        fencing: None,
        waiters: known_to_a_majority(found.iter().map(|snapshot| snapshot.waiters), quorum),
        reserved_for: reserved_on_a_majority(&found, quorum),
    }))
}

/// The caller that a majority of the masters reserve the key for, if one (by its token: its
/// value may differ from master to master, written at different looks).
fn reserved_on_a_majority(found: &[&Snapshot], quorum: usize) -> Option<(String, u64)> {
    let token = |reservation: &(String, u64)| protocol::holder_token(&reservation.0).to_owned();
    found
        .iter()
        .filter_map(|snapshot| snapshot.reserved_for.as_ref())
        .find(|reservation| {
            let reserved = found
                .iter()
                .filter_map(|snapshot| snapshot.reserved_for.as_ref())
                .filter(|other| token(other) == token(reservation))
                .count();
            reserved >= quorum
        })
        .cloned()
}

/// The most that a majority of the masters report: the quorum-th largest of the figures (the
/// smallest when fewer report).
fn known_to_a_majority(figures: impl Iterator<Item = usize>, quorum: usize) -> usize {
    let mut figures: Vec<usize> = figures.collect();
    figures.sort_unstable_by_key(|figure| std::cmp::Reverse(*figure));
    figures
        .get(quorum - 1)
        .or(figures.last())
        .copied()
        .unwrap_or(0)
}

/// Redlock: removes `key`'s holders on every master; `true` when any master had one.
pub(crate) async fn quorum_force_release(
    masters: &[RedisStore<Server>],
    key: &str,
) -> Result<bool, StoreError> {
    let outcomes = futures_util::future::join_all(
        masters
            .iter()
            .map(|master| force_release(master as &dyn Commands, key)),
    )
    .await;
    let quorum = masters.len() / 2 + 1;
    let answered = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    if outcomes.iter().any(|outcome| matches!(outcome, Ok(true))) {
        return Ok(true);
    }
    if answered < quorum {
        return Err(StoreError::short_of_quorum(outcomes, answered, quorum));
    }
    Ok(false)
}

/// Redlock: one page of master `cursor.node`'s keys, each shown as the quorum sees it, and
/// only from the first master that holds it (so no lock is listed once per master).
pub(crate) async fn quorum_scan(
    masters: &[RedisStore<Server>],
    prefix: &str,
    mut cursor: Cursor,
) -> Result<Page, StoreError> {
    let Some(master) = masters.get(cursor.node) else {
        return Ok(Page::default());
    };
    let node = cursor.node;
    // Each master is a deployment of one server: its own cursor within it.
    let within = Cursor {
        node: 0,
        position: std::mem::take(&mut cursor.position),
        nodes: None,
    };
    let (on, keys, next) = scan_keys(master as &dyn Commands, prefix, within).await?;
    let keys = candidates(master as &dyn Commands, &on, keys).await?;
    let looks: Vec<Result<Option<Snapshot>, StoreError>> = stream::iter(keys)
        .map(|key| async move {
            let key = key.as_str();
            let looks = futures_util::future::join_all(
                masters
                    .iter()
                    .map(|master| look(master as &dyn Commands, key)),
            )
            .await;
            let listed_before = looks[..node]
                .iter()
                .any(|earlier| matches!(earlier, Ok(Some(_))));
            if listed_before {
                return Ok(None);
            }
            quorum_view(key, looks)
        })
        .buffered(LOOKS_IN_FLIGHT)
        .collect()
        .await;
    // The locks found, or the first failure.
    let locks = looks
        .into_iter()
        .filter_map(Result::transpose)
        .collect::<Result<Vec<_>, _>>()?;
    let next = match next {
        Some(within) => Some(Cursor {
            node,
            position: within.position,
            nodes: None,
        }),
        None => (node + 1 < masters.len()).then(|| Cursor {
            node: node + 1,
            ..Cursor::default()
        }),
    };
    Ok(Page { locks, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(holders: &[(&str, u64)]) -> Option<Snapshot> {
        Some(Snapshot {
            key: "k".to_owned(),
            kind: LockKind::Exclusive,
            holders: holders
                .iter()
                .map(|(token, ms)| ((*token).to_owned(), Duration::from_millis(*ms)))
                .collect(),
            fencing: None,
            waiters: 0,
            reserved_for: None,
        })
    }

    #[test]
    fn cluster_masters_are_the_nodes_that_serve_slots() {
        let nodes = "\
a 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b 127.0.0.1:7002@17002,host master - 0 0 2 connected 5461-10922
c 127.0.0.1:7003@17003 slave b 0 0 2 connected
d 127.0.0.1:7004@17004 master,fail - 0 0 3 disconnected 10923-16383
e 127.0.0.1:7005@17005 master - 0 0 4 connected
";
        assert_eq!(cluster_masters(nodes), ["127.0.0.1:7001", "127.0.0.1:7002"]);
        let all = cluster_nodes(nodes);
        assert_eq!(all.len(), 5);
        assert_eq!(all[0].slots, 5461);
        assert_eq!(all[2].address, "127.0.0.1:7003");
        assert!(!all[2].master && all[3].failed);
    }

    #[test]
    fn the_quorum_view_needs_a_majority_and_shows_its_time() {
        let view = quorum_view(
            "k",
            vec![
                Ok(snapshot(&[("a", 900)])),
                Ok(snapshot(&[("a", 700)])),
                Ok(None),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(view.holders, [("a".to_owned(), Duration::from_millis(700))]);

        let minority = quorum_view("k", vec![Ok(snapshot(&[("a", 900)])), Ok(None), Ok(None)]);
        assert_eq!(minority.unwrap(), None);

        let split = quorum_view(
            "k",
            vec![
                Ok(snapshot(&[("a", 900)])),
                Ok(snapshot(&[("b", 900)])),
                Ok(None),
            ],
        );
        assert_eq!(split.unwrap(), None);

        let down = quorum_view(
            "k",
            vec![
                Ok(snapshot(&[("a", 900)])),
                Err(StoreError::unavailable("down")),
                Err(StoreError::unavailable("down")),
            ],
        );
        assert!(down.is_err());
    }

    #[test]
    fn the_quorum_view_names_the_waiter_a_majority_reserves_for() {
        let reserved = |reservation: Option<&str>| {
            snapshot(&[("a", 900)]).map(|mut snapshot| {
                snapshot.reserved_for = reservation.map(|value| (value.to_owned(), 7));
                snapshot
            })
        };
        let view = |looks: Vec<Option<Snapshot>>| {
            quorum_view("k", looks.into_iter().map(Ok).collect())
                .unwrap()
                .unwrap()
                .reserved_for
        };
        // The same waiter's token, its value written at different looks.
        let majority = view(vec![
            reserved(Some("w;1")),
            reserved(None),
            reserved(Some("w;2")),
        ]);
        assert_eq!(majority.map(|(value, _)| value), Some("w;1".to_owned()));
        let minority = view(vec![
            reserved(Some("w;1")),
            reserved(None),
            reserved(Some("v;1")),
        ]);
        assert_eq!(minority, None);
    }

    #[test]
    fn only_what_the_library_writes_is_a_lock() {
        let token = "0123456789abcdef0123456789abcdef";
        let string = |value: &str, pttl: i64| {
            Value::Array(vec![
                Value::BulkString(b"string".to_vec()),
                Value::BulkString(b"".to_vec()),
                Value::Int(0),
                Value::BulkString(value.as_bytes().to_vec()),
                Value::Int(pttl),
            ])
        };
        let held = read_look("k", string(&format!("{token}+"), 5000)).unwrap();
        assert_eq!(
            held.holders[0].0, token,
            "a waiter's mark is no part of the holder"
        );
        let value = protocol::Origin::new("h", 7, "app").value(token, 9);
        let held = read_look("k", string(&format!("{value}+"), 5000)).unwrap();
        assert_eq!(held.holders[0].0, value);
        assert_eq!(held.reserved_for, None);
        let reservation = protocol::Origin::new("web-3", 42, "billing")
            .value("fedcba9876543210fedcba9876543210", 11);
        let reserved = format!("{value}+1700000000000/5000/1/{reservation}");
        let held = read_look("k", string(&reserved, 5000)).unwrap();
        assert_eq!(
            held.holders[0].0, value,
            "the reservation is no part of the holder"
        );
        assert_eq!(held.reserved_for, Some((reservation, 1_700_000_000_000)));
        assert_eq!(read_look("k", string("hello", 5000)), None);
        assert_eq!(
            read_look("k", string(token, -1)),
            None,
            "no expiry: not ours"
        );
        let hash = |kind: &str| {
            Value::Array(vec![
                Value::BulkString(b"hash".to_vec()),
                Value::BulkString(b"12".to_vec()),
                Value::Int(3),
                Value::BulkString(kind.as_bytes().to_vec()),
                Value::BulkString(token.as_bytes().to_vec()),
                Value::Int(400),
            ])
        };
        let shared = read_look("k", hash("permits:2")).unwrap();
        assert_eq!(shared.kind, LockKind::Permits(2));
        assert_eq!(shared.fencing, Some(12));
        assert_eq!(shared.waiters, 3);
        assert_eq!(read_look("k", hash("")), None);
    }
}
