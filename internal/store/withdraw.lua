-- withdraw.lua: take back what admit.lua stored for a request whose publish
-- failed, so a refused request leaves nothing behind. Only a still-queued
-- result is removed: if a worker somehow decided it already, the decision
-- stands.
--
-- KEYS[1] results, KEYS[2] idem, KEYS[3] counters (as in admit.lua)
-- ARGV[1] request id
-- ARGV[2] idempotency field, "" when none
--
-- Reply: 1 when the queued result was removed, 0 when there was none to remove

local removed = 0
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored and is_queued(stored) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'admitted', -1)
  removed = 1
end
-- A decided request keeps its key, so the shopper's retry finds its result
-- instead of buying again.
if ARGV[2] ~= '' and (removed == 1 or not stored) then
  local named = redis.call('HGET', KEYS[2], ARGV[2])
  if named and parse_idem(named) == ARGV[1] then
    redis.call('HDEL', KEYS[2], ARGV[2])
  end
end
return removed
