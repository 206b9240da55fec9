-- Release an exclusive lock of one key nobody waits for or watches: a compare-and-delete, what
-- every uncontended release runs, so it reads the lock's value and nothing else.
-- KEYS[1] = lock key; ARGV[1] = our lease's value.
-- Returns 1 when our lease was removed, 0 when it was not ours (gone, another's, no string);
-- 2 when it is ours but marked (its value followed by '+': a caller waits for it, it is reserved
-- for one, or a watch follows it, see protocol.rs): nothing was changed, and the caller sends
-- release.lua, which tells them.
local v = redis.pcall('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if type(v) == 'string' and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '+' then
  return 2
end
return 0
