-- accept.lua: record an admitted purchase request as queued, deduplicated by
-- the shopper's Idempotency-Key, before the gateway publishes it.
--
-- KEYS[1] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[2] idem      hash "<user>|<idempotency key>" -> request id
-- KEYS[3] counters  hash: accepted
-- KEYS[4] stock     only checked for existence (campaign preloaded)
-- ARGV[1] request id
-- ARGV[2] queued result value
-- ARGV[3] idempotency field, "" when the shopper sent no key
--
-- Reply: { 0, request id }   accepted as new (or this request id again: a retry
--                            counts once)
--        { 1, request id }   an earlier request with the same key; nothing changed
--        { -1, "" }          campaign not preloaded; nothing changed

if redis.call('EXISTS', KEYS[4]) == 0 then
  return { -1, '' }
end
if ARGV[3] ~= '' then
  local earlier = redis.call('HGET', KEYS[2], ARGV[3])
  if earlier and earlier ~= ARGV[1] then
    return { 1, earlier }
  end
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[1])
end
-- A client retry of this same call must not count the request twice.
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'accepted', 1)
end
return { 0, ARGV[1] }
