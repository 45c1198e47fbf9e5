-- lost.lua: give a request whose state died a final "rejected" result
-- (lost), once the queue has passed it. Redis lost the request's queued
-- marker and result (wiped, a failover that lost unreplicated writes, a
-- rebuild), and with a queue living in Redis its message too: nothing
-- else would ever decide it, and a poll would find nothing. The caller
-- found no result here and no order in MySQL.
--
-- The rule is notenqueued.lua's (read its header): a message that is
-- stored at all is stored within the grace of its admission, and a
-- partition is decided first in, first out, so once a request admitted
-- after passed_ms was decided, a request admitted at least the grace
-- before passed_ms whose message was stored has been decided. This one has
-- no result, so its message was never stored or died with Redis. The
-- admission's millisecond is the gateway's (the request id's UUIDv7),
-- allowed the skew against Redis's clock. A request admitted the longest
-- queue delay ago, or of a sale that ended that long ago, is passed too
-- (unless a resume is more recent: a held backlog only drains then): its
-- message, stored at all, has come by then. A request of a sale sold out
-- (its bucket empty, and the campaign of one bucket or its sold-out flag
-- up) ends at once: it could only be refused. A
-- rebuild deletes the counters, so after a loss only decisions made since
-- pass anything.
--
-- As in reject.lua, a result that stands is returned, and a message that
-- shows up after all finds the rejected result and deduct.lua decides
-- nothing: exactly one final result, and no unit taken. The lost result
-- is not counted finished (fin:<status>), since the request was never
-- counted admitted in this epoch: the counter lost counts them.
--
-- KEYS[1] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[2] counters  hash: decided, passed_ms, mark:<seq> (notenqueued.lua),
--                   durable (durable.lua), lost (this script's count)
-- KEYS[3] meta      hash: start_ms, end_ms, resumed_ms, expire_at, buckets
-- KEYS[4] stock     units left (missing: the campaign is not loaded)
-- ARGV[1] request id
-- ARGV[2] the caller's user id, the owner of a result written now
-- ARGV[3] the request's admission, ms (its id's UUIDv7, the gateway's clock)
-- ARGV[4] the grace, ms: longest from an admission to its message stored
-- ARGV[5] the longest possible queue delay, ms (0: its rules are off)
-- ARGV[6] the skew, ms: the gateways' clocks against Redis's
-- ARGV[7] the reason of the rejected result
-- ARGV[8] "1" (go-redis's true) when the campaign's sold-out flag was up
--         (read by the caller: in a campaign of several buckets it lives
--         in another slot)
--
-- Reply:
--   { 1, value }  a result stands (as a shopper may see it: stored_shown)
--   { 2, value }  the rejected result this call stored
--   { 0 }         the queue has not passed the request yet: nothing written
--   { -1 }        the id's time is outside the sale: no request of this
--                 campaign has it. Nothing written.
--   { -2 }        the campaign is not loaded. Nothing written.

redis.replicate_commands()

local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored then
  return { 1, stored_shown(stored, tonumber(redis.call('HGET', KEYS[2], 'durable') or '0')) }
end
if redis.call('EXISTS', KEYS[4]) == 0 then
  return { -2 }
end
local now = unix_ms(redis.call('TIME'))
local at, grace, delay, skew = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local meta = redis.call('HMGET', KEYS[3], 'start_ms', 'end_ms', 'resumed_ms', 'expire_at', 'buckets')
local start_ms, end_ms = tonumber(meta[1] or '0'), tonumber(meta[2] or '0')
if at > now + skew or at + skew < start_ms or (end_ms > 0 and at > end_ms + skew) then
  return { -1 }
end

-- passed_ms, and the marks decided has passed since the last sweep, which
-- notenqueued.lua confirms only on its next run.
local decided, _, passed, marks = read_marks(KEYS[2])
for _, m in ipairs(marks) do
  if m[1] < decided then
    passed = math.max(passed, m[2])
  end
end
-- Past the longest queue delay after its admission (or the sale's end),
-- a message that was stored has come: a request with nothing stored is
-- lost even when nothing admitted later passes it (a sold-out sale).
local settled = delay > 0 and tonumber(meta[3] or '0') + delay <= now
local aged = settled and (at + skew + delay <= now or (end_ms > 0 and end_ms + delay <= now))
-- Sold out (this bucket has no unit left, and no other may refill it: the
-- campaign has one bucket, or its sold-out flag says every bucket was
-- found empty): decided now, the request would be refused sold out, so
-- ending it refuses nothing stock could serve, whether or not its message
-- still comes. Without this a lost request of a sold-out sale waits for
-- the delay: nothing admitted after it passes it.
local sold_out = tonumber(redis.call('GET', KEYS[4]) or '1') <= 0
  and (tonumber(meta[5] or '1') <= 1 or ARGV[8] == '1')
if not aged and not sold_out and at + grace + skew > passed then
  return { 0 }
end

local value = stored_result('rejected', 0, '', ARGV[7], ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], value)
redis.call('HINCRBY', KEYS[2], 'lost', 1)
-- The results hash may be new (a load without orders writes none; the
-- counters, like meta, exist from the load on).
expire_with_campaign(meta[4], KEYS[1])
return { 2, value }
