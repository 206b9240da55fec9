-- Release every key of a multi-key lease still held by its token, and tell waiters: each key
-- is deleted as release.lua deletes an exclusive lock, and announced on its own channel when a
-- waiter marked it (its token followed by '+', see acquire.lua and acquire_many.lua) or a watch
-- follows it (a key named as its release channel exists, see protocol.rs).
-- KEYS[1..n] = the lock keys; KEYS[n+1..2n] = their release channels, and the names of their
-- watch marks, in the same order (keys here, so that a cluster refuses a channel outside the
-- keys' slot); ARGV[1] = our token; ARGV[2] = 'sharded' for a cluster's sharded channels
-- (SPUBLISH), '' or absent otherwise (PUBLISH); ARGV[3] = milliseconds left of the lease's
-- `hold_at_least`, given only while it runs: then each key is kept that long instead (its
-- holder's token stays), and whoever waits or watches is told to look again (an empty
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
for i = 1, n do
  local holder = found[i]
  if holder == token or holder == token .. '+' then
    local listened = holder ~= token or found[n + i]
    if kept then
      redis.call('PEXPIRE', KEYS[i], kept)
      if listened then redis.call(publish, KEYS[n + i], '') end
    else
      redis.call('DEL', KEYS[i])
      if listened then redis.call(publish, KEYS[n + i], message) end
    end
    released = released + 1
  end
end
return released
