-- sweep.lua: give a final "rejected" result to the admitted requests of ONE
-- campaign (or bucket) that no worker has seen (admit.lua puts every
-- admitted request on the unseen set; deduct.lua and reject.lua take off
-- what a worker sees, withdraw.lua what a gateway takes back) when their
-- message can no longer be on its way: a gateway died between admitting
-- and publishing, or its publish's outcome was unknown and the message was
-- never stored. As in reject.lua, a request with a final result keeps it;
-- a message that shows up after all finds the rejected result and
-- deduct.lua decides nothing twice: exactly one final result, and no unit
-- taken for it.
--
-- A request is due once it was admitted longer ago than the longest
-- possible queue delay AND the queue has moved past it: a worker decided a
-- request admitted after it (counters decided, the highest sequence number
-- decided; a partition is first in, first out), or the sale ended that
-- delay ago (nothing is admitted after the last request). A queue that
-- stands still (its broker down, its workers stuck) thus has nothing swept,
-- however long it stands. The oldest requests are looked at in the order
-- of their sequence numbers (one batch's share a millisecond), so the
-- first one the queue has not passed ends the call: the ones after it wait
-- with it.
--
-- Not swept: a paused campaign (its messages are held, not lost), nor one
-- whose resume (meta resumed_ms) is more recent than the delay, since the
-- held backlog only drains then; nor a campaign that is not loaded (a
-- rebuild drops the unseen set with the queued markers).
--
-- KEYS[1] unseen    sorted set: request id -> ms admitted
-- KEYS[2] results   hash request id -> "status|qty|order_id|reason|user";
--                   a queued marker's reason is its sequence number
-- KEYS[3] counters  hash: decided, fin:<status>
-- KEYS[4] meta      hash: paused, resumed_ms, end_ms
-- KEYS[5] stock     only checked for existence (campaign loaded)
-- ARGV[1] the longest possible queue delay, ms
-- ARGV[2] most unseen requests to look at in this call
-- ARGV[3] the reason of the rejected results
--
-- Reply: { left, taken, rid_1, value_1, ..., rid_n, value_n }
--   left    requests still unseen after this call
--   taken   requests taken off the set by this call (at most ARGV[2]; when
--           fewer, nothing else is due now)
--   then each result this call stored

redis.replicate_commands()

if redis.call('ZCARD', KEYS[1]) == 0 then
  return { 0, 0 }
end
local meta = redis.call('HMGET', KEYS[4], 'paused', 'resumed_ms', 'end_ms')
if redis.call('EXISTS', KEYS[5]) == 0 or meta[1] == '1' then
  return { redis.call('ZCARD', KEYS[1]), 0 }
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local delay = tonumber(ARGV[1])
local cutoff = now - delay
if tonumber(meta[2] or '0') > cutoff then
  return { redis.call('ZCARD', KEYS[1]), 0 }
end
local ended = tonumber(meta[3] or '0') + delay <= now
local decided = tonumber(redis.call('HGET', KEYS[3], 'decided') or '0')

local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
if #old == 0 then
  return { redis.call('ZCARD', KEYS[1]), 0 }
end
local stored = redis.call('HMGET', KEYS[2], unpack(old))
local reply = { 0, 0 }
local results, taken, queued = {}, {}, {}
for i, rid in ipairs(old) do
  local v = stored[i]
  -- No result at all: nothing is known of the request (a rebuild dropped
  -- it), so there is nothing to finish; a final one stays.
  if v and string.sub(v, 1, 7) == 'queued|' then
    local qty, seq, user = string.match(v, '^queued|([^|]*)|[^|]*|([^|]*)|(.*)$')
    queued[#queued + 1] = { rid = rid, qty = qty, seq = tonumber(seq) or 0, user = user }
  else
    taken[#taken + 1] = rid
  end
end
table.sort(queued, function(a, b) return a.seq < b.seq end)
for _, q in ipairs(queued) do
  if not ended and q.seq > decided then
    break -- the queue has not passed it yet
  end
  local value = 'rejected|' .. q.qty .. '||' .. ARGV[3] .. '|' .. q.user
  results[#results + 1] = q.rid
  results[#results + 1] = value
  reply[#reply + 1] = q.rid
  reply[#reply + 1] = value
  taken[#taken + 1] = q.rid
end
if #results > 0 then
  redis.call('HSET', KEYS[2], unpack(results))
  redis.call('HINCRBY', KEYS[3], 'fin:rejected', #results / 2)
end
if #taken > 0 then
  redis.call('ZREM', KEYS[1], unpack(taken))
end
reply[1] = redis.call('ZCARD', KEYS[1])
reply[2] = #taken
return reply
