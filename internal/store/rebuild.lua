-- rebuild.lua: load a campaign into Redis from its ledger, the orders in
-- MySQL, under a new epoch. Every load comes here: the first (no orders
-- yet), a rebuild after Redis lost the campaign (or a failover brought back
-- an older epoch of it), and a forced reload. The caller moved the epoch on
-- in MySQL before it read the orders, so they include every order that will
-- ever be stored under an older epoch; requests decided against the old
-- state whose orders are not among them are refused by MySQL and decided
-- again here.
--
-- KEYS[1] meta, KEYS[2] stock, KEYS[3] soldout, KEYS[4] counters,
-- KEYS[5] users, KEYS[6] results, KEYS[7] idem, KEYS[8] released,
-- KEYS[9] user rate limits, KEYS[10] client IP rate limits
-- KEYS[11] admissions (the admissions set notenqueued.lua looks at: their
-- queued markers go here, so they go too)
-- KEYS[12] xfer, KEYS[13] xpend, KEYS[14] got: the stock transfers of a
-- bucket (take.lua, give.lua): a new epoch voids every older one
-- ARGV[1] epoch, ARGV[2] stock, ARGV[3] limit, ARGV[4] start_ms,
-- ARGV[5] end_ms, ARGV[6] paused ("1" or "0"),
-- ARGV[7] remaining: stock - units of active orders (>= 0),
-- ARGV[8] sold: units of active orders,
-- ARGV[9] expire_at: when every key of the campaign expires (unix seconds),
-- ARGV[10] ended_early ("1" or "0"),
-- ARGV[11] buckets: how many buckets the campaign has (this is one of
--   them, or the campaign's own tag holding their aggregate),
-- ARGV[12] u, then u pairs: user id, units of their active orders,
-- then r, then r pairs: request id, its stored result (a success for
--   every order, active or not, so a polled result stays what it was; the
--   refusals MySQL decided),
-- then f, then f pairs: fin:<status>, how many of the results have it,
-- then pairs to the end: order id, units of an order no longer active
--   (its release, if one is still in flight, must change nothing)
--
-- Reply: 1 loaded; 0 refused, nothing changed: Redis holds this epoch or a
--        later one (a concurrent load that read the ledger after this one).
--
-- Everything else of the old state goes: successes without an order (never
-- stored: their requests are decided again), queued markers,
-- Idempotency-Keys, buyers' units, counters, the admissions set. Refusals
-- stay (see below).
-- Rate-limit state stays.
--
-- Every key gets expire_at, kept in meta for the scripts that create keys
-- later (admit, deduct, reject, release): Redis forgets a sale on its own
-- once it is long over, and a load gives it a new lifetime.

local current = redis.call('HMGET', KEYS[1], 'stock', 'epoch', 'returns')
local held = loaded_epoch(current)
if held and held >= tonumber(ARGV[1]) then
  return 0
end

-- The refusals Redis decided stay: each was final when Redis made it (it
-- decided the campaign then), a shopper may have read it, and a message
-- of it delivered again must find it.
local kept = {}
local old = redis.call('HGETALL', KEYS[6])
for i = 1, #old, 2 do
  local v = old[i + 1]
  if not is_queued(v) and string.sub(v, 1, 8) ~= 'success|' then
    kept[#kept + 1] = old[i]
    kept[#kept + 1] = v
  end
end

redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[11], KEYS[12], KEYS[13], KEYS[14])
redis.call('HSET', KEYS[1], 'stock', ARGV[2], 'limit', ARGV[3], 'start_ms', ARGV[4], 'end_ms', ARGV[5],
  'epoch', ARGV[1], 'paused', ARGV[6], 'expire_at', ARGV[9], 'ended_early', ARGV[10], 'buckets', ARGV[11])
-- A campaign's returns counter only rises (soldout.lua), and a load counts
-- as a return: a worker that read it before this load scanned the old
-- state, and must not put the sold-out flag up over the new one.
redis.call('HSET', KEYS[1], 'returns', tonumber(current[3] or '0') + 1)
redis.call('SET', KEYS[2], ARGV[7])
if tonumber(ARGV[7]) == 0 then
  redis.call('SET', KEYS[3], '1')
end

local at = 12
local users = tonumber(ARGV[at])
hset_chunks(KEYS[5], ARGV, at + 1, at + 2 * users)
at = at + 2 * users + 1
local results = tonumber(ARGV[at])
hset_chunks(KEYS[6], ARGV, at + 1, at + 2 * results)
at = at + 2 * results + 1
local finished = tonumber(ARGV[at])
-- Every restored result counts as admitted and finished, so none is queued.
redis.call('HSET', KEYS[4], 'sold', ARGV[8], 'admitted', results)
hset_chunks(KEYS[4], ARGV, at + 1, at + 2 * finished)
at = at + 2 * finished + 1
hset_chunks(KEYS[8], ARGV, at, #ARGV)
-- A kept refusal yields to the ledger's result of its request (an order,
-- or MySQL's refusal).
for i = 1, #kept, 2 do
  if redis.call('HSETNX', KEYS[6], kept[i], kept[i + 1]) == 1 then
    redis.call('HINCRBY', KEYS[4], 'admitted', 1)
    redis.call('HINCRBY', KEYS[4], 'fin:' .. string.match(kept[i + 1], '^([^|]*)|'), 1)
  end
end
for i = 1, #KEYS do
  redis.call('EXPIREAT', KEYS[i], ARGV[9])
end
return 1
