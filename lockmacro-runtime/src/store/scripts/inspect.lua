-- Read what a lock key holds, with what lives beside it, in one atomic look, changing nothing.
-- Reads only what the library writes: telling a lock from any other key is the caller's job
-- (`protocol::exclusive_holder`, `protocol::parse_shared_kind`).
--
-- KEYS[1] = lock key; KEYS[2] = its fencing counter; KEYS[3] = its fair queue's expiries
-- (token -> ms). Every name comes from the caller, in KEYS[1]'s slot.
-- ARGV[1] = the release channel; ARGV[2] = 'sharded' for a cluster's sharded channel (counted
-- by SHARDNUMSUB), '' otherwise (NUMSUB).
--
-- Returns {type, fencing counter or '', release subscribers, live fair-queue places, ...}:
-- for a string, then its value and PTTL; for a hash, its `kind` field ('' if none) and one
-- (holder token, ms left) pair per live holder.
local key = KEYS[1]
local ktype = redis.call('TYPE', key)['ok']
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local fence = redis.pcall('GET', KEYS[2])
if type(fence) ~= 'string' then fence = '' end

local subscribers = 0
local counted = redis.pcall('PUBSUB', ARGV[2] == 'sharded' and 'SHARDNUMSUB' or 'NUMSUB', ARGV[1])
if type(counted) == 'table' and not counted.err then subscribers = counted[2] end

local queued = 0
local places = redis.pcall('HGETALL', KEYS[3])
if type(places) == 'table' and not places.err then
  for i = 2, #places, 2 do
    if (tonumber(places[i]) or 0) > now then queued = queued + 1 end
  end
end

local reply = {ktype, fence, subscribers, queued}
if ktype == 'string' then
  reply[5] = redis.call('GET', key)
  reply[6] = redis.call('PTTL', key)
elseif ktype == 'hash' then
  reply[5] = redis.call('HGET', key, 'kind') or ''
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
