-- Compare-and-delete: remove the lock only while it still holds our token, and tell waiters.
-- KEYS[1] = lock key, ARGV[1] = our token. Returns 1 when deleted, 0 when not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', 'lockmacro:released:' .. KEYS[1], '')
  return 1
end
return 0
