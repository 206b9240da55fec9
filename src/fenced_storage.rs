//! A storage that honours fencing tokens, as Kleppmann's answer to paused holders: an operation
//! is accepted only with a fencing token at least as high as any it has seen.
//!
//! Reads are fenced too: a read-modify-write whose read came before a newer holder's read would
//! otherwise write back a value computed from stale data with a token the storage still accepts
//! (both holders read `n`, the older one writes `n + 1` first, the newer one then writes `n + 1`
//! again: a lost update that write-only fencing lets through). A read with a token raises the
//! floor, so the older holder's write is rejected.
//!
//! Every accepted write is also appended to `{data}:applied` as `"{fence} {value}"`, in the order
//! the storage applied them, so a checker can read the history the storage itself saw.

/// KEYS[1] = data, KEYS[2] = highest token seen, KEYS[3] = applied writes; ARGV[1] = token,
/// ARGV[2] = value. Returns 1 when written, 0 when rejected as stale.
const FENCED_WRITE_LUA: &str = r"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < seen then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[1] .. ' ' .. ARGV[2])
return 1
";

/// KEYS[1] = data, KEYS[2] = highest token seen; ARGV[1] = token. Returns `{value}` (`''` when
/// unset) when the token is not stale, raising the floor to it; `false` (nil) when rejected.
const FENCED_READ_LUA: &str = r"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < seen then
  return false
end
redis.call('SET', KEYS[2], ARGV[1])
return {redis.call('GET', KEYS[1]) or ''}
";

/// Writes `value` to `data` with fencing token `fence` (the highest seen lives at `{data}:fence`);
/// `true` when accepted, `false` when rejected as stale.
pub async fn fenced_write(
    conn: &mut redis::aio::MultiplexedConnection,
    data: &str,
    fence: u64,
    value: &str,
) -> bool {
    let accepted: i64 = redis::Script::new(FENCED_WRITE_LUA)
        .key(data)
        .key(format!("{data}:fence"))
        .key(format!("{data}:applied"))
        .arg(fence.to_string())
        .arg(value)
        .invoke_async(conn)
        .await
        .expect("fenced write script");
    accepted == 1
}

/// Reads `data` with fencing token `fence`: `Some(value)` (empty when unset) when accepted,
/// `None` when rejected as stale. An accepted read makes every later operation with a lower
/// token stale.
pub async fn fenced_read(
    conn: &mut redis::aio::MultiplexedConnection,
    data: &str,
    fence: u64,
) -> Option<String> {
    let reply: Option<Vec<String>> = redis::Script::new(FENCED_READ_LUA)
        .key(data)
        .key(format!("{data}:fence"))
        .arg(fence.to_string())
        .invoke_async(conn)
        .await
        .expect("fenced read script");
    reply.map(|mut value| value.pop().unwrap_or_default())
}

/// Every write `data` accepted, oldest first, as `(fence, value)`.
pub async fn applied_writes(
    conn: &mut redis::aio::MultiplexedConnection,
    data: &str,
) -> Vec<(u64, String)> {
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{data}:applied"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("LRANGE of applied writes");
    entries
        .iter()
        .filter_map(|entry| {
            let (fence, value) = entry.split_once(' ')?;
            Some((fence.parse().ok()?, value.to_owned()))
        })
        .collect()
}
