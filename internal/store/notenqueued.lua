-- notenqueued.lua: the not-enqueued sweep of ONE campaign (or bucket): give
-- a final "rejected" result (not_enqueued) to the admitted requests whose
-- message can no longer be on its way: a gateway died between admitting
-- and publishing, its publish's outcome was unknown and the message was
-- never stored, or admit.lua's reply was lost. admit.lua adds every call
-- that admitted requests to the admissions set (a member of KEYS[1]: their
-- ids, scored with the call's millisecond); this script walks the oldest
-- members and drops each once all of its requests are final. As in
-- reject.lua, a request with a final result keeps it; a message that shows
-- up after all finds the rejected result and deduct.lua decides nothing
-- twice: exactly one final result, and no unit taken.
--
-- A request is rejected when it is still queued, was admitted longer ago
-- than the longest possible queue delay, AND the queue has moved past it:
-- a worker decided a request of the same campaign (or bucket) admitted
-- after it (counters decided, the highest sequence number decided; a
-- partition is first in, first out), or the sale ended that delay ago
-- (nothing is admitted after the last request). A queue that stands still
-- (its broker down, its workers stuck) thus has nothing swept, however
-- long it stands; a member keeps its place until its requests are final.
--
-- Not swept: a paused campaign (its messages are held, not lost), nor one
-- whose resume (meta resumed_ms) is more recent than the delay, since the
-- held backlog only drains then; nor a campaign that is not loaded (a
-- rebuild drops the admissions set with the queued markers).
--
-- KEYS[1] admissions sorted set: "<request id> <request id> ..." -> ms
-- KEYS[2] results   hash request id -> "status|qty|order_id|reason|user";
--                   a queued marker's reason is its sequence number
-- KEYS[3] counters  hash: decided, fin:<status>
-- KEYS[4] meta      hash: paused, resumed_ms, end_ms
-- KEYS[5] stock     only checked for existence (campaign loaded)
-- ARGV[1] the longest possible queue delay, ms
-- ARGV[2] most requests to look at in this call (at least one member's)
-- ARGV[3] the reason of the rejected results
--
-- Reply: { left, more, rid_1, value_1, ..., rid_n, value_n }
--   left     members left in the admissions set after this call
--   more     1 when another call may find more to do now: every member
--            looked at was dropped, and due ones were left unlooked at
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
local budget = tonumber(ARGV[2])

local range = 64
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, range)
local reply = { 0, 0 }
local results, dropped = {}, {}
local looked, seen = 0, 0
for _, member in ipairs(members) do
  local rids = {}
  for rid in string.gmatch(member, '%S+') do
    rids[#rids + 1] = rid
  end
  if looked > 0 and seen + #rids > budget then
    break
  end
  looked, seen = looked + 1, seen + #rids
  local stored = redis.call('HMGET', KEYS[2], unpack(rids))
  local done = true
  for i, rid in ipairs(rids) do
    -- No result at all: withdrawn, or a rebuild dropped it; nothing to
    -- finish. A final one stays.
    local v = stored[i]
    if v and is_queued(v) then
      local _, qty, _, _, seq = parse_stored(v)
      local user = stored_user(v)
      if ended or (seq or 0) < decided then
        local value = stored_result('rejected', qty, '', ARGV[3], user)
        results[#results + 1] = rid
        results[#results + 1] = value
        reply[#reply + 1] = rid
        reply[#reply + 1] = value
      else
        done = false -- the queue has not passed it yet
      end
    end
  end
  if done then
    dropped[#dropped + 1] = member
  end
end
if #results > 0 then
  redis.call('HSET', KEYS[2], unpack(results))
  redis.call('HINCRBY', KEYS[3], 'fin:rejected', #results / 2)
end
if #dropped > 0 then
  redis.call('ZREM', KEYS[1], unpack(dropped))
end
reply[1] = redis.call('ZCARD', KEYS[1])
if #dropped == looked and (looked < #members or #members == range) then
  reply[2] = 1
end
return reply
