-- deduct.lua: decide a batch of purchase requests of ONE campaign atomically,
-- in arrival order. Idempotent per request id: a request that already has a
-- final result gets that result again and changes nothing, so at-least-once
-- redelivery never deducts twice.
--
-- KEYS[1] stock     remaining units (string integer); missing = not loaded
-- KEYS[2] users     hash user id -> units bought
-- KEYS[3] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[4] soldout   flag, set to "1" when stock reaches zero
-- KEYS[5] counters  hash: sold, admitted, fin:<status>; made, the last
--                   decision number: one per call that decides successes,
--                   shared by them (stored in their reason field;
--                   durable.lua raises durable up to it once their orders
--                   are in MySQL); for the queue
--                   position: decided (the highest admission sequence
--                   number decided, never lowered) and two samples of it,
--                   win_ms/win_w and prev_ms/prev_w (Redis time in ms, and
--                   decided then), the starts of the current and the last
--                   window of progressWindowMs: the decision rate is read
--                   over the span since prev_ms (Store.Progress)
-- KEYS[6] meta      hash: stock, limit, start_ms, end_ms, epoch, paused,
--                   expire_at (rebuild.lua), the lifetime of what this call creates,
--                   ended_early (endearly.lua): every request not decided yet
--                   is rejected (ended_early), paused or not
-- ARGV[1]           number of requests n
-- ARGV[2+4i .. 5+4i] request i: request id, user id, quantity, order id to use on success
-- ARGV[2+4n]        (a bucket of a campaign of several, meta buckets > 1)
--                   optional: the bucket's moves counter (meta) as the
--                   caller's scan found every other bucket empty; while it
--                   still is that, a request this bucket cannot serve is
--                   decided (sold_out, insufficient_stock), else it is
--                   short (see buckets.go)
--
-- Reply: { soldout_now, epoch, status_1, order_id_1, reason_1, ..., status_n, order_id_n, reason_n }
--   soldout_now  1 when this call took the stock to zero, else 0
--                (never in a bucket of several: the campaign is sold out
--                only when every bucket is, buckets.go decides it)
--   epoch        the campaign's epoch in meta (0 when it has none): the
--                worker stores the successes only while MySQL is at it
--   status       success | sold_out | limit_exceeded | rejected
--   order_id     set for success, "" otherwise
--   reason       set for rejected (insufficient_stock, bad_message, ended_early);
--                for success its decision number ("" when it has none:
--                stored before decision numbers, or by rebuild.lua);
--                "" otherwise
-- or, in a bucket of several when some request is short or this call
-- emptied the bucket:
--   { 2, epoch, buckets, moves, status_1, order_id_1, reason_1, ... }
--   status       as above, or short: this bucket lacks the units and
--                others may hold them; nothing is written for it (its
--                queued marker stays) and the caller moves stock and
--                asks again
-- or, deciding nothing (the worker holds the batch):
--   { -1 }       not loaded: Redis has no stock for the campaign. It was
--                never loaded, or Redis lost it and a preload will rebuild
--                it from MySQL; a final result decided now would be decided
--                against nothing. Nothing is written.
--   { -2 }       paused (meta paused = "1") and not ended early. Nothing is
--                written (a held request is in the queue; notenqueued.lua
--                leaves a paused campaign alone).
--
-- Cost: every redis.call is the expensive part of a script, so the batch reads
-- its stored results and its users' units with one HMGET each, decides in Lua
-- tables, and writes once at the end: one DECRBY for all its units, one HSET
-- of its buyers' units, one HSET of its results (in chunks below Lua's unpack
-- limit). Nothing is written before every request is decided, so a script
-- that stops on an error inside the loop changes nothing and the batch is
-- decided again on redelivery. The writes go deduction first, results last:
-- a stop between them could only lose units (undersell), never record a
-- success whose units were not taken.

-- TIME (the decision rate's clock) makes the script non-deterministic;
-- Redis < 5 then needs effects replication. A no-op on later versions.
redis.replicate_commands()

local n = tonumber(ARGV[1])
local progress_window_ms = 5000
local remaining = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[6], 'limit', 'epoch', 'paused', 'expire_at', 'ended_early', 'buckets', 'moves')
if not remaining or not meta[1] then
  return { -1 }
end
-- A sale ended early holds nothing: its backlog must reach final results.
local ended_early = meta[5] == '1'
if meta[3] == '1' and not ended_early then
  return { -2 }
end
remaining = tonumber(remaining)
local limit = tonumber(meta[1])
local reply = { 0, tonumber(meta[2] or '0') }
-- In a bucket of several, an empty bucket is not a sold-out campaign: a
-- request it cannot serve stays undecided (short) unless the caller saw
-- every other bucket empty and no transfer touched this one since.
local bucketed = tonumber(meta[6] or '1') > 1
local moves = meta[7] or '0'
local short = bucketed and ARGV[2 + 4 * n] ~= moves
local shorts = 0

