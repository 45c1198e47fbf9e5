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
-- A request still queued is rejected once the queue has moved past it:
--   passed  a worker decided a request of the same campaign (or bucket)
--           admitted at least the grace after it. A message that is stored
--           at all is stored within the grace of its admission (admit.lua's
--           call and the publish are each bounded by
--           gateway.publish_timeout), so it went into the partition before
--           that request's, and a partition is decided first in, first out.
--           A later request decided sooner proves nothing: its message may
--           have overtaken this one's, which then waits behind it.
--   aged    it was admitted the longest possible queue delay ago and a
--           request numbered after it was decided (counters decided): a
--           sold-out sale admits nothing that could pass it by the rule
--           above, and its message, stored at all, would have come by now.
--   ended   the sale ended the longest possible queue delay ago (nothing is
--           admitted after the last request).
-- Neither delay rule applies within the delay of a resume (meta
-- resumed_ms: a held backlog only drains then).
-- A queue that stands still (its broker down, its workers stuck) thus has
-- nothing swept by the first rule, however long it stands; a member keeps
-- its place until its requests are final.
--
-- Admission times of decided requests are not stored, so each call marks
-- the line: a mark (counters mark:<seq> = ms) says every request numbered
-- above seq was admitted after ms. Once decided passes a mark, a request
-- admitted after ms was decided: passed_ms takes ms, and every member
-- scored at most passed_ms - grace is passed. A mark is refreshed while
-- nothing is admitted, and at most MARKS are kept, spaced by a MARKS-th of
-- the oldest one's age, so a backlog of any length is followed in steps of
-- a fraction of it. Members scored after that line are not read at all:
-- a call that finds nothing to do mid-sale reads a few fields.
--
-- Not swept: a paused campaign (its messages are held, not lost), nor one
-- that is not loaded (a rebuild drops the admissions set with the queued
-- markers, and the counters with the marks).
--
-- KEYS[1] admissions sorted set: "<request id> <request id> ..." -> ms
-- KEYS[2] results   hash request id -> "status|qty|order_id|reason|user";
--                   a queued marker's reason is its sequence number
-- KEYS[3] counters  hash: decided, seq; the marks: mark:<seq> -> ms,
--                   passed_ms (see above)
-- KEYS[4] meta      hash: paused, resumed_ms, end_ms
-- KEYS[5] stock     only checked for existence (campaign loaded)
-- ARGV[1] the grace, ms: longest from an admission to its message stored
-- ARGV[2] the longest possible queue delay, ms (0: its two rules are off)
-- ARGV[3] most requests to look at in this call (at least one member's)
-- ARGV[4] the reason of the rejected results
--
-- Reply: { left, more, rid_1, value_1, ..., rid_n, value_n }
--   left     members left in the admissions set after this call
--   more     1 when another call may find more to do now: every member
--            looked at was dropped, and due ones were left unlooked at
--   then each result this call stored

redis.replicate_commands()

local MARKS = 8

if redis.call('ZCARD', KEYS[1]) == 0 then
  return { 0, 0 }
end
local meta = redis.call('HMGET', KEYS[4], 'paused', 'resumed_ms', 'end_ms')
if redis.call('EXISTS', KEYS[5]) == 0 or meta[1] == '1' then
  return { redis.call('ZCARD', KEYS[1]), 0 }
end
local now = unix_ms(redis.call('TIME'))
local grace, delay = tonumber(ARGV[1]), tonumber(ARGV[2])

-- The marks: confirm the ones decided has passed, then mark now.
local decided, seq, passed, marks = read_marks(KEYS[3])
local gone = {}
local kept, newest, oldest = 0, nil, now
for _, m in ipairs(marks) do
  if m[1] < decided then
    passed = math.max(passed, m[2])
    gone[#gone + 1] = m[3]
  else
    kept = kept + 1
    if not newest or m[1] > newest[1] then
      newest = m
    end
    oldest = math.min(oldest, m[2])
  end
end
if #gone > 0 then
  redis.call('HDEL', KEYS[3], unpack(gone))
  redis.call('HSET', KEYS[3], 'passed_ms', passed)
end
-- Without seq the counters are gone (expired): nothing to mark.
if seq > 0 then
  if newest and newest[1] == seq then
    redis.call('HSET', KEYS[3], newest[3], now) -- nothing admitted since
  elseif kept < MARKS and (not newest or (now - newest[2]) * MARKS >= now - oldest) then
    redis.call('HSET', KEYS[3], 'mark:' .. seq, now)
  end
end

local cutoff = passed - grace
-- The delay's rules, both off within a delay of a resume (a held backlog
-- only drains then): past the delay a request the queue has passed by
-- number is due even without a later admission's mark (a sold-out sale
-- admits nothing more), and once the sale ended the delay ago, any.
local settled = delay > 0 and tonumber(meta[2] or '0') + delay <= now
local ended = settled and tonumber(meta[3] or '0') + delay <= now
if settled then
  cutoff = math.max(cutoff, now - delay)
end
local budget = tonumber(ARGV[3])

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
      local _, qty, _, _, q = parse_stored(v)
      local user = stored_user(v)
      -- The number check holds by the marks unless Redis's clock stepped
      -- back; then the member waits.
      if ended or (q or 0) < decided then
        local value = stored_result('rejected', qty, '', ARGV[4], user)
        results[#results + 1] = rid
        results[#results + 1] = value
        reply[#reply + 1] = rid
        reply[#reply + 1] = value
      else
        done = false
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
