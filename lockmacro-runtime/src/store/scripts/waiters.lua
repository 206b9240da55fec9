-- The callers waiting for a key, one home for the scripts that count them and serve them (put
-- in front of acquire.lua, acquire_many.lua and hand_over.lua by `scripts.rs`): a hash of their
-- tokens, each holding when its entry lapses (ms, server clock), and the `served` field (see
-- protocol.rs).

-- Counts a waiting caller (`token`) in `waiters` until `now + life`; the hash lives as long as
-- its longest entry.
local function count_waiter(waiters, token, now, life)
  redis.call('HSET', waiters, token, string.format('%d', now + life))
  if redis.call('PTTL', waiters) < life then redis.call('PEXPIRE', waiters, life) end
end

-- Whether a caller other than `token` is counted in `waiters`: a lock taken on a free key is
-- then marked, so that its release is announced to callers kept out by something that bears no
-- mark (a writer's claim against new readers, a fair queue's head). An entry may have lapsed:
-- marking for it costs one announcement, nothing more.
local function others_waiting(waiters, token)
  local fields = redis.call('HLEN', waiters)
  if fields == 0 then return false end
  return fields - redis.call('HEXISTS', waiters, 'served') - redis.call('HEXISTS', waiters, token) > 0
end

-- Once nobody is counted any more, the hash (its `served` field) lives one more second: a
-- burst of waiters that follows at once finds how fast the last one was served; a key nobody
-- waits for leaves nothing behind.
local function forget_when_idle(waiters)
  if redis.call('HLEN', waiters) <= 1 then redis.call('PEXPIRE', waiters, 1000) end
end

-- A waiting caller (`token`) got the lock: it leaves `waiters`, and the served field keeps the
-- mean time between two callers served (for `retry_after`). `now` is read here when not given:
-- a caller that never waited long enough to be counted costs one command.
local function served(waiters, token, now)
  if redis.call('HDEL', waiters, token) == 0 then return end
  if not now then
    local clock = redis.call('TIME')
    now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  end
  local last, mean = string.match(redis.call('HGET', waiters, 'served') or '', '^(%d+);(%-?%d+)$')
  local gap = last and now - tonumber(last)
  if gap and gap >= 0 then
    mean = tonumber(mean)
    if mean < 0 then mean = gap else mean = math.floor((mean * 3 + gap) / 4) end
  else
    mean = -1
  end
  redis.call('HSET', waiters, 'served', string.format('%d;%d', now, mean))
  forget_when_idle(waiters)
end

-- How long a caller that comes back now may wait: the callers counted ahead of it, each served
-- in the mean time between two; the holder's `remaining` lease when nothing is known (-1: not
-- known either).
local function estimate(waiters, remaining)
  local mean = tonumber(string.match(redis.call('HGET', waiters, 'served') or '', ';(%-?%d+)$'))
  if not mean or mean < 0 then return remaining end
  local ahead = redis.call('HLEN', waiters) - 1
  local first = mean
  if remaining >= 0 and remaining < first then first = remaining end
  return first + ahead * mean
end
