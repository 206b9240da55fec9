-- Take the lock (as SET NX PX) and, in the same atomic step, hand out a fencing token or report
-- how long the current holder's lease has left.
-- KEYS[1] = lock key; KEYS[2] = fencing counter (only when fencing); ARGV[1] = token; ARGV[2] = ttl ms.
-- Returns {1, fencing token (0 without fencing)} when taken, {0, remaining ms} when busy.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if #KEYS < 2 then
    return {1, 0}
  end
  -- Strictly increasing, even if the counter is lost (restart without persistence): never
  -- below the server clock in microseconds.
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local fence = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
  if fence < floor then
    fence = floor
  end
  redis.call('SET', KEYS[2], string.format('%d', fence))
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
