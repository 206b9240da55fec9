-- Take several exclusive locks for one token in one atomic step: all of them, or none.
-- KEYS = the lock keys (distinct; on a cluster, all in one slot). ARGV[1] = token; ARGV[2] = ttl
-- ms; ARGV[3] = '1' when the caller will wait.
--
-- Each key is taken as acquire.lua takes an exclusive lock: a string holding the token. A key
-- that holds our token already (marked or not) is a call retried after it ran: it keeps its
-- value and gets the ttl. A caller that waits marks the busy key ('+' after its holder's
-- token, see acquire.lua), so that its release is announced.
-- Returns {1} when every key was taken; {0, i, ms until KEYS[i] may be free, -1 if not known}
-- when KEYS[i] is the first busy key (nothing was taken).
local token, ttl, waiting = ARGV[1], ARGV[2], ARGV[3] == '1'
local marked = token .. '+'
local values = {}
for i, key in ipairs(KEYS) do
  local holder = redis.pcall('GET', key)
  if type(holder) == 'table' then
    -- Not a string: a shared lock (readers, permits) holds it.
    return {0, i, redis.call('PTTL', key)}
  end
  if holder and holder ~= token and holder ~= marked then
    if waiting and string.sub(holder, -1) ~= '+' then
      redis.call('APPEND', key, '+')
    end
    return {0, i, redis.call('PTTL', key)}
  end
  values[i] = holder
end
for i, key in ipairs(KEYS) do
  if values[i] then
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('SET', key, token, 'PX', ttl)
  end
end
return {1}
