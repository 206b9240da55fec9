-- Take several exclusive locks for one token in one atomic step: all of them, or none.
-- KEYS[1..n] = the lock keys (distinct; on a cluster, all in one slot); KEYS[n+1..2n] = the
-- callers waiting for each (see values.lua), in the same order. ARGV[1] = the lease's value;
-- ARGV[2] = ttl ms; ARGV[3] = '1' when the caller will wait; ARGV[4] = how long a waiter's
-- entry lasts unless it comes back, ms; ARGV[5] = the caller's reservation
-- (`{since_ms}/{ttl_ms}/{keys}`) once it has waited longer than protocol::RESERVE_AFTER, ''
-- before, and always '' when these are not all of its keys (a cluster's slots taken one by one).
--
-- Each key is taken as acquire.lua takes an exclusive lock: a string holding the value. A key
-- that holds our token already (marked or not) is a call retried after it ran, or a key handed
-- to this caller by a release: it takes this attempt's value and the ttl. A free key taken while
-- another caller is counted waiting for it is marked, as acquire.lua marks it; one reserved for
-- another caller (see waiters.lua) is busy until that caller takes it. A caller that waits
-- marks every key held by another, so that their releases are announced, and is counted as
-- waiting for every key; once it has waited too long it reserves them (a release of all of them
-- at once hands them over). Anything but a lock under one of the keys is left as it is.
-- Returns {1} when every key was taken; {0, i, ms until KEYS[i] may be free (-1 if not known),
-- ms a caller coming back now may wait (-1 if not known)} when KEYS[i] is the first busy key
-- (nothing was taken); {-1, i, what KEYS[i] holds} when it is no lock.
local n = #KEYS / 2
local value, ttl, waiting = ARGV[1], ARGV[2], ARGV[3] == '1'
local token = token_of(value)
local stored, watched, others, busy, remaining = {}, {}, {}, nil, nil
for i = 1, n do
  local ktype, v, foreign, followed = look_at(KEYS[i])
  if foreign then
    return {-1, i, foreign}
  end
  stored[i], watched[i] = v, followed
  -- A hash is a shared lock (readers, permits): busy.
  if ktype == 'hash' or (v and token_of(v) ~= token) then
    busy = busy or i
  elseif ktype == 'none' and not busy then
    -- A free key reserved for another caller of it alone waits for that caller (acquire.lua).
    local reserved
    others[i], reserved = others_waiting(KEYS[n + i], token, nil)
    if reserved then
      local clock = redis.call('TIME')
      busy = i
      remaining = reserved - (tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000))
    end
  end
end
if busy then
  remaining = remaining or redis.call('PTTL', KEYS[busy])
  if waiting then
    local clock = redis.call('TIME')
    local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    local life = tonumber(ARGV[4]) + math.floor(math.max(remaining, 0) * 1.1)
    local reservation = ''
    if ARGV[5] ~= '' then reservation = ARGV[5] .. '/' .. value end
    for i = 1, n do
      count_waiter(KEYS[n + i], token, now, life)
      if stored[i] and token_of(stored[i]) ~= token then
        mark(KEYS[i], stored[i], reservation)
      end
    end
  end
  return {0, busy, remaining, estimate(KEYS[n + busy], remaining)}
end
local now = nil
if waiting then
  local clock = redis.call('TIME')
  now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end
for i = 1, n do
  local taken = value
  if stored[i] then
    local _, after = parts(stored[i])
    if after then taken = value .. '+' .. after end
    -- An attempt that came after its call's next one took the key changes nothing.
    if later_attempt(stored[i], value) then taken = nil end
  elseif watched[i] or others[i] then
    -- A watched key, or one others are counted waiting for (some kept out by what bears no
    -- mark, see acquire.lua): its release is announced.
    taken = value .. '+'
  end
  if taken then redis.call('SET', KEYS[i], taken, 'PX', ttl) end
  if waiting then
    local moved = served(KEYS[n + i], token, now)
    -- The next caller the key is reserved for: this holder's release hands it on.
    if moved then mark(KEYS[i], redis.call('GET', KEYS[i]), moved) end
  end
end
return {1}
