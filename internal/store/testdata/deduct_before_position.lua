-- The baseline of BenchmarkDeductPosition (position_bench_test.go):
-- deduct.lua as of commit 612afee~1, before the queue position (no
-- "decided" watermark). Never loaded outside that benchmark.
-- deduct.lua: decide a batch of purchase requests of ONE campaign atomically,
-- in arrival order. Idempotent per request id: a request that already has a
-- final result gets that result again and changes nothing, so at-least-once
-- redelivery never deducts twice.
--
-- KEYS[1] stock     remaining units (string integer); missing = not loaded
-- KEYS[2] users     hash user id -> units bought
-- KEYS[3] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[4] soldout   flag, set to "1" when stock reaches zero
-- KEYS[5] counters  hash: sold, admitted, fin:<status>
-- KEYS[6] meta      hash: stock, limit, start_ms, end_ms, epoch, paused,
--                   expire_at (rebuild.lua), the lifetime of what this call creates,
--                   ended_early (endearly.lua): every request not decided yet
--                   is rejected (ended_early), paused or not
-- KEYS[7] unknown   sorted set of requests whose publish outcome was unknown
--                   (unknown.lua); the batch's are removed, as the worker
--                   has seen them (sweep.lua then leaves them alone)
-- ARGV[1]           number of requests n
-- ARGV[2+4i .. 5+4i] request i: request id, user id, quantity, order id to use on success
--
-- Reply: { soldout_now, epoch, status_1, order_id_1, reason_1, ..., status_n, order_id_n, reason_n }
--   soldout_now  1 when this call took the stock to zero, else 0
--   epoch        the campaign's epoch in meta (0 when it has none): the
--                worker stores the successes only while MySQL is at it
--   status       success | sold_out | limit_exceeded | rejected
--   order_id     set for success, "" otherwise
--   reason       set for rejected (insufficient_stock, bad_message, ended_early), "" otherwise
-- or, deciding nothing (the worker holds the batch):
--   { -1 }       not loaded: Redis has no stock for the campaign. It was
--                never loaded, or Redis lost it and a preload will rebuild
--                it from MySQL; a final result decided now would be decided
--                against nothing. Nothing is written.
--   { -2 }       paused (meta paused = "1") and not ended early. Only KEYS[7]
--                is written: a held request is in the queue, and no sweep
--                may reject it.
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

local n = tonumber(ARGV[1])
local remaining = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[6], 'limit', 'epoch', 'paused', 'expire_at', 'ended_early')
if not remaining or not meta[1] then
  return { -1 }
end
-- EXISTS first: the set is nearly always empty, and then this costs one
-- call without the batch's ids.
if redis.call('EXISTS', KEYS[7]) == 1 then
  local seen = {}
  for i = 0, n - 1 do
    seen[#seen + 1] = ARGV[2 + 4 * i]
  end
  redis.call('ZREM', KEYS[7], unpack(seen))
end
-- A sale ended early holds nothing: its backlog must reach final results.
local ended_early = meta[5] == '1'
if meta[3] == '1' and not ended_early then
  return { -2 }
end
remaining = tonumber(remaining)
local limit = tonumber(meta[1])
local reply = { 0, tonumber(meta[2] or '0') }

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

-- decided holds this batch's final results by request id, so a request
-- delivered twice within one batch is decided once.
local decided = {}
local results = {}  -- field/value pairs of the results decided by this call
local buyers = {}   -- field/value pairs: each buyer's units after this call
local bought_now = {} -- users already in buyers
local fin = {}      -- status -> results decided by this call
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

  local earlier = decided[rid]
  if earlier then
    status, order, reason = earlier[1], earlier[2], earlier[3]
  elseif stored[i] then
    local s, _, o, r = string.match(stored[i], '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|')
    if s and s ~= 'queued' then
      status, order, reason = s, o, r
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
    elseif remaining <= 0 then
      status = 'sold_out'
    elseif qty > remaining then
      status, reason = 'rejected', 'insufficient_stock'
    elseif bought[user] + qty > limit then
      status = 'limit_exceeded'
    else
      status, order = 'success', oid
      remaining = remaining - qty
      bought[user] = bought[user] + qty
      sold = sold + qty
      if not bought_now[user] then
        bought_now[user] = true
        buyers[#buyers + 1] = user
      end
    end
    results[#results + 1] = rid
    results[#results + 1] = status .. '|' .. (qty or 0) .. '|' .. order .. '|' .. reason .. '|' .. user
    fin[status] = (fin[status] or 0) + 1
    decided[rid] = { status, order, reason }
  end
  reply[#reply + 1] = status
  reply[#reply + 1] = order
  reply[#reply + 1] = reason
end

-- Large batches are written in chunks to stay clear of Lua's unpack limit.
local function hset_all(key, pairs_list)
  for j = 1, #pairs_list, 4000 do
    redis.call('HSET', key, unpack(pairs_list, j, math.min(j + 3999, #pairs_list)))
  end
end

if sold > 0 then
  redis.call('DECRBY', KEYS[1], sold)
  local units = {}
  for _, user in ipairs(buyers) do
    units[#units + 1] = user
    units[#units + 1] = bought[user]
  end
  hset_all(KEYS[2], units)
  if remaining == 0 then
    redis.call('SET', KEYS[4], '1')
    reply[1] = 1
  end
end
hset_all(KEYS[3], results)
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
-- The keys written may be new (and SET dropped the flag's expiry): they
-- expire with the campaign's other keys.
if meta[4] then
  if sold > 0 then
    redis.call('EXPIREAT', KEYS[2], meta[4])
    if remaining == 0 then
      redis.call('EXPIREAT', KEYS[4], meta[4])
    end
  end
  if #results > 0 then
    redis.call('EXPIREAT', KEYS[3], meta[4])
  end
end
return reply
