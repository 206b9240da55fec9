-- Extend many leases in one call, each only while it is still held by its value: an exclusive
-- lock's key is extended; a shared lock's holder gets a new expiry and the key lives as long as
-- its longest-living holder. A missing key is never re-created: that lease is lost. A key
-- replaced by a value of another type is lost too, and costs the other leases nothing.
-- KEYS[i] = lock key, ARGV[2i-1] = its lease's value, ARGV[2i] = its ttl in ms.
-- Returns one integer per key: 1 extended, 0 lost and gone (no such key, or no live field of
-- ours in a shared lock's hash), 2 lost to another owner (another value or another type).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local extended = {}
for i, key in ipairs(KEYS) do
  local token, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  extended[i] = 0
  local holder = redis.pcall('GET', key)
  -- Ours, or ours marked by a waiter (perhaps reserved for one, see acquire.lua).
  if holder == token or (type(holder) == 'string' and string.sub(holder, 1, #token + 1) == token .. '+') then
    redis.call('PEXPIRE', key, ttl)
    extended[i] = 1
  elseif type(holder) == 'table' and redis.call('TYPE', key)['ok'] == 'hash' then
    local expires = tonumber(redis.call('HGET', key, token))
    if expires and expires > now then
      redis.call('HSET', key, token, string.format('%d', now + ttl))
      live_holders(key, now, true)
      extended[i] = 1
    end
  elseif holder then
    extended[i] = 2
  end
end
return extended
