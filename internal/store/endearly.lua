-- endearly.lua: mirror an operator's early end of a sale from MySQL into its
-- meta: deduct.lua then rejects every request not decided yet
-- (ended_early), so the queue's backlog reaches a final result without
-- selling, whatever the gateways still admit until their cached copy goes.
--
-- KEYS[1] meta
-- ARGV[1] the epoch the campaign was read with, ARGV[2] its end (end_ms)
--
-- Reply: 1 written; 0 nothing changed: Redis does not hold that epoch (not
--        loaded, or loaded by another load, which read the flag itself)

local current = redis.call('HMGET', KEYS[1], 'stock', 'epoch')
if loaded_epoch(current) ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'ended_early', '1', 'end_ms', ARGV[2])
return 1
