-- Pass an exclusive lock straight to the next holder, a waiter of the same client: while the
-- key still holds our token, it gets the next holder's token and ttl, with no moment free and
-- nothing announced. A waiter's mark stays on the key (the next holder's token followed by
-- '+'): whoever marked it still waits, and the next release must be announced to it. When
-- another client is subscribed to the key's releases (one of its callers waits, or a watch
-- follows the key), the lock is released and announced instead, so a busy client cannot keep
-- a key to itself and a watch sees every holder. Subscribers are counted only for a key a
-- waiter marked or a watch follows (its watch mark, see release.lua): a waiter of another
-- client marks the key at its first look once subscribed, so an unmarked key's hand-over
-- leaves nobody out (that waiter's look finds the next holder, and marks it).
-- KEYS[1] = lock key; KEYS[2] = the release channel, and the name of its watch mark (a key
-- here, so that a cluster refuses a channel outside the key's slot); ARGV[1] = our token;
-- ARGV[2] = the next holder's token; ARGV[3] = its ttl in ms; ARGV[4] = 'sharded' for a cluster's sharded channel (counted by
-- SHARDNUMSUB, announced by SPUBLISH), absent otherwise (NUMSUB, PUBLISH).
-- Returns 1 when handed over, 2 when released and announced instead, 0 when the key was not
-- ours (nothing changed).
local key, token = KEYS[1], ARGV[1]
-- The lock's value (false for no key or a shared lock's hash) and its watch mark.
local found = redis.call('MGET', key, KEYS[2])
local holder = found[1]
local next_value = ARGV[2]
if holder ~= token and holder ~= token .. '+' then
  return 0
end
local marked = holder ~= token
if marked or found[2] then
  -- Our own client's subscription is one; any other is another client waiting or watching. A
  -- user the ACL does not allow to count subscribers gets a plain release and announcement.
  local sharded = ARGV[4] == 'sharded'
  local subscribers = redis.pcall('PUBSUB', sharded and 'SHARDNUMSUB' or 'NUMSUB', KEYS[2])
  if subscribers.err or subscribers[2] > 1 then
    redis.call('DEL', key)
    redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[2], token)
    return 2
  end
end
if marked then
  next_value = next_value .. '+'
end
redis.call('SET', key, next_value, 'PX', ARGV[3])
return 1
