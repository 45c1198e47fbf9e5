-- release.lua: give an order's units back to the sale, once per order id.
-- The caller releases after MySQL moved the order to a final state
-- (cancelled, expired, refunded); a crash before or after this call is
-- completed by calling it again, so the released hash is what keeps a unit
-- from coming back twice.
--
-- KEYS[1] stock     remaining units (string integer); missing = not loaded
-- KEYS[2] users     hash user id -> units bought
-- KEYS[3] soldout   flag, set while nothing remains
-- KEYS[4] counters  hash: sold
-- KEYS[5] meta      hash: stock, limit, start_ms, end_ms, expire_at, buckets
--                   (rebuild.lua); in a bucket of several, moves (bumped:
--                   buckets.go's scan must see units arrive)
-- KEYS[6] released  hash order id -> units released
-- ARGV[1] order id, ARGV[2] user id, ARGV[3] units (>= 1)
--
-- Reply: 1 released now, 0 released before (nothing changed),
--        -1 not loaded (nothing changed: there is no stock to give back to)
--
-- Remaining never rises above the loaded stock: a release that would pass
-- it (an order this state never counted: decided under an earlier load)
-- adds only up to it. The buyer's units and the sold counter never fall
-- below zero.

local meta = redis.call('HMGET', KEYS[5], 'stock', 'expire_at', 'buckets')
local stock = meta[1]
local remaining = redis.call('GET', KEYS[1])
if not stock or not remaining then
  return -1
end
if redis.call('HSETNX', KEYS[6], ARGV[1], ARGV[3]) == 0 then
  return 0
end
-- The released hash may be new.
expire_with_campaign(meta[2], KEYS[6])
local units = tonumber(ARGV[3])
local back = math.min(units, tonumber(stock) - tonumber(remaining))
if back > 0 then
  redis.call('INCRBY', KEYS[1], back)
end
-- Something remains now (stock is at least 1): shoppers may buy again.
-- (In a bucket of several the caller clears the campaign's own flag.)
redis.call('DEL', KEYS[3])
if tonumber(meta[3] or '1') > 1 then
  redis.call('HINCRBY', KEYS[5], 'moves', 1)
end

local bought = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if bought > units then
  redis.call('HINCRBY', KEYS[2], ARGV[2], -units)
elseif bought > 0 then
  redis.call('HDEL', KEYS[2], ARGV[2])
end
local sold = tonumber(redis.call('HGET', KEYS[4], 'sold') or '0')
if sold > 0 then
  redis.call('HINCRBY', KEYS[4], 'sold', -math.min(units, sold))
end
return 1
