-- The queue of reservations among a key's waiters (see waiters.lua): `reserved` the first,
-- `reserved_next` the ones after it in the order they go, '|' between two. Put in front of
-- waiters.lua and of release.lua (whose undo takes off a late attempt's reservation) by
-- `scripts.rs`.

-- At most this many are kept (each costs its bytes at every change of the queue): a caller past
-- the bound beyond them goes unrecorded, and the field `reserved_more` says one did, so that
-- the next reservation served is announced and it looks again, to reserve the key in turn.
local RESERVATIONS_KEPT = 16

-- The reservations kept in `waiters` (false for none; `reserved_next` only beside `reserved`),
-- read by HGET: an ACL that grants the library its commands names no other.
local function reservations(waiters)
  local first = redis.call('HGET', waiters, 'reserved')
  if not first then return false, false end
  return first, redis.call('HGET', waiters, 'reserved_next')
end

-- The reservations of `reserved_next` (`next`, false for none), in order.
local function queued(next)
  local list = {}
  for r in string.gmatch(next or '', '[^|]+') do list[#list + 1] = r end
  return list
end

-- Writes the reservations after the first (`list`, in order) to `waiters`.
local function requeue(waiters, list)
  if #list > 0 then
    redis.call('HSET', waiters, 'reserved_next', table.concat(list, '|'))
  else
    redis.call('HDEL', waiters, 'reserved_next')
  end
end

-- Whether a caller past the bound went unrecorded (`reserved_more`), which is forgotten: the
-- reservation served now is announced, and such callers look again.
local function unrecorded(waiters)
  return redis.call('HDEL', waiters, 'reserved_more') == 1
end

-- The reservation `owns` picks (given a reservation, true for the caller's) leaves `waiters`
-- (`reserved` and `next`, as `reservations` read them): when it was the first, the next one moves
-- up, and is returned.
local function drop_reservation(waiters, reserved, next, owns)
  if not reserved then return nil end
  local list = queued(next)
  if owns(reserved) then
    local moved = table.remove(list, 1)
    if moved then
      redis.call('HSET', waiters, 'reserved', moved)
    else
      redis.call('HDEL', waiters, 'reserved', 'reserved_more')
    end
    requeue(waiters, list)
    return moved
  end
  for i, r in ipairs(list) do
    if owns(r) then
      table.remove(list, i)
      requeue(waiters, list)
      return nil
    end
  end
  return nil
end
