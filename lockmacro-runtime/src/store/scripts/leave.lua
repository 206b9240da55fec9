-- A waiter leaves without the lock (its wait ran out, it failed, or its caller went away): it is
-- no longer counted, its place in a fair queue and its claim against new readers (a writer's,
-- see acquire.lua) and its reservations of the key (in the holder's value and among the key's
-- waiters, see waiters.lua) are taken off, and a key already handed to it (a release gave it the
-- key while it was giving up) is given back and announced, so that nobody waits on a lock its
-- holder never knew it had. A fair queue's head that leaves while others queue behind it, or a
-- caller the free key was reserved for, when no exclusive holder holds the key, is announced as
-- "look again" (an empty message): the next in line may take the key now, and a lock nobody
-- holds has no release to wake it.
-- KEYS[1] = lock key; KEYS[2] = the release channel (a key here, so that a cluster refuses a
-- channel outside the key's slot); KEYS[3] = the callers waiting for the key (see values.lua);
-- KEYS[4] = the writers waiting for its readers to leave; KEYS[5] = the fair queue; KEYS[6] =
-- its places' expiries (see acquire.lua); ARGV[1] = the waiter's token; ARGV[2] = 'sharded' for
-- a cluster's sharded channel (SPUBLISH), '' otherwise (PUBLISH).
-- Returns 1 when the key was handed to it and is given back, 2 when its reservation was taken
-- off, 3 when callers it kept out of the free key (the fair queue's next in line, or any when
-- the key was reserved for it) were told to look again, 0 otherwise.
local key, token = KEYS[1], ARGV[1]
local publish = ARGV[2] == 'sharded' and 'SPUBLISH' or 'PUBLISH'
redis.call('HDEL', KEYS[3], token)
-- Whether the free key stood reserved for it: the next caller it is reserved for moves up.
local first, next = reservations(KEYS[3])
local reserved = reserver_of(first) == token
unreserve(KEYS[3], token, first, next)
if redis.call('HLEN', KEYS[3]) <= 1 then redis.call('PEXPIRE', KEYS[3], 1000) end
redis.call('ZREM', KEYS[4], token)
-- Whether it headed the queue (its place lapsed or not, as acquire.lua's queue_head finds it)
-- with others behind it.
local headed = redis.call('LINDEX', KEYS[5], 0) == token
redis.call('LREM', KEYS[5], 1, token)
redis.call('HDEL', KEYS[6], token)
-- Callers it kept out of a free key: those behind it in the queue, or any, when reserved for it.
local kept_out = (headed and redis.call('LLEN', KEYS[5]) > 0) or reserved
local stored = redis.pcall('GET', key)
if type(stored) ~= 'string' then
  -- No key, or a shared lock (a hash): nobody holds it exclusively.
  if kept_out then
    redis.call(publish, KEYS[2], '')
    return 3
  end
  return 0
end
local holder, after = string.match(stored, '^([^+]*)%+?(.*)$')
if string.match(holder, '^[^;]*') == token then
  redis.call('DEL', key)
  redis.call(publish, KEYS[2], holder)
  return 1
end
if string.match(after, '^%d+/%d+/%d+/([^;]*)') == token then
  redis.call('SET', key, holder .. '+', 'KEEPTTL')
  return 2
end
if kept_out and holder == '' then
  -- A watch's mark alone ('+'): the key is free.
  redis.call(publish, KEYS[2], '')
  return 3
end
return 0
