-- A watch marks the lock it follows, at each of its looks, so that every release of it is
-- announced while the uncontended release (release_plain.lua) reads nothing but the lock: its
-- mark (KEYS[2], named as the lock's release channel, '1') lives ARGV[1] ms; a holder's value
-- gets the waiter's mark ('+', announced as a waited-for lock's release); a free key holds the
-- mark alone ('+', for as long), which the acquire scripts read as free and replace with the
-- next holder's value, marked (a plain `SET NX` finds it taken and the acquire script follows).
-- release.lua puts it back when it frees a watched key. What the watch pays for is paid by
-- the locks it follows, for as long as it follows them.
-- KEYS[1] = lock key; KEYS[2] = its watch mark; ARGV[1] = the mark's life in ms.
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
local ktype, v, foreign = look_at(KEYS[1])
if ktype == 'none' then
  redis.call('SET', KEYS[1], '+', 'PX', ARGV[1])
elseif ktype == 'string' and not foreign and not string.find(v, '+', 1, true) then
  redis.call('SET', KEYS[1], v .. '+', 'KEEPTTL')
end
return 1