local rids, users = {}, {}
local seen_user, distinct_users = {}, {}
for i = 0, n - 1 do
  rids[#rids + 1] = ARGV[2 + 4 * i]
  local user = ARGV[3 + 4 * i]
  users[#users + 1] = user
  if not seen_user[user] then
    seen_user[user] = true
    distinct_users[#distinct_users + 1] = user
  end
end
local stored = redis.call('HMGET', KEYS[3], unpack(rids))
local bought = {}
-- Once sold out no request reaches the limit check: skip reading the units.
if remaining > 0 then
  local units = redis.call('HMGET', KEYS[2], unpack(distinct_users))
  for j, user in ipairs(distinct_users) do
    bought[user] = tonumber(units[j] or '0')
  end
end

-- top is the highest admission sequence number this call decides.
local top = 0

-- decided holds this batch's final results by request id, so a request
-- delivered twice within one batch is decided once.
local decided = {}
local results = {}  -- field/value pairs of the results decided by this call
local buyers = {}   -- field/value pairs: each buyer's units after this call
local bought_now = {} -- users already in buyers
local fin = {}      -- status -> results decided by this call
-- made is this call's decision number, the tag's last one plus one, taken
-- at its first success: the successes of a call are stored together, so
-- one number serves them all (and one number-to-string conversion).
local made = nil
-- Requests decided without the queued marker admit.lua stores: a rebuild
-- wiped it (or a withdraw raced a publish that went through). They count
-- as admitted now, so every final result has its admission.
local unmarked = 0
local sold = 0

for i = 1, n do
  local rid, user = rids[i], users[i]
  local qty = tonumber(ARGV[4 * i])
  local oid = ARGV[1 + 4 * i]
  local status, order, reason = nil, '', ''
  local seq = nil -- the admission number of a queued request

  local earlier = decided[rid]
  if earlier then
    status, order, reason = earlier[1], earlier[2], earlier[3]
  elseif stored[i] then
    local s, _, o, r, q = parse_stored(stored[i])
    if s and s ~= 'queued' then
      status, order, reason = s, o, r
    elseif s then
      seq = q
    end
  end

  if not status then
    if not stored[i] then
      unmarked = unmarked + 1
    end
    if not qty or qty < 1 then
      status, reason = 'rejected', 'bad_message'
    elseif ended_early then
      status, reason = 'rejected', 'ended_early'
    elseif short and qty > remaining then
      status = 'short'
    elseif remaining <= 0 then
      status = 'sold_out'
    elseif qty > remaining then
      status, reason = 'rejected', 'insufficient_stock'
    elseif bought[user] + qty > limit then
      status = 'limit_exceeded'
    else
      status, order = 'success', oid
      made = made or tostring(tonumber(redis.call('HGET', KEYS[5], 'made') or '0') + 1)
      reason = made
      remaining = remaining - qty
      bought[user] = bought[user] + qty
      sold = sold + qty
      if not bought_now[user] then
        bought_now[user] = true
        buyers[#buyers + 1] = user
      end
    end
    if status ~= 'short' and seq and seq > top then
      top = seq -- a short request is not decided: it stays ahead
    end
    if status == 'short' then
      shorts = shorts + 1
      if not stored[i] then
        unmarked = unmarked - 1 -- counted when it is decided
      end
    else
      results[#results + 1] = rid
      results[#results + 1] = stored_result(status, qty or 0, order, reason, user)
      fin[status] = (fin[status] or 0) + 1
      decided[rid] = { status, order, reason }
    end
  end
  reply[#reply + 1] = status
  reply[#reply + 1] = order
  reply[#reply + 1] = reason
end

if sold > 0 then
  redis.call('DECRBY', KEYS[1], sold)
  local units = {}
  for _, user in ipairs(buyers) do
    units[#units + 1] = user
    units[#units + 1] = bought[user]
  end
  hset_chunks(KEYS[2], units)
  if remaining == 0 and not bucketed then
    redis.call('SET', KEYS[4], '1')
    reply[1] = 1
  end
end
hset_chunks(KEYS[3], results)
if made then
  redis.call('HSET', KEYS[5], 'made', made)
end
-- Statistics only (the queued count and the sold total): one write per
-- status rather than one per request.
if sold > 0 then
  redis.call('HINCRBY', KEYS[5], 'sold', sold)
end
if unmarked > 0 then
  redis.call('HINCRBY', KEYS[5], 'admitted', unmarked)
end
for status, count in pairs(fin) do
  redis.call('HINCRBY', KEYS[5], 'fin:' .. status, count)
end
-- The watermark only moves up: a redelivered or overtaken batch leaves it.
if top > 0 then
  local p = redis.call('HMGET', KEYS[5], 'decided', 'win_ms', 'win_w')
  local was = tonumber(p[1] or '0')
  if top > was then
    local now_ms = unix_ms(redis.call('TIME'))
    local win_ms = tonumber(p[2] or '0')
    if win_ms == 0 then
      redis.call('HSET', KEYS[5], 'decided', top, 'win_ms', now_ms, 'win_w', was)
    elseif now_ms - win_ms >= progress_window_ms then
      redis.call('HSET', KEYS[5], 'decided', top, 'win_ms', now_ms, 'win_w', was, 'prev_ms', win_ms, 'prev_w', p[3])
    else
      redis.call('HSET', KEYS[5], 'decided', top)
    end
  end
end
-- The keys written may be new (and SET dropped the flag's expiry).
if sold > 0 then
  expire_with_campaign(meta[4], KEYS[2])
  if remaining == 0 and not bucketed then
    expire_with_campaign(meta[4], KEYS[4])
  end
end
if #results > 0 then
  expire_with_campaign(meta[4], KEYS[3])
end
-- A bucket of several that this call emptied asks the caller to look at
-- the others: when they are empty too the campaign is sold out.
if shorts > 0 or (bucketed and sold > 0 and remaining == 0) then
  reply[1] = 2
  table.insert(reply, 3, tonumber(meta[6]))
  table.insert(reply, 4, tonumber(moves))
end
return reply
