-- deduct.lua: decide a batch of purchase requests of ONE campaign atomically,
-- in arrival order. Idempotent per request id: a request that already has a
-- final result gets that result again and changes nothing, so at-least-once
-- redelivery never deducts twice.
--
-- KEYS[1] stock     remaining units (string integer); missing = not preloaded
-- KEYS[2] users     hash user id -> units bought
-- KEYS[3] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[4] soldout   flag, set to "1" when stock reaches zero
-- KEYS[5] counters  hash: sold, fin:<status>
-- KEYS[6] meta      hash: stock, limit, start_ms, end_ms
-- ARGV[1]           number of requests n
-- ARGV[2+4i .. 5+4i] request i: request id, user id, quantity, order id to use on success
--
-- Reply: { soldout_now, status_1, order_id_1, reason_1, ..., status_n, order_id_n, reason_n }
--   soldout_now  1 when this call took the stock to zero, else 0
--   status       success | sold_out | limit_exceeded | rejected
--   order_id     set for success, "" otherwise
--   reason       set for rejected (insufficient_stock, not_loaded, bad_message), "" otherwise

local n = tonumber(ARGV[1])
local reply = { 0 }
local remaining = redis.call('GET', KEYS[1])
local limit = redis.call('HGET', KEYS[6], 'limit')
local loaded = remaining and limit
if loaded then
  remaining = tonumber(remaining)
  limit = tonumber(limit)
end

for i = 0, n - 1 do
  local rid = ARGV[2 + 4 * i]
  local user = ARGV[3 + 4 * i]
  local qty = tonumber(ARGV[4 + 4 * i])
  local oid = ARGV[5 + 4 * i]
  local status, order, reason = nil, '', ''

  local stored = redis.call('HGET', KEYS[3], rid)
  if stored then
    local s, _, o, r = string.match(stored, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|')
    if s and s ~= 'queued' then
      status, order, reason = s, o, r
      reply[#reply + 1] = status
      reply[#reply + 1] = order
      reply[#reply + 1] = reason
    end
  end

  if not status then
    if not qty or qty < 1 then
      status, reason = 'rejected', 'bad_message'
    elseif not loaded then
      status, reason = 'rejected', 'not_loaded'
    elseif remaining <= 0 then
      status = 'sold_out'
    elseif qty > remaining then
      status, reason = 'rejected', 'insufficient_stock'
    else
      local bought = tonumber(redis.call('HGET', KEYS[2], user) or '0')
      if bought + qty > limit then
        status = 'limit_exceeded'
      else
        status, order = 'success', oid
        remaining = remaining - qty
        -- Written per success (not once at the end) so that an error later in
        -- the batch cannot leave a sale recorded without its deduction.
        redis.call('DECRBY', KEYS[1], qty)
        redis.call('HINCRBY', KEYS[2], user, qty)
        redis.call('HINCRBY', KEYS[5], 'sold', qty)
        if remaining == 0 then
          redis.call('SET', KEYS[4], '1')
          reply[1] = 1
        end
      end
    end
    redis.call('HSET', KEYS[3], rid, status .. '|' .. qty .. '|' .. order .. '|' .. reason .. '|' .. user)
    redis.call('HINCRBY', KEYS[5], 'fin:' .. status, 1)
    reply[#reply + 1] = status
    reply[#reply + 1] = order
    reply[#reply + 1] = reason
  end
end

return reply
