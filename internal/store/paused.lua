-- paused.lua: mirror a campaign's paused flag from MySQL into its meta, so
-- workers hold (or resume) its requests.
--
-- KEYS[1] meta
-- ARGV[1] the epoch the flag was read with, ARGV[2] paused ("1" or "0")
--
-- Reply: 1 written; 0 nothing changed: Redis does not hold that epoch (not
--        loaded, or loaded by another load, which read the flag itself)

local current = redis.call('HMGET', KEYS[1], 'stock', 'epoch')
if not current[1] or tonumber(current[2] or '0') ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'paused', ARGV[2])
return 1
