-- lease_acquire.lua takes a free partition lease and stamps it with a fencing
-- token: the next value of the partition's counter, so no two tenures of a
-- partition ever share a lease value, even with the same owner. The fenced
-- commands (read, claim, acknowledge) act only while the lease still holds
-- the caller's value.
--
-- KEYS[1]  lease key, fsq:{<topic>:<partition>}:lease
-- KEYS[2]  fencing counter, fsq:{<topic>:<partition>}:fence (never expires)
-- ARGV[1]  owner: the caller's unique consumer id
-- ARGV[2]  TTL in milliseconds
--
-- Replies:
--   the lease value, "<owner>#<token>": the caller holds the lease
--   nil: another consumer holds it
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local value = ARGV[1] .. '#' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
