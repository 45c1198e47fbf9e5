-- reject.lua: give a request a final "rejected" result unless it already has a
-- final one. Used for messages the worker gives up on, so every admitted
-- request still ends in exactly one final result.
--
-- KEYS[1] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[2] counters  hash: admitted, fin:<status>
-- KEYS[3] meta      hash: expire_at (rebuild.lua), the lifetime of what this call creates
-- ARGV[1] request id
-- ARGV[2] rejected result value
--
-- Reply: the stored value after the call (the earlier final one, or ARGV[2])

local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored and not is_queued(stored) then
  return stored
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
-- Without its queued marker (a rebuild wiped it) it counts as admitted now,
-- as deduct.lua counts it.
if not stored then
  redis.call('HINCRBY', KEYS[2], 'admitted', 1)
end
redis.call('HINCRBY', KEYS[2], 'fin:rejected', 1)
-- The results hash may be new (counters, like meta, exists from the load
-- on).
expire_with_campaign(redis.call('HGET', KEYS[3], 'expire_at'), KEYS[1])
return ARGV[2]
