//! A storage that honours fencing tokens, as Kleppmann's answer to paused holders: a write is
//! accepted only with a fencing token at least as high as any it has seen.

/// KEYS[1] = data, KEYS[2] = highest token seen; ARGV[1] = token, ARGV[2] = value.
/// Returns 1 when written, 0 when rejected as stale.
const FENCED_WRITE_LUA: &str = r"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < seen then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
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
        .arg(fence.to_string())
        .arg(value)
        .invoke_async(conn)
        .await
        .expect("fenced write script");
    accepted == 1
}
