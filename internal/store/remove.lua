-- remove.lua: delete every key of a campaign, unless a request was
-- admitted since the caller looked: a campaign deleted before its start,
-- or archived once its sale is settled and reconciled. What the caller
-- checked still holds when the keys go, since nothing is admitted without
-- the counter moving, and with the stock gone nothing more can be
-- (admit.lua refuses a campaign not loaded).
--
-- KEYS[1] counters, then every other key of the campaign
-- ARGV[1] the admitted count the caller checked (0 when none)
--
-- Reply: the number of keys deleted (>= 0); -1 refused, nothing changed:
--        the admitted count moved

local admitted = tonumber(redis.call('HGET', KEYS[1], 'admitted') or '0')
if admitted ~= tonumber(ARGV[1]) then
  return -1
end
return redis.call('DEL', unpack(KEYS))
