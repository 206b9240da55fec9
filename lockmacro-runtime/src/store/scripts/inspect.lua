-- Read what a lock key holds, with what lives beside it, in one atomic look, changing nothing.
-- Reads only what the library writes: telling a lock from any other key is the caller's job
-- (`protocol::Stored`, `protocol::parse_shared_kind`).
--
-- KEYS[1] = lock key; KEYS[2] = its fencing counter; KEYS[3] = the callers waiting for it
-- (token -> when its entry lapses, ms; see values.lua). Every name comes from the caller, in
-- KEYS[1]'s slot.
--
-- Returns {type, fencing counter or '', callers waiting, ...}: for a string, then its value and
-- PTTL; for a hash, its `kind` field ('' if none) and one (holder value, ms left) pair per live
-- holder.
local key = KEYS[1]
local ktype = redis.call('TYPE', key)['ok']
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local fence = redis.pcall('GET', KEYS[2])
if type(fence) ~= 'string' then fence = '' end

-- Each waiting caller counts once, as long as its entry lives (a watch is no caller).
local waiting = 0
local entries = redis.pcall('HGETALL', KEYS[3])
if type(entries) == 'table' and not entries.err then
  for i = 1, #entries, 2 do
    if entries[i] ~= 'served' and not string.match(entries[i], '^reserved') and (tonumber(entries[i + 1]) or 0) > now then
      waiting = waiting + 1
    end
  end
end

local reply = {ktype, fence, waiting}
if ktype == 'string' then
  reply[4] = redis.call('GET', key)
  reply[5] = redis.call('PTTL', key)
elseif ktype == 'hash' then
  reply[4] = redis.call('HGET', key, 'kind') or ''
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local expires = tonumber(fields[i + 1]) or 0
    if fields[i] ~= 'kind' and expires > now then
      reply[#reply + 1] = fields[i]
      reply[#reply + 1] = expires - now
    end
  end
end
return reply
