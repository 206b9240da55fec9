-- What a lock key holds and the marks on it, one home for the acquire scripts (put in front of
-- acquire.lua and acquire_many.lua by `scripts.rs`). The format is protocol.rs's: an exclusive
-- lock's value is its holder's value `{token};{acquired_ms};{pid};{host};{app}` (or a bare
-- token, from an older version), then '+' once a caller waits, then the reservation for a caller
-- that waited too long, `{since_ms}/{ttl_ms}/{keys}/{its value}`; a shared lock is a hash with
-- a `kind` field.

-- Whether the string `v` is a lock value of ours.
local function is_lock_value(v)
  local token, rest = string.match(string.match(v, '^[^+]*'), '^([%x%-]+)(.*)$')
  if not token or (#token ~= 32 and #token ~= 36) then return false end
  return rest == '' or string.match(rest, '^;%d+;%d+;[%w%._%-]+;[%w%._%-]+$') ~= nil
end

-- What `key` holds: its type and, for a string, its value; then, when it is no lock of ours,
-- what it is instead (for `NotALock`), else nil; then whether a watch follows the free key (a
-- watch's mark alone, '+' with an expiry, see watch.lua: 'none', and the lock taken is marked so
-- that its release is announced). A lock of ours, and any mark of ours, always has an expiry.
local function look_at(key)
  local ktype = redis.call('TYPE', key)['ok']
  if ktype == 'none' then return ktype, nil, nil end
  if ktype == 'string' then
    local v = redis.call('GET', key)
    -- A watch's mark lives for a while; another application's '+' has no expiry.
    if v == '+' and redis.call('PTTL', key) >= 0 then return 'none', nil, nil, true end
    if not is_lock_value(v) then return ktype, v, 'a string that is not a lock value' end
    if redis.call('PTTL', key) < 0 then return ktype, v, 'a string without an expiry' end
    return ktype, v, nil
  end
  if ktype == 'hash' then
    local tag = redis.call('HGET', key, 'kind')
    if tag == 'read' or (tag and string.match(tag, '^permits:[1-9]%d*$')) then
      return ktype, nil, nil
    end
    return ktype, nil, "a hash without lockmacro's `kind` field"
  end
  return ktype, nil, 'a ' .. ktype
end

-- The token of a holder's value (or of a whole stored value).
local function token_of(v)
  return string.match(v, '^[^;+>]*')
end

-- Whether the exclusive lock's stored value `v`, of the token of `value`, was written by a later
-- attempt of that call (taken at a later ms): `value`'s request came late, after its call tried
-- again and took the key (its reply had timed out), and changes nothing, so that the undo sent
-- behind it, a compare-and-delete of `value`, deletes nothing (protocol.rs `is_later_attempt`).
local function later_attempt(v, value)
  local stored = tonumber(string.match(v, '^[^;+]*;(%d+);'))
  local mine = tonumber(string.match(value, '^[^;]*;(%d+);'))
  return stored ~= nil and mine ~= nil and stored > mine
end

-- A stored exclusive value taken apart: the holder's value, and what follows its waiter's mark
-- (nil without a mark, '' for a mark alone, else a reservation).
local function parts(v)
  local at = string.find(v, '+', 1, true)
  if not at then return v, nil end
  return string.sub(v, 1, at - 1), string.sub(v, at + 1)
end

-- Whether reservation `a` goes before `b`: a caller of this key alone goes before a caller of
-- several keys, since only the first is served by this key's release (a release of all of the
-- other's keys at once is rare, and would leave a caller of one key passed over meanwhile);
-- then the one that began waiting earlier (ties: the smaller token).
local function before(a, b)
  local a_since, a_keys, a_token = string.match(a, '^(%d+)/%d+/(%d+)/([^;]*)')
  local b_since, b_keys, b_token = string.match(b, '^(%d+)/%d+/(%d+)/([^;]*)')
  if not b_since then return true end
  if (a_keys == '1') ~= (b_keys == '1') then return a_keys == '1' end
  a_since, b_since = tonumber(a_since), tonumber(b_since)
  if a_since ~= b_since then return a_since < b_since end
  return a_token < b_token
end

-- A caller that waits marks the exclusive lock `key` (stored value `v`) so that its release is
-- announced; one that has waited too long (`reservation`, '' otherwise) reserves it, unless a
-- caller that began waiting earlier did. Marks set with KEEPTTL: the holder's lease is unchanged.
local function mark(key, v, reservation)
  local holder, after = parts(v)
  local new = nil
  if reservation ~= '' and (after == nil or after == '' or before(reservation, after)) then
    new = holder .. '+' .. reservation
  elseif after == nil then
    new = holder .. '+'
  end
  if new then redis.call('SET', key, new, 'KEEPTTL') end
end

