-- Pass an exclusive lock straight to the next holder, a waiter of the same client: while the
-- key still holds our value, it gets the next holder's value and ttl, with no moment free. A
-- waiter's mark stays on the key (the next holder's value followed by '+'): whoever marked it
-- still waits, and the next release must be announced to it. A busy client keeps the key for
-- itself only while nobody elsewhere waited too long: a caller that did reserved the key (see
-- acquire.lua), and it is handed to that caller instead (announced to it alone), wherever it
-- runs. A hand-over of a watched key (its watch mark, see release.lua) is announced, so that the
-- watch sees every holder.
-- KEYS[1] = lock key; KEYS[2] = the release channel, and the name of its watch mark (a key
-- here, so that a cluster refuses a channel outside the key's slot); KEYS[3] = the callers
-- waiting for the key (see values.lua); KEYS[4] = the writers waiting for its readers to leave
-- (see acquire.lua); ARGV[1] = our value; ARGV[2] = the next holder's value; ARGV[3] = its ttl
-- in ms; ARGV[4] = 'sharded' for a cluster's sharded channel (SPUBLISH), absent otherwise
-- (PUBLISH).
-- Returns 1 when handed over, 3 when handed to a caller elsewhere it was reserved for, 0 when the
-- key was not ours (nothing changed).
local key, ours = KEYS[1], ARGV[1]
local publish = ARGV[4] == 'sharded' and 'SPUBLISH' or 'PUBLISH'
-- The lock's value (false for no key or a shared lock's hash) and its watch mark.
local found = redis.call('MGET', key, KEYS[2])
local holder = found[1]
local next_value = ARGV[2]
local next_token = string.match(next_value, '^[^;]*')
if holder ~= ours and (not holder or string.sub(holder, 1, #ours + 1) ~= ours .. '+') then
  return 0
end
local marked = holder ~= ours
-- What follows the mark: a reservation, if any.
local after = marked and string.sub(holder, #ours + 2) or ''
local ttl, keys, reserved = string.match(after, '^%d+/(%d+)/(%d+)/(.*)$')
local reserved_token = reserved and string.match(reserved, '^[^;]*')
if keys == '1' and reserved_token ~= next_token then
  redis.call('SET', key, reserved .. '+', 'PX', ttl)
  redis.call(publish, KEYS[2], ours .. '>' .. reserved_token)
  return 3
end
-- Announced when watched, and when it serves the next holder's reservation while a caller that
-- waited too long went unrecorded (see reservations.lua): it looks again, to reserve the key in
-- turn. The others keep their places among the key's waiters.
if found[2] or (keys == '1' and reserved_token == next_token and unrecorded(KEYS[3])) then
  redis.call(publish, KEYS[2], ours .. '>' .. next_token)
end
if marked then
  -- A reservation for callers of several keys stays for a release of them all; one for the
  -- next holder is served.
  if reserved_token == next_token then after = '' end
  next_value = next_value .. '+' .. after
elseif found[2] then
  -- Watched: the next holder's release is announced too (see watch.lua).
  next_value = next_value .. '+'
end
redis.call('SET', key, next_value, 'PX', ARGV[3])
-- The next holder waited: it is served (see values.lua), and a claim it made against new readers
-- while readers held the key goes, as when it takes the key itself (else they would find the
-- key busy once it is free, until the claim lapsed a lease later).
local moved = served(KEYS[3], next_token, nil)
if moved and not string.find(next_value, '+', 1, true) then
  -- The next caller the key is reserved for (see waiters.lua): this holder's release hands it on.
  redis.call('SET', key, next_value .. '+' .. moved, 'PX', ARGV[3])
elseif moved and string.sub(next_value, -1) == '+' then
  redis.call('SET', key, next_value .. moved, 'PX', ARGV[3])
end
redis.call('ZREM', KEYS[4], next_token)
return 1
