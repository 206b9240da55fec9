-- A shared lock's holders, one home for how they live and end: put by `scripts.rs` in front of
-- acquire.lua and extend.lua, and into release.lua after its exclusive paths have returned (a
-- Lua function costs its script a closure at every call that reaches its definition).

-- Drops the holders of the shared lock `key` whose expiry passed (a crashed reader blocks
-- others at most its ttl). Returns how many are left, and the latest and earliest of their
-- ends (ms, server clock). With `expire`, the key then lives exactly as long as its
-- longest-living holder, and goes with the last one: its expiry may shrink (a holder left, or
-- is kept by a hold shorter than its lease), so a waiter told the key's end wakes when it is
-- free.
local function live_holders(key, now, expire)
  local fields = redis.call('HGETALL', key)
  local count, latest, earliest = 0, 0, nil
  for i = 1, #fields, 2 do
    if fields[i] ~= 'kind' then
      local expires = tonumber(fields[i + 1]) or 0
      if expires <= now then
        redis.call('HDEL', key, fields[i])
      else
        count = count + 1
        if expires > latest then latest = expires end
        if not earliest or expires < earliest then earliest = expires end
      end
    end
  end
  if expire then
    if count == 0 then
      redis.call('DEL', key)
    else
      redis.call('PEXPIRE', key, latest - now)
    end
  end
  return count, latest, earliest
end
