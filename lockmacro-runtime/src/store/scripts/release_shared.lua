-- The end of release.lua (after holders.lua): a shared lock's holder leaves, or is kept for what
-- is left of its hold; the key lives as long as its longest-living holder. Any other type of key
-- is not ours. KEYS[3] = the callers waiting for the key (see waiters.lua): a key reserved for a
-- writer (see waiters.lua) names it (`{released value}>{its token}`), so that it looks now,
-- wherever it runs, and not only the one waiter each client wakes.
if redis.call('TYPE', key)['ok'] ~= 'hash' then
  return 0
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if kept then
  local expires = tonumber(redis.call('HGET', key, token))
  if not expires or expires <= now then
    return 0
  end
  redis.call('HSET', key, token, string.format('%d', now + kept))
elseif redis.call('HDEL', key, token) == 0 then
  return 0
end
-- The last holder out, or a hold that keeps the key (it frees itself, unannounced, when the
-- hold ends), names a writer the key is reserved for: it looks now (and learns when).
if (live_holders(key, now, true) == 0 and message ~= '' or kept) and KEYS[3] then
  local reserved = redis.call('HGET', KEYS[3], 'reserved')
  local reserver = reserved and string.match(reserved, '^%d+/%d+/%d+/([^;]*)')
  local lapses = reserver and tonumber(redis.call('HGET', KEYS[3], reserver))
  if lapses and lapses > now then message = message .. '>' .. reserver end
end
redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[2], message)
return 1
