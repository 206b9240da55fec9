-- A waiter leaves without the lock (its wait ran out, it failed, or its caller went away): it is
-- no longer counted, its claim against new readers (a writer's, see acquire.lua) and a
-- reservation of the key for it are taken off, and a key already handed to it (a release gave
-- it the key while it was giving up) is given back and announced, so that nobody waits on a
-- lock its holder never knew it had.
-- KEYS[1] = lock key; KEYS[2] = the release channel (a key here, so that a cluster refuses a
-- channel outside the key's slot); KEYS[3] = the callers waiting for the key (see values.lua);
-- KEYS[4] = the writers waiting for its readers to leave; ARGV[1] = the waiter's token;
-- ARGV[2] = 'sharded' for a cluster's sharded channel (SPUBLISH), '' otherwise (PUBLISH).
-- Returns 1 when the key was handed to it and is given back, 2 when its reservation was taken
-- off, 0 otherwise.
local key, token = KEYS[1], ARGV[1]
redis.call('HDEL', KEYS[3], token)
if redis.call('HLEN', KEYS[3]) <= 1 then redis.call('PEXPIRE', KEYS[3], 1000) end
redis.call('ZREM', KEYS[4], token)
local stored = redis.pcall('GET', key)
if type(stored) ~= 'string' then
  return 0
end
local holder, after = string.match(stored, '^([^+]*)%+?(.*)$')
if string.match(holder, '^[^;]*') == token then
  redis.call('DEL', key)
  redis.call(ARGV[2] == 'sharded' and 'SPUBLISH' or 'PUBLISH', KEYS[2], holder)
  return 1
end
if string.match(after, '^%d+/%d+/%d+/([^;]*)') == token then
  redis.call('SET', key, holder .. '+', 'KEEPTTL')
  return 2
end
return 0
