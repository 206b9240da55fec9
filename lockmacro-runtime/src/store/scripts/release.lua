-- Release one lease, only while it is still held by its value, and tell waiters: an exclusive
-- lock's key is deleted (or handed to the caller it is reserved for); a shared lock's holder
-- leaves, and the key goes with its last holder.
-- An exclusive lock is announced when a waiter marked it (its value followed by '+', see
-- acquire.lua) or a watch follows it (a key named as its release channel exists, see
-- protocol.rs): a release nobody waits for or watches costs no PUBLISH, and finding out costs
-- nothing but the second key of the MGET that reads the lock.
-- KEYS[1] = lock key; KEYS[2] = the release channel, and the name of its watch mark (a key
-- here, so that a cluster refuses a channel outside the key's slot); KEYS[3], for a shared
-- lock's holder or an undone attempt only, = the callers waiting for the key (see
-- release_shared.lua and below); ARGV[1] = our
-- lease's value; ARGV[2] = 'sharded' for a cluster's sharded channel (announced by SPUBLISH), absent
-- otherwise (PUBLISH): one argument fewer for Redis to read on every release of a single server.
-- The message is the released value, which tells one release from the next; a key handed to
-- the caller it was reserved for is announced as `{released value}>{its token}`.
-- ARGV[3] = milliseconds left of the lease's `hold_at_least` while it runs, else '' or absent:
-- the key is not freed yet (see `kept` below). ARGV[4] = 'undo' for an attempt that did not win the lock (a minority
-- of Redlock's masters, an answer lost): no holder held it, so its release is announced as
-- "look again" (an empty message), which a watch does not report as a hold. ARGV[2] is given
-- ('' for none) whenever a later argument is.
-- Returns 1 when our lease was removed (or kept), 0 when it was not ours (gone, another token,
-- another type).
--
-- `scripts.rs` follows this with holders.lua and release_shared.lua, the shared lock's paths:
-- an exclusive lock's release returns before them and pays nothing for their helpers.
local key, token = KEYS[1], ARGV[1]

-- Frees `key`; while a watch follows it (`watch`, its mark's value), the watch's mark takes
-- its place (see watch.lua), so that the next holder is marked and its release announced too.
local function free(key, mark_name, watch)
  local life = watch and redis.call('PTTL', mark_name) or 0
  if life > 0 then
    redis.call('SET', key, '+', 'PX', life)
  else
    redis.call('DEL', key)
  end
end
-- `kept`: hold_at_least, the key is not freed yet. It keeps its holder's value (a shared lock,
-- its holder's field) and expires when the hold is over, longer or sooner than its lease.
-- Nothing is free, but the key's end moved: whoever waits or watches is told to look again (an
-- empty message, no token released), so a waiter sleeps until the hold's end, not its lease's.
-- A plain release on one server has one argument: the others are not even looked up.
local sharded, kept, message = false, nil, token
if #ARGV > 1 then
  sharded = ARGV[2] == 'sharded'
  kept = tonumber(ARGV[3])
  if kept or ARGV[4] == 'undo' then
    message = ''
  end
end

-- An undone attempt of a waiting caller may have reserved the key (it arrived late, after its
-- call left, say): a reservation written by that attempt (its very value) is taken off, among
-- the key's waiters (KEYS[3]) and after its holder's mark, so that no caller that is gone keeps
-- the key from the others. One its call made since carries a later value, and stays.
if ARGV[4] == 'undo' and KEYS[3] then
  local function by_this(r)
    return r and string.sub(r, -#token - 1) == '/' .. token
  end
  local first, next = reservations(KEYS[3])
  drop_reservation(KEYS[3], first, next, by_this)
  -- A shared lock (a hash) carries no reservation.
  local stored = redis.pcall('GET', key)
  local at = type(stored) == 'string' and string.find(stored, '+', 1, true)
  if at and by_this(string.sub(stored, at + 1)) then
    redis.call('SET', key, string.sub(stored, 1, at), 'KEEPTTL')
  end
end

-- The lock's value (false for no key, or a shared lock's hash) and its watch mark.
local found = redis.call('MGET', key, KEYS[2])
local holder = found[1]
if holder then
  -- An exclusive lock: its holder's value, marked by a waiter or not.
  local marked = false
  if holder ~= token then
    if string.sub(holder, 1, #token + 1) ~= token .. '+' then
      return 0
    end
    marked = true
  end
  if kept then
    redis.call('PEXPIRE', key, kept)
    -- The key frees itself when the hold ends, unannounced: a caller of one key it is reserved
    -- for is named, so that it looks now (and learns when) rather than at its own fallback.
    if marked then
      local _, keys, next_value = string.match(string.sub(holder, #token + 2), '^%d+/(%d+)/(%d+)/(.*)$')
      if keys == '1' then message = '>' .. string.match(next_value, '^[^;]*') end
    end
  else
    -- A caller of one key the lock is reserved for (a reservation after the mark) takes it now,
    -- marked:
    -- the key is never free for another to barge in, and only that caller is told. Not from an
    -- undone attempt: it held no lock to pass on (a minority of Redlock's masters handing the
    -- key over would split them), and the caller it was reserved for looks again when told to.
    local ttl, keys, next_value = nil, nil, nil
    if marked and message ~= '' then
      ttl, keys, next_value = string.match(string.sub(holder, #token + 2), '^%d+/(%d+)/(%d+)/(.*)$')
    end
    if keys == '1' then
      redis.call('SET', key, next_value .. '+', 'PX', ttl)
      local publish = sharded and 'SPUBLISH' or 'PUBLISH'
      redis.call(publish, KEYS[2], message .. '>' .. string.match(next_value, '^[^;]*'))
      return 1
    end
    free(key, KEYS[2], found[2])
  end
  if marked or found[2] then
    redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[2], message)
  end
  return 1
end
