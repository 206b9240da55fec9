-- Remove every holder of a lock at an operator's request, and announce it so waiters look again
-- at once. The caller read the key first (inspect.lua) and says what it found, so nothing but
-- that lock is removed: an exclusive lock still held by that holder's token (whatever marks
-- follow), or a shared lock still of that kind. The announcement is each removed holder's
-- value. The fair queue and writers' claims beside the key are left
-- as they are: the next in line still gets its turn, and a waiting writer still keeps new
-- readers out.
--
-- KEYS[1] = lock key; KEYS[2] = the release channel (a key, as in release.lua, so that a
-- cluster refuses a channel outside the key's slot). ARGV[1] = 'sharded' for a cluster's
-- sharded channel (SPUBLISH), '' otherwise (PUBLISH); ARGV[2] = 'x' for an exclusive lock or
-- the shared lock's `kind` tag; ARGV[3] = the exclusive holder's token ('' for a shared lock).
--
-- Returns how many holders were removed (0: the key no longer held what the caller read).
local key, channel = KEYS[1], KEYS[2]
local publish = ARGV[1] == 'sharded' and 'SPUBLISH' or 'PUBLISH'
local ktype = redis.call('TYPE', key)['ok']
if ARGV[2] == 'x' then
  if ktype ~= 'string' then return 0 end
  local holder = string.match(redis.call('GET', key), '^[^+]*')
  if string.match(holder, '^[^;]*') ~= ARGV[3] then return 0 end
  redis.call('DEL', key)
  redis.call(publish, channel, holder)
  return 1
end
if ktype ~= 'hash' or redis.call('HGET', key, 'kind') ~= ARGV[2] then return 0 end
local fields = redis.call('HGETALL', key)
redis.call('DEL', key)
local removed = 0
for i = 1, #fields, 2 do
  if fields[i] ~= 'kind' then
    removed = removed + 1
    redis.call(publish, channel, fields[i])
  end
end
return removed
