-- Extend many leases in one call: PEXPIRE each key only while it still holds our token.
-- A missing key is never re-created: it means that lease is lost (and waiters are told).
-- KEYS[i] = lock key, ARGV[2i-1] = its token, ARGV[2i] = its ttl in ms.
-- Returns one integer per key: 1 extended, 0 lost.
local extended = {}
for i, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    extended[i] = 1
  else
    if not holder then
      redis.call('PUBLISH', 'lockmacro:released:' .. key, '')
    end
    extended[i] = 0
  end
end
return extended
