-- Release every key of a multi-key lease still held by its value, and tell waiters: each key
-- is deleted as release.lua deletes an exclusive lock (or handed to the caller it is reserved
-- for), and announced on its own channel when a waiter marked it (its value followed by '+',
-- see acquire.lua and acquire_many.lua) or a watch follows it (a key named as its release
-- channel exists, see protocol.rs).
-- KEYS[1..n] = the lock keys; KEYS[n+1..2n] = their release channels, and the names of their
-- watch marks, in the same order (keys here, so that a cluster refuses a channel outside the
-- keys' slot); ARGV[1] = our lease's value; ARGV[2] = 'sharded' for a cluster's sharded channels
-- (SPUBLISH), '' or absent otherwise (PUBLISH); ARGV[3] = milliseconds left of the lease's
-- `hold_at_least`, given only while it runs: then each key is kept that long instead (its
-- holder's value stays), and whoever waits or watches is told to look again (an empty
-- message), as release.lua does. ARGV[4] = 'undo' for an attempt that did not win the lock (a busy slot
-- after others were taken, an answer lost): announced as "look again" (an empty message), as
-- release.lua does.
-- Returns how many keys were ours and are gone (or kept) now.
local n = #KEYS / 2
local token = ARGV[1]
local sharded = ARGV[2] == 'sharded'
local publish = sharded and 'SPUBLISH' or 'PUBLISH'
local kept = tonumber(ARGV[3])
local message = ARGV[4] == 'undo' and '' or token
local released = 0
-- Every lock's value (false for none, or a shared lock's hash) and every watch mark, at once.
local found = redis.call('MGET', unpack(KEYS))
-- Each key of ours, and the caller it is reserved for: `{ttl, keys, value}`, or false.
local ours, reserved = {}, {}
for i = 1, n do
  local holder = found[i]
  if holder == token then
    ours[i], reserved[i] = true, false
  elseif holder and string.sub(holder, 1, #token + 1) == token .. '+' then
    ours[i] = true
    local ttl, keys, next_value = string.match(string.sub(holder, #token + 2), '^%d+/(%d+)/(%d+)/(.*)$')
    reserved[i] = ttl and {ttl, tonumber(keys), next_value} or false
  end
end
-- A caller of several keys is handed them only when they are all released here at once: these
-- keys, each reserved for it (it waits for no other key, or it would not own them all).
local function reserved_all_here(next_value, keys)
  if keys ~= n then return false end
  for i = 1, n do
    if not (reserved[i] and reserved[i][3] == next_value) then return false end
  end
  return true
end
for i = 1, n do
  if ours[i] then
    local listened = found[i] ~= token or found[n + i]
    local next = reserved[i]
    if kept then
      redis.call('PEXPIRE', KEYS[i], kept)
      -- The key frees itself when the hold ends, unannounced: a caller of it alone it is
      -- reserved for is named, so that it looks now (and learns when), as in release.lua.
      local named = ''
      if next and next[2] == 1 then named = '>' .. string.match(next[3], '^[^;]*') end
      if listened then redis.call(publish, KEYS[n + i], named) end
    elseif next and message ~= '' and (next[2] == 1 or reserved_all_here(next[3], next[2])) then
      -- Handed to the caller it is reserved for, marked; only it is told.
      redis.call('SET', KEYS[i], next[3] .. '+', 'PX', next[1])
      redis.call(publish, KEYS[n + i], message .. '>' .. string.match(next[3], '^[^;]*'))
    else
      -- A watched key keeps the watch's mark (see release.lua and watch.lua).
      local life = found[n + i] and redis.call('PTTL', KEYS[n + i]) or 0
      if life > 0 then
        redis.call('SET', KEYS[i], '+', 'PX', life)
      else
        redis.call('DEL', KEYS[i])
      end
      if listened then redis.call(publish, KEYS[n + i], message) end
    end
    released = released + 1
  end
end
return released
