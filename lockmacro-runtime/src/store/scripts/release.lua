-- Release one lease, only while it is still held by its token, and tell waiters: an exclusive
-- lock's key is deleted; a shared lock's holder leaves, and the key goes with its last holder.
-- An exclusive lock is announced when a waiter marked it (its token followed by '+', see
-- acquire.lua) or a watch follows it (a key named as its release channel exists, see
-- protocol.rs): a release nobody waits for or watches costs no PUBLISH, and finding out costs
-- nothing but the second key of the MGET that reads the lock.
-- KEYS[1] = lock key; KEYS[2] = the release channel, and the name of its watch mark (a key
-- here, so that a cluster refuses a channel outside the key's slot); ARGV[1] = our
-- token; ARGV[2] = 'sharded' for a cluster's sharded channel (announced by SPUBLISH), absent
-- otherwise (PUBLISH): one argument fewer for Redis to read on every release of a single server.
-- The message is the released token, which tells one release from the next.
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
-- `kept`: hold_at_least, the key is not freed yet. It keeps its holder's token (a shared lock,
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

-- The lock's value (false for no key, or a shared lock's hash) and its watch mark.
local found = redis.call('MGET', key, KEYS[2])
local holder = found[1]
if holder then
  -- An exclusive lock: its holder's token, marked by a waiter or not.
  local marked = false
  if holder ~= token then
    if holder ~= token .. '+' then
      return 0
    end
    marked = true
  end
  if kept then
    redis.call('PEXPIRE', key, kept)
  else
    redis.call('DEL', key)
  end
  if marked or found[2] then
    redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[2], message)
  end
  return 1
end
