-- sweep.lua: give a final "rejected" result to the requests of ONE campaign
-- that unknown.lua recorded and that are still queued after the longest
-- possible queue delay: their publish outcome was unknown and no worker has
-- seen them since (deduct.lua and reject.lua remove what a worker sees), so
-- their message was never stored. As in reject.lua, a request with a final
-- result keeps it; a message that shows up after all finds the rejected
-- result and deduct.lua decides nothing twice: exactly one final result,
-- and no unit taken for it.
--
-- Not swept: a paused campaign (its messages are held, not lost), nor one
-- whose resume (meta resumed_ms) is more recent than the delay, since the
-- held backlog only drains then; nor a campaign that is not loaded (a
-- rebuild drops the recorded requests with the queued markers).
--
-- KEYS[1] unknown   sorted set: request id -> ms when recorded
-- KEYS[2] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[3] counters  hash: fin:<status>
-- KEYS[4] meta      hash: paused, resumed_ms
-- KEYS[5] stock     only checked for existence (campaign loaded)
-- ARGV[1] the longest possible queue delay, ms
-- ARGV[2] most recorded requests to look at in this call
-- ARGV[3] the reason of the rejected results
--
-- Reply: { left, looked, rid_1, value_1, ..., rid_n, value_n }
--   left    requests still recorded after this call
--   looked  recorded requests due and looked at (and removed) by this call
--   then each result this call stored

redis.replicate_commands()

local meta = redis.call('HMGET', KEYS[4], 'paused', 'resumed_ms')
if redis.call('EXISTS', KEYS[5]) == 0 or meta[1] == '1' then
  return { redis.call('ZCARD', KEYS[1]), 0 }
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - tonumber(ARGV[1])
if tonumber(meta[2] or '0') > cutoff then
  return { redis.call('ZCARD', KEYS[1]), 0 }
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
if #due == 0 then
  return { redis.call('ZCARD', KEYS[1]), 0 }
end
local stored = redis.call('HMGET', KEYS[2], unpack(due))
local reply = { 0, #due }
local results = {}
for i, rid in ipairs(due) do
  local v = stored[i]
  -- No result at all: nothing is known of the request (a rebuild dropped
  -- it), so there is nothing to finish.
  if v then
    local status, qty, _, _, user = string.match(v, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
    if status == 'queued' then
      local value = 'rejected|' .. qty .. '||' .. ARGV[3] .. '|' .. user
      results[#results + 1] = rid
      results[#results + 1] = value
      reply[#reply + 1] = rid
      reply[#reply + 1] = value
    end
  end
end
if #results > 0 then
  redis.call('HSET', KEYS[2], unpack(results))
  redis.call('HINCRBY', KEYS[3], 'fin:rejected', #results / 2)
end
redis.call('ZREM', KEYS[1], unpack(due))
reply[1] = redis.call('ZCARD', KEYS[1])
return reply
