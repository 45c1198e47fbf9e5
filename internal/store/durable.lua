-- durable.lua: raise a tag's durable mark once the orders of a batch's
-- successes are stored in MySQL. A shopper sees a success (store.Result,
-- store.Results, admit.lua's replay) only once its decision number
-- (deduct.lua) is at or below the mark; until then it is still queued.
-- The mark only goes up: a redelivered batch leaves it.
--
-- KEYS[1] counters  hash: made (deduct.lua), durable (this script)
-- KEYS[2] meta      hash: stock, epoch (rebuild.lua)
-- ARGV[1]           the batch's highest decision number
-- ARGV[2]           the epoch the batch was decided under
--
-- Reply:
--    1  the mark is at ARGV[1] or above
--    0  refused, nothing changed: the tag is under another epoch. A load
--       reset the counters and restored the batch's stored orders as
--       successes without a number (durable by definition); an older
--       number would uncover the new load's successes.
--   -1  refused, nothing changed: the tag is not loaded

local held = loaded_epoch(redis.call('HMGET', KEYS[2], 'stock', 'epoch'))
if not held then
  return -1
end
if held ~= tonumber(ARGV[2]) then
  return 0
end
local made = tonumber(ARGV[1])
if made > tonumber(redis.call('HGET', KEYS[1], 'durable') or '0') then
  redis.call('HSET', KEYS[1], 'durable', made)
end
return 1
