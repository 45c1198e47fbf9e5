-- settle.lua: the last step of a stock transfer: mark it done (given) or
-- void (its epoch is over) on the donor bucket, which then no longer
-- counts it as pending. A transfer no longer pending changes nothing.
--
-- KEYS[1] xfer, KEYS[2] xpend, KEYS[3] meta (moves) of the donor bucket
-- ARGV[1] transfer id, ARGV[2] done | void
--
-- Reply: 1 settled now, 0 not pending (settled before, or wiped by a
-- rebuild)

if redis.call('SREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
local v = redis.call('HGET', KEYS[1], ARGV[1]) or 'pending|0||'
redis.call('HSET', KEYS[1], ARGV[1], (string.gsub(v, '^[^|]*', ARGV[2])))
redis.call('HINCRBY', KEYS[3], 'moves', 1)
return 1
