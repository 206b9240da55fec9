-- The callers waiting for a key, one home for the scripts that count them and serve them (put
-- in front of acquire.lua, acquire_many.lua and hand_over.lua by `scripts.rs`): a hash of their
-- tokens, each holding when its entry lapses (ms, server clock), the `served` field, and the
-- `reserved` and `reserved_next` fields (see protocol.rs).
--
-- `reserved` keeps the reservation of a caller of this key alone that waited too long
-- (`{since_ms}/{ttl_ms}/1/{its value}`, as after a holder's mark): a lock that frees itself
-- without a release (its lease or its `hold_at_least` ran out, its last reader's lease ended)
-- cannot hand itself over, and a reservation that lived in its value alone would go with it, so
-- the free key would go to whoever looks first. While its caller is counted here, the free key
-- waits for it: any other caller finds it busy. `reserved_next` keeps the next such callers, in
-- the order they go (`before`), '|' between two: when the first takes the key or leaves, the
-- next's reservation moves up and marks the new holder's value, so that its release hands the
-- key on. Every caller past the bound is recorded, however many wait.


-- The token of the caller reservation `r` names (nil for nil).
local function reserver_of(r)
  return r and string.match(r, '^%d+/%d+/%d+/([^;]*)')
end

-- Counts a waiting caller (`token`) in `waiters` until `now + life`; the hash lives as long as
-- its longest entry.
local function count_waiter(waiters, token, now, life)
  redis.call('HSET', waiters, token, string.format('%d', now + life))
  if redis.call('PTTL', waiters) < life then redis.call('PEXPIRE', waiters, life) end
end

-- Whether a caller other than `token` is counted in `waiters` (a lock taken on a free key is
-- then marked, so that its release is announced to callers kept out by something that bears no
-- mark: a writer's claim against new readers, a fair queue's head, a reservation); then, when the
-- free key stands reserved for another caller, when its reservation lapses (ms) and the
-- reservation. An entry may
-- have lapsed: marking for it costs one announcement, nothing more. `now` is read here when
-- needed and not given.
local function others_waiting(waiters, token, now)
  local fields = redis.call('HLEN', waiters)
  if fields == 0 then return false, nil end
  local found = {redis.call('HEXISTS', waiters, 'served') == 1, reservations(waiters)}
  found[4] = redis.call('HEXISTS', waiters, token) == 1
  local counted = 0
  for i = 1, 4 do
    if found[i] then counted = counted + 1 end
  end
  local others = fields > counted
  if not found[2] then return others, nil end
  local order = queued(found[3])
  table.insert(order, 1, found[2])
  for _, r in ipairs(order) do
    local reserver = reserver_of(r)
    if reserver == token then return others, nil end
    if reserver then
      if not now then
        local clock = redis.call('TIME')
        now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
      end
      local lapses = tonumber(redis.call('HGET', waiters, reserver))
      if lapses and lapses > now then return others, lapses, r end
    end
  end
  return others, nil
end

-- Once nobody is counted any more, the hash (its `served` field) lives one more second: a
-- burst of waiters that follows at once finds how fast the last one was served; a key nobody
-- waits for leaves nothing behind. (A reservation goes with its caller: see `served`, leave.lua.)
local function forget_when_idle(waiters)
  if redis.call('HLEN', waiters) <= 1 then redis.call('PEXPIRE', waiters, 1000) end
end

-- A caller's reservation (`token`'s) leaves `waiters`: the next one moves up. Returns the one
-- that moved up, if any.
local function unreserve(waiters, token, reserved, next)
  return drop_reservation(waiters, reserved, next, function(r) return reserver_of(r) == token end)
end

-- A waiting caller (`token`) got the lock: it leaves `waiters` (with its reservation), and the
-- served field keeps the mean time between two callers served (for `retry_after`). `now` is read
-- here when not given: a caller that never waited long enough to be counted costs one command.
-- Returns the reservation that moved up, if any (the new holder's value is marked with it).
local function served(waiters, token, now)
  if redis.call('HDEL', waiters, token) == 0 then return nil end
  if not now then
    local clock = redis.call('TIME')
    now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  end
  local found = {redis.call('HGET', waiters, 'served'), reservations(waiters)}
  local moved = unreserve(waiters, token, found[2], found[3])
  local last, mean = string.match(found[1] or '', '^(%d+);(%-?%d+)$')
  local gap = last and now - tonumber(last)
  if gap and gap >= 0 then
    mean = tonumber(mean)
    if mean < 0 then mean = gap else mean = math.floor((mean * 3 + gap) / 4) end
  else
    mean = -1
  end
  redis.call('HSET', waiters, 'served', string.format('%d;%d', now, mean))
  forget_when_idle(waiters)
  return moved
end

-- How long a caller that comes back now may wait: the callers counted ahead of it, each served
-- in the mean time between two; the holder's `remaining` lease when nothing is known (-1: not
-- known either).
local function estimate(waiters, remaining)
  local found = {redis.call('HGET', waiters, 'served'), reservations(waiters)}
  local mean = tonumber(string.match(found[1] or '', ';(%-?%d+)$'))
  if not mean or mean < 0 then return remaining end
  -- Fields that are no caller: `served`, the reservations, and `reserved_more` beside a queue.
  local more = found[3] and redis.call('HEXISTS', waiters, 'reserved_more') or 0
  local ahead = redis.call('HLEN', waiters) - 1 - (found[2] and 1 or 0) - (found[3] and 1 or 0) - more
  local first = mean
  if remaining >= 0 and remaining < first then first = remaining end
  return first + ahead * mean
end
