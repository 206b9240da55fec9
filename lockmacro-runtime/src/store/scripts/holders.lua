-- Shared lock helpers, put in front of the scripts that read a shared lock (acquire.lua,
-- release.lua, extend.lua) by `scripts.rs`: one home for how a hash's holders live and end.

-- The server clock, in milliseconds.
local function server_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end

-- A shared lock's holders whose expiry passed are dropped (a crashed reader blocks others at
-- most its ttl). Returns how many are left, and the latest and earliest expiry among them.
local function live_holders(key, now)
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
  return count, latest, earliest
end

-- A shared lock's key lives exactly as long as its longest-living holder, and goes with the
-- last one. Its expiry may shrink (a holder left, or is kept by a hold shorter than its lease),
-- so a waiter told the key's end wakes when it is free.
local function expire_with_holders(key, now)
  local count, latest = live_holders(key, now)
  if count == 0 then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, latest - now)
  end
end

