-- Release every key of a multi-key lease still held by its token, and tell waiters: each key
-- is deleted as release.lua deletes an exclusive lock, and announced on its own channel when a
-- waiter marked it (its token followed by '+', see acquire.lua and acquire_many.lua).
-- KEYS[1..n] = the lock keys; KEYS[n+1..2n] = their release channels, in the same order (keys
-- here, so that a cluster refuses a channel outside the keys' slot); ARGV[1] = our token;
-- ARGV[2] = 'sharded' for a cluster's sharded channels (SPUBLISH), absent otherwise (PUBLISH).
-- Returns how many keys were ours and are gone now.
local n = #KEYS / 2
local token = ARGV[1]
local publish = ARGV[2] == 'sharded' and 'SPUBLISH' or 'PUBLISH'
local released = 0
for i = 1, n do
  local holder = redis.pcall('GET', KEYS[i])
  if holder == token then
    redis.call('DEL', KEYS[i])
    released = released + 1
  elseif holder == token .. '+' then
    redis.call('DEL', KEYS[i])
    redis.call(publish, KEYS[n + i], token)
    released = released + 1
  end
end
return released
