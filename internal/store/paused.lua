-- paused.lua: mirror a campaign's paused flag from MySQL into its meta, so
-- workers hold (or resume) its requests. A resume also notes when, on
-- Redis's clock (resumed_ms): the held backlog drains only from then on, so
-- the not-enqueued sweep (notenqueued.lua) waits the longest queue delay
-- again before it rejects anything.
--
-- KEYS[1] meta
-- ARGV[1] the epoch the flag was read with, ARGV[2] paused ("1" or "0")
--
-- Reply: 1 written; 0 nothing changed: Redis does not hold that epoch (not
--        loaded, or loaded by another load, which read the flag itself)

-- TIME makes the script non-deterministic; Redis < 5 then needs effects
-- replication. A no-op on later versions.
redis.replicate_commands()

local current = redis.call('HMGET', KEYS[1], 'stock', 'epoch', 'paused')
if loaded_epoch(current) ~= tonumber(ARGV[1]) then
  return 0
end
if ARGV[2] == '0' and current[3] == '1' then
  redis.call('HSET', KEYS[1], 'paused', '0', 'resumed_ms', unix_ms(redis.call('TIME')))
  return 1
end
redis.call('HSET', KEYS[1], 'paused', ARGV[2])
return 1
