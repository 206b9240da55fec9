-- Take a lock of any kind in one atomic step, and, when asked, hand out a fencing token, keep
-- waiters in arrival order, keep new readers out while a writer waits, or reserve the key for a
-- caller that waited too long.
--
-- KEYS[1] = lock key; KEYS[2] = fencing counter; KEYS[3] = fair queue (a list of waiting
-- tokens, in arrival order); KEYS[4] = the queue's expiries (token -> ms); KEYS[5] = waiting
-- writers (a sorted set of tokens by expiry, ms); KEYS[6] = the callers waiting (token -> when
-- its entry lapses, ms; see values.lua). Every name comes from the caller, in KEYS[1]'s slot.
-- ARGV[1] = the lease's value (`{token};{acquired_ms};{pid};{host};{app}`); ARGV[2] = ttl ms;
-- ARGV[3] = fencing counter life ms, '0' without fencing; ARGV[4] = kind: 'x' exclusive, 'r'
-- read, 'p' permits; ARGV[5] = how many permits; ARGV[6] = '1' when fair; ARGV[7] = '1' when
-- the caller will wait; ARGV[8] = how long a waiter's place lasts unless it comes back, ms;
-- ARGV[9] = the caller's reservation (`{since_ms}/{ttl_ms}/1`) once it has waited longer than
-- protocol::RESERVE_AFTER, '' before.
--
-- An exclusive lock is a string: its holder's value, then '+' once a caller that waits found it
-- busy, or when it was taken while another caller is counted waiting for the key, so that its
-- release announces itself (one nobody waits for announces nothing), then the
-- reservation for a caller that waited too long, if any: the release hands the key to that
-- caller. Readers and permit holders share a hash: field `kind` says which ('read' or 'permits:N'), and each
-- holder has a field of its own, its value, holding its own expiry (ms, server clock), so each
-- lease lives and ends on its own. Anything else under the key is not a lock, and is left as it
-- is.
--
-- Returns {1, fencing token (0 without)} when taken; {0, ms until it may be free (-1 if not
-- known), ms a caller coming back now may wait (-1 if not known)} when busy; {-1, what the key
-- holds} when it is no lock.
local key, value, ttl, kind = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[4]
local token = token_of(value)
local fair, waiting = ARGV[6] == '1', ARGV[7] == '1'
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local ktype, stored, foreign, watched = look_at(key)
if foreign then
  return {-1, foreign}
end

local function ms(n)
  return string.format('%d', math.floor(n))
end

-- The fair queue's first live waiter; waiters that stopped coming back are dropped.
local function queue_head()
  while true do
    local head = redis.call('LINDEX', KEYS[3], 0)
    if not head then return nil end
    local expires = tonumber(redis.call('HGET', KEYS[4], head))
    if expires and expires > now then return head end
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], head)
  end
end

-- A reservation `r` stands while its caller is counted among the key's waiters.
local function standing(r)
  local reserver = reserver_of(r)
  local lapses = reserver and tonumber(redis.call('HGET', KEYS[6], reserver))
  if lapses and lapses > now then return r end
  return nil
end

-- A caller that waited too long (`reservation`) reserves the key among its waiters (see
-- waiters.lua), in its place among the callers still counted there that did (values.lua's
-- `before`): first, unless one of them began waiting earlier. Reservations of callers no
-- longer counted, and this caller's earlier one, go; past `RESERVATIONS_KEPT`, the last.
local function reserve(reservation)
  local first, next = reservations(KEYS[6])
  local order = {}
  if first then
    table.insert(order, first)
    for _, r in ipairs(queued(next)) do table.insert(order, r) end
  end
  local list, placed = {}, false
  for _, r in ipairs(order) do
    if reserver_of(r) ~= token and standing(r) then
      if not placed and before(reservation, r) then
        table.insert(list, reservation)
        placed = true
      end
      table.insert(list, r)
    end
  end
  if not placed then table.insert(list, reservation) end
  if #list > RESERVATIONS_KEPT then
    while #list > RESERVATIONS_KEPT do table.remove(list) end
    redis.call('HSET', KEYS[6], 'reserved_more', '1')
  end
  redis.call('HSET', KEYS[6], 'reserved', table.remove(list, 1))
  requeue(KEYS[6], list)
end

