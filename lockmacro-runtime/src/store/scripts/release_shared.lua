-- The end of release.lua (after holders.lua): a shared lock's holder leaves, or is kept for what
-- is left of its hold; the key lives as long as its longest-living holder. Any other type of key
-- is not ours.
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
live_holders(key, now, true)
redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[2], message)
return 1
