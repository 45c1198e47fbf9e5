-- give.lua: the second step of a stock transfer (take.lua): add the units
-- to the recipient bucket unless it already received this transfer id.
--
-- KEYS[1] stock    the recipient bucket's remaining units
-- KEYS[2] meta     its hash: epoch, moves
-- KEYS[3] got      hash transfer id -> units received
-- ARGV[1] transfer id, ARGV[2] units, ARGV[3] the transfer's epoch
--
-- Reply: 1 given now, 0 given before (nothing changed),
--        -1 the bucket is not at that epoch: the transfer is void, a
--        rebuild wrote this bucket from the ledger (nothing changed)

local meta = redis.call('HMGET', KEYS[2], 'epoch', 'expire_at')
if meta[1] ~= ARGV[3] then
  return -1
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], 'moves', 1)
expire_with_campaign(meta[2], KEYS[3])
return 1