-- Busy: a caller that waits is counted, marks an exclusive holder's key and, once it waited too
-- long, reserves the key (in the holder's value, for its release to hand over, and among the
-- key's waiters, for a key that frees itself), and keeps its place in a fair queue.
local function busy(remaining)
  if waiting then
    local place = tonumber(ARGV[8])
    count_waiter(KEYS[6], token, now, place + math.floor(math.max(remaining, 0) * 1.1))
    local reservation = ''
    if ARGV[9] ~= '' and kind == 'x' and not fair then
      reservation = ARGV[9] .. '/' .. value
      reserve(reservation)
    end
    if stored then
      mark(key, stored, reservation)
    end
    if fair then
      if redis.call('HSET', KEYS[4], token, ms(now + place)) == 1 then
        redis.call('RPUSH', KEYS[3], token)
      end
      redis.call('PEXPIRE', KEYS[3], place)
      redis.call('PEXPIRE', KEYS[4], place)
    end
  end
  return {0, remaining, estimate(KEYS[6], remaining)}
end

if fair then
  local head = queue_head()
  if head and head ~= token then
    return busy(-1)
  end
end

-- A shared lock's live holders, and the latest and earliest of their ends (ms, server clock).
local count, latest, earliest = 0, 0, nil
if ktype == 'hash' then
  count, latest, earliest = live_holders(key, now)
  if count == 0 then
    -- A shared lock whose holders are all gone is no lock.
    redis.call('DEL', key)
    ktype = 'none'
  end
end

-- How long until the key may be free: a shared lock's last live holder's end (a holder kept by
-- a hold shorter than its lease ends before the key would expire), else the key's expiry.
local function free_in()
  if ktype == 'hash' then return latest - now end
  return redis.call('PTTL', key)
end

-- A free key reserved for another caller (see waiters.lua) waits for it: busy until that
-- caller takes it, leaves, or stops being counted. Otherwise whether others are counted waiting.
-- A caller that reserves too and began waiting earlier goes first: the one it passes stays owed
-- the key next.
local others, owed = false, nil
if ktype == 'none' then
  local lapses
  others, lapses, owed = others_waiting(KEYS[6], token, now)
  local mine = ''
  if ARGV[9] ~= '' and kind == 'x' and not fair then mine = ARGV[9] .. '/' .. value end
  if lapses and not (mine ~= '' and before(mine, owed)) then
    return busy(lapses - now)
  end
end

if kind == 'x' then
  if ktype == 'none' then
    -- Fair waiters all look at each release: a fair holder's is always announced, as a
    -- watched key's holder's, and as one taken while others are counted waiting (a reader
    -- kept out only by a writer's claim marked nothing, and must hear this writer's release;
    -- a caller kept out by a reservation).
    local marked = fair or watched or others
    redis.call('SET', key, marked and (value .. '+') or value, 'PX', ttl)
  elseif ktype == 'string' and token_of(stored) == token then
    -- Ours already: a call retried after it ran, or the key handed to this waiter by a
    -- release. It takes this attempt's value and the ttl from now; a waiter's mark and a
    -- reservation after it stay. An attempt that came after its call's next one took the key
    -- changes nothing.
    if not later_attempt(stored, value) then
      local _, after = parts(stored)
      redis.call('SET', key, after and (value .. '+' .. after) or value, 'PX', ttl)
    end
  else
    if ktype == 'hash' and waiting then
      -- A writer waiting on readers keeps new readers out, so readers cannot starve it.
      redis.call('ZADD', KEYS[5], ms(now + ttl), token)
      redis.call('PEXPIRE', KEYS[5], ttl)
    end
    return busy(free_in())
  end
  redis.call('ZREM', KEYS[5], token)
else
  local tag = 'read'
  if kind == 'p' then tag = 'permits:' .. ARGV[5] end
  if ktype == 'string' or (ktype == 'hash' and redis.call('HGET', key, 'kind') ~= tag) then
    return busy(free_in())
  end
  -- A watch's mark on the free key gives way to the hash.
  if watched then redis.call('DEL', key) end
  -- A call retried after it already ran finds its own field.
  if redis.call('HEXISTS', key, value) == 0 then
    if kind == 'r' then
      redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
      if redis.call('ZCARD', KEYS[5]) > 0 then
        return busy(-1)
      end
    elseif count >= tonumber(ARGV[5]) then
      return busy(earliest - now)
    end
  end
  redis.call('HSET', key, value, ms(now + ttl), 'kind', tag)
  if now + ttl > latest then latest = now + ttl end
  redis.call('PEXPIRE', key, latest - now)
end

if fair then
  redis.call('LREM', KEYS[3], 1, token)
  redis.call('HDEL', KEYS[4], token)
end
if waiting then
  local moved = served(KEYS[6], token, now) or owed
  if moved and kind == 'x' then
    -- The next caller the key is reserved for: this holder's release hands it on.
    mark(key, redis.call('GET', key), moved)
  end
end

if ARGV[3] == '0' then
  return {1, 0}
end
-- Strictly increasing, even once the counter is gone (expired, or a restart without
-- persistence): never below the server clock in microseconds.
local floor = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local fence = (tonumber(redis.pcall('GET', KEYS[2])) or 0) + 1
if fence < floor then
  fence = floor
end
redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
return {1, fence}
