-- Release one lease, only while it is still held by its token, and tell waiters: an exclusive
-- lock's key is deleted; a shared lock's holder leaves, and the key goes with its last holder.
-- An exclusive lock is announced when a waiter marked it (its token followed by '+', see
-- acquire.lua) or when someone listens on its channel (a watch, a waiter about to mark it): a
-- release nobody waits for or watches costs no PUBLISH. A user the ACL does not allow to count
-- subscribers gets the announcement.
-- KEYS[1] = lock key; KEYS[2] = the release channel (a key here, so that a cluster refuses a
-- channel outside the key's slot rather than announce where nobody listens); ARGV[1] = our
-- token; ARGV[2] = 'sharded' for a cluster's sharded channel (announced by SPUBLISH), absent
-- otherwise (PUBLISH): one argument fewer for Redis to read on every release of a single server.
-- The message is the released token, which tells one release from the next.
-- ARGV[3] = milliseconds left of the lease's `hold_at_least` while it runs, else '' or absent:
-- see the branch below. ARGV[4] = 'undo' for an attempt that did not win the lock (a minority
-- of Redlock's masters, an answer lost): no holder held it, so its release is announced as
-- "look again" (an empty message), which a watch does not report as a hold. ARGV[2] is given
-- ('' for none) whenever a later argument is.
-- Returns 1 when our lease was removed (or kept), 0 when it was not ours (gone, another token,
-- another type).
local key, token = KEYS[1], ARGV[1]
local kept = tonumber(ARGV[3])
local message = ARGV[4] == 'undo' and '' or token

if kept then
  -- hold_at_least: the key is not freed yet. It keeps its holder's token (a shared lock, its
  -- holder's field) and expires when the hold is over, longer or sooner than its lease. Nothing
  -- is free, but the key's end moved: whoever waits or listens is told to look again (an empty
  -- message, no token released), so a waiter sleeps until the hold's end, not its lease's.
  local sharded = ARGV[2] == 'sharded'
  local holder = redis.pcall('GET', key)
  if holder == token or holder == token .. '+' then
    redis.call('PEXPIRE', key, kept)
    local listening = redis.pcall('PUBSUB', sharded and 'SHARDNUMSUB' or 'NUMSUB', KEYS[2])
    if holder ~= token or listening.err or listening[2] > 0 then
      redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[2], '')
    end
    return 1
  elseif type(holder) == 'table' and redis.call('TYPE', key)['ok'] == 'hash' then
    local now = server_ms()
    local expires = tonumber(redis.call('HGET', key, token))
    if expires and expires > now then
      redis.call('HSET', key, token, string.format('%d', now + kept))
      expire_with_holders(key, now)
      redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[2], '')
      return 1
    end
  end
  return 0
end
local holder = redis.pcall('GET', key)
if holder == token then
  redis.call('DEL', key)
  local listening = redis.pcall('PUBSUB', ARGV[2] == 'sharded' and 'SHARDNUMSUB' or 'NUMSUB', KEYS[2])
  if not listening.err and listening[2] == 0 then
    return 1
  end
elseif holder == token .. '+' then
  redis.call('DEL', key)
elseif type(holder) == 'table' and redis.call('TYPE', key)['ok'] == 'hash'
    and redis.call('HDEL', key, token) == 1 then
  expire_with_holders(key, server_ms())
else
  return 0
end
redis.call(ARGV[2] == 'sharded' and 'SPUBLISH' or 'PUBLISH', KEYS[2], message)
return 1
