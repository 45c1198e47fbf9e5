-- take.lua: the first step of a stock transfer between two buckets of one
-- campaign (transfer.go): take units from the donor bucket and record the
-- transfer as pending there, both in this one script. Idempotent on the
-- transfer id: a second call with it takes nothing and answers what the
-- first took.
--
-- KEYS[1] stock    the donor bucket's remaining units
-- KEYS[2] meta     its hash: epoch, moves (bumped by every transfer step
--                  and release, for buckets.go's consistent scan)
-- KEYS[3] xfer     hash transfer id -> "state|units|to bucket|epoch",
--                  state pending, done or void
-- KEYS[4] xpend    set of the transfer ids still pending
-- ARGV[1] transfer id, ARGV[2] units wanted (>= 1), ARGV[3] the campaign
-- epoch the caller scanned (a rebuild starts a new one: older transfers
-- are void), ARGV[4] the recipient bucket
--
-- Reply: { 1, units } taken now (1 <= units <= wanted)
--        { 0, units } taken before under this id (nothing changed)
--        { -1 }       the bucket is not at that epoch (nothing changed)
--        { -2 }       the bucket holds nothing (nothing changed)

local meta = redis.call('HMGET', KEYS[2], 'epoch', 'expire_at')
if meta[1] ~= ARGV[3] then
  return { -1 }
end
local earlier = redis.call('HGET', KEYS[3], ARGV[1])
if earlier then
  local _, units = string.match(earlier, '^([^|]*)|([^|]*)|')
  return { 0, tonumber(units) }
end
local remaining = tonumber(redis.call('GET', KEYS[1]) or '0')
local units = math.min(remaining, tonumber(ARGV[2]))
if units < 1 then
  return { -2 }
end
redis.call('DECRBY', KEYS[1], units)
redis.call('HSET', KEYS[3], ARGV[1], 'pending|' .. units .. '|' .. ARGV[4] .. '|' .. ARGV[3])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('HINCRBY', KEYS[2], 'moves', 1)
expire_with_campaign(meta[2], KEYS[3], KEYS[4])
return { 1, units }
