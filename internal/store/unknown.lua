-- unknown.lua: record admitted requests whose publish outcome is unknown
-- (the queue may or may not have stored their messages), so that sweep.lua
-- can give them a final result if no worker ever sees them. Scored on
-- Redis's clock, the one sweep.lua reads, so hosts' clocks do not matter.
--
-- KEYS[1] unknown   sorted set: request id -> ms when recorded
-- KEYS[2] meta      hash: expire_at (rebuild.lua), the lifetime of the set
-- ARGV             the request ids
--
-- Reply: the number of requests newly recorded

-- TIME makes the script non-deterministic; Redis < 5 then needs effects
-- replication. A no-op on later versions.
redis.replicate_commands()

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local added = 0
-- Chunked to stay clear of Lua's unpack limit.
for j = 1, #ARGV, 2000 do
  local args = {}
  for i = j, math.min(j + 1999, #ARGV) do
    args[#args + 1] = now
    args[#args + 1] = ARGV[i]
  end
  added = added + redis.call('ZADD', KEYS[1], 'NX', unpack(args))
end
-- The set may be new: it expires with the campaign's other keys, so a
-- campaign whose keys are gone leaves nothing for the sweep to keep.
local expire_at = redis.call('HGET', KEYS[2], 'expire_at')
if expire_at then
  redis.call('EXPIREAT', KEYS[1], expire_at)
end
return added
