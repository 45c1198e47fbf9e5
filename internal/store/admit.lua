-- admit.lua: admit a batch of ONE campaign's purchase requests in one call, so
-- a gateway pays one round trip for many concurrent shoppers instead of one
-- per limiter and one per request. Requests are decided in order; each sees
-- the writes of the ones before it, exactly as if they had been admitted one
-- by one.
--
-- Per request: the bot gate's challenge (a challenge admits once; see below),
-- then the per-client-IP, the per-user, then the per-campaign rate
-- limit (GCRA, the algorithm of go-redis/redis_rate: a refusal changes
-- nothing, a request let through moves the key's theoretical arrival time),
-- then the Idempotency-Key dedupe and the "queued" result that marks the
-- request admitted until a worker decides it. A key names its first request
-- and that request's fingerprint (its body, as the caller sums it up): the
-- same key again with the same fingerprint gets that request's result as it
-- stands now; with another fingerprint it is refused (the IETF
-- Idempotency-Key draft's 422). A key whose request has no result (none is
-- expected: withdraw.lua removes both) names nothing and is taken anew.
--
-- KEYS[1] results   hash request id -> "status|qty|order_id|reason|user"
-- KEYS[2] idem      hash "<user>|<idempotency key>" -> "<request id>|<fingerprint>"
--                   (a bare request id, written before fingerprints, matches any)
-- KEYS[3] counters  hash: admitted, seq (the last admission sequence number
--                   handed out: a queued request's place in its campaign's
--                   line, stored in its marker's reason field for the
--                   queue position; see deduct.lua's "decided"); durable
--                   (durable.lua), read for a replay of a success
-- KEYS[4] stock     only checked for existence (campaign preloaded)
-- KEYS[5] campaign rate limit: its theoretical arrival time (TAT), with a TTL
-- KEYS[6] user rate limits: hash user id -> TAT. One hash instead of a key per
--         user keeps the call count per batch constant; a TAT in the past
--         means the same as none, so stale fields need no expiry.
-- KEYS[7] client IP rate limits: hash client IP -> TAT, like KEYS[6]
-- KEYS[8] meta      hash: expire_at (rebuild.lua), the lifetime of what this call creates
-- KEYS[9] admissions sorted set (the admissions set): one member per call
--                   that admitted requests, their ids joined by spaces,
--                   scored with the call's millisecond (Redis's clock). The
--                   not-enqueued sweep (notenqueued.lua) rejects those
--                   whose message never came (not_enqueued) and drops
--                   a member once all of its requests are final. Written
--                   here, in the admission itself, so no crash of a gateway
--                   can leave a queued marker that nothing decides; one
--                   member per call keeps it one write per batch.
-- KEYS[9+j] challenge j: string, the holder ("k<idempotency key>") of the
--         request it admitted, expiring with the challenge (EXAT)
-- ARGV, at the positions admit.go names (admitLayout, declared before this
-- file as locals ADMIT_*):
--   the head, ADMIT_HEAD values: ADMIT_N n; ADMIT_USER_RATE user rate per
--     second (0 = off), ADMIT_USER_BURST; ADMIT_CAMPAIGN_RATE (0 = off),
--     ADMIT_CAMPAIGN_BURST; ADMIT_IP_RATE client IP rate (0 = off),
--     ADMIT_IP_BURST
--   then request i = 1..n, ADMIT_REQUEST_FIELDS values at these offsets
--     from its first: ADMIT_REQUEST_ID; ADMIT_QUANTITY (its queued marker
--     is stored_queued(quantity, seq, user id)); ADMIT_IDEM_FIELD ("" when
--     the shopper sent no key); ADMIT_USER_ID; ADMIT_CLIENT_IP ("" when
--     unknown: not limited); ADMIT_FINGERPRINT
--   then m, the gated requests; then challenge j = 1..m,
--     ADMIT_CHALLENGE_FIELDS values at these offsets from its first:
--     ADMIT_CHALLENGE_REQUEST the request's index i; ADMIT_CHALLENGE_EXPIRY
--     (Unix seconds); ADMIT_CHALLENGE_HOLDER the request's holder ("k" ..
--     its Idempotency-Key)
--
-- Reply: { code_1, value_1, ..., code_n, value_n }
--    0, request id    admitted as new (or this request id again: a retry counts once)
--    1, {request id, result}  an earlier request with the same key and fingerprint,
--                     and its stored result as a shopper may see it (a
--                     success not durable yet is queued: stored_shown);
--                     nothing changed
--   -1, ""            campaign not preloaded; nothing changed
--   -2, retry after   per-user rate limit (seconds, as a string); nothing changed
--   -3, retry after   per-campaign rate limit; nothing changed but the IP's and user's limits
--   -4, retry after   per-client-IP rate limit; nothing changed
--   -5, ""            the key names an earlier request with another fingerprint;
--                     nothing changed but the rate limits, which counted it
--   -6, ""            the challenge admitted another request before (one that
--                     was not the same keyed purchase); nothing changed
--
-- A challenge is spent when it admits a new request, not before, so a
-- request refused here (rate limited, say) leaves it for a retry. It then
-- admits nothing else, but a repeat of the same keyed purchase passes it
-- and gets its first request back, by the Idempotency-Key, as any repeat.

-- Cost: every redis.call is the expensive part of a script, so the batch
-- reads everything it needs first (one HMGET per hash), decides in Lua
-- tables, and writes at the end with one command per key: about ten calls
-- per batch whatever its size. A script that stopped before the writes
-- changed nothing.

-- TIME makes the script non-deterministic; Redis < 5 then needs effects
-- replication. A no-op on later versions.
redis.replicate_commands()

local n = tonumber(ARGV[ADMIT_N])
local user_rate, user_burst = tonumber(ARGV[ADMIT_USER_RATE]), tonumber(ARGV[ADMIT_USER_BURST])
local campaign_rate, campaign_burst = tonumber(ARGV[ADMIT_CAMPAIGN_RATE]), tonumber(ARGV[ADMIT_CAMPAIGN_BURST])
local ip_rate, ip_burst = tonumber(ARGV[ADMIT_IP_RATE]), tonumber(ARGV[ADMIT_IP_BURST])

-- The batch shares one clock reading; relative to 2017 as in redis_rate, to
-- keep the float's precision.
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1483228800) + tonumber(t[2]) / 1000000

-- The per-request loops read ARGV through a local and count their appends
-- themselves: a global or a # is a lookup each time (docs/BENCHMARKS.md).
local argv = ARGV
local rids, qtys, idems, users, ips, fps, idem_fields = {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  local base = ADMIT_HEAD + 1 + ADMIT_REQUEST_FIELDS * (i - 1)
  rids[i], qtys[i], idems[i] = argv[base + ADMIT_REQUEST_ID], argv[base + ADMIT_QUANTITY], argv[base + ADMIT_IDEM_FIELD]
  users[i], ips[i], fps[i] = argv[base + ADMIT_USER_ID], argv[base + ADMIT_CLIENT_IP], argv[base + ADMIT_FINGERPRINT]
  if idems[i] ~= '' then
    idem_fields[#idem_fields + 1] = idems[i]
  end
end

-- The challenges: gate[i] of a gated request i; spent[key], the holder
-- that spent it or false, read in one MGET and moved as the batch spends.
local gated_at = ADMIT_HEAD + ADMIT_REQUEST_FIELDS * n + 1
local m = tonumber(argv[gated_at])
local gate, spent, spends = {}, {}, {}
if m > 0 then
  local ckeys = {}
  for j = 1, m do
    local base = gated_at + 1 + ADMIT_CHALLENGE_FIELDS * (j - 1)
    ckeys[j] = KEYS[9 + j]
    gate[tonumber(argv[base + ADMIT_CHALLENGE_REQUEST])] = { key = ckeys[j],
      exat = argv[base + ADMIT_CHALLENGE_EXPIRY], holder = argv[base + ADMIT_CHALLENGE_HOLDER] }
  end
  local held = redis.call('MGET', unpack(ckeys))
  for j = 1, m do
    spent[ckeys[j]] = held[j] or false
  end
end

-- TATs by user id ("" for the campaign), as read and as moved; client IPs
-- have their own tables, since an IP and a user id may look alike.
local tats, moved = {}, {}
local ip_tats, ip_moved = {}, {}

-- read_tats loads the TATs of the distinct non-empty subjects into tbl: a
-- subject that repeats within a batch (shoppers behind one NAT, a bot) costs
-- one field read, not one per request.
local function read_tats(key, subjects, tbl)
  local fields = {}
  for i = 1, n do
    local s = subjects[i]
    if s ~= '' and tbl[s] == nil then
      tbl[s] = false
      fields[#fields + 1] = s
    end
  end
  if #fields == 0 then
    return
  end
  local values = redis.call('HMGET', key, unpack(fields))
  for j = 1, #fields do
    tbl[fields[j]] = tonumber(values[j] or now)
  end
end

if ip_rate > 0 then
  read_tats(KEYS[7], ips, ip_tats)
end
if user_rate > 0 then
  read_tats(KEYS[6], users, tats)
end
if campaign_rate > 0 then
  tats[''] = tonumber(redis.call('GET', KEYS[5]) or now)
end

-- A limiter's interval and burst window (interval * burst) are the batch's,
-- worked out once here rather than per request.
local function window(rate, burst)
  local interval = 1 / rate
  return interval, interval * math.max(burst, 1)
end
local ip_interval, ip_window = window(ip_rate, ip_burst)
local user_interval, user_window = window(user_rate, user_burst)
local campaign_interval, campaign_window = window(campaign_rate, campaign_burst)

local function allow(tbl, mv, subject, interval, window)
  local tat = tbl[subject]
  if tat < now then
    tat = now
  end
  local new_tat = tat + interval
  local diff = now - (new_tat - window)
  if diff < 0 then
    return false, -diff
  end
  tbl[subject], mv[subject] = new_tat, true
  return true, 0
end

local loaded = redis.call('EXISTS', KEYS[4]) == 1
-- idem_of: idempotency field -> {rid, fp} of the request it names (fp
-- false: any), or false. result_of: request id -> stored result, for the
-- requests keys name.
local stored, idem_of, result_of = {}, {}, {}
-- durable is the tag's durable mark, read only when a key names a success.
local durable = 0
if loaded then
  local found = redis.call('HMGET', KEYS[1], unpack(rids))
  for i = 1, n do
    stored[rids[i]] = found[i] and true or false
  end
  if #idem_fields > 0 then
    local earlier = redis.call('HMGET', KEYS[2], unpack(idem_fields))
    local named = {}
    for j, field in ipairs(idem_fields) do
      local v = earlier[j]
      idem_of[field] = false
      if v then
        local rid, fp = parse_idem(v)
        local e = { rid = rid, fp = fp }
        idem_of[field] = e
        named[#named + 1] = e.rid
      end
    end
    if #named > 0 then
      local results = redis.call('HMGET', KEYS[1], unpack(named))
      local success = false
      for j, rid in ipairs(named) do
        result_of[rid] = results[j] or false
        success = success or (results[j] and string.sub(results[j], 1, 8) == 'success|')
      end
      if success then
        durable = tonumber(redis.call('HGET', KEYS[3], 'durable') or '0')
      end
    end
  end
end

local reply = {}
local new_results, new_idem, admitted = {}, {}, 0
local n_results = 0
-- Set when a reply names a request of this batch whose marker is not
-- complete yet (its sequence number comes after the loop).
local pending_named = false
for i = 1, n do
  local rid, idem = rids[i], idems[i]
  local code, value = 0, rid
  local ok, retry = true, 0
  local g = gate[i]
  if g then
    local h = spent[g.key]
    -- "k" holds no key: a keyless purchase is never repeated.
    if h and (h ~= g.holder or h == 'k') then
      ok, code, value = false, -6, ''
    end
  end
  if ok and ip_rate > 0 and ips[i] ~= '' then
    ok, retry = allow(ip_tats, ip_moved, ips[i], ip_interval, ip_window)
    if not ok then
      code, value = -4, tostring(retry)
    end
  end
  if ok and user_rate > 0 then
    ok, retry = allow(tats, moved, users[i], user_interval, user_window)
    if not ok then
      code, value = -2, tostring(retry)
    end
  end
  if ok and campaign_rate > 0 then
    ok, retry = allow(tats, moved, '', campaign_interval, campaign_window)
    if not ok then
      code, value = -3, tostring(retry)
    end
  end
  if ok then
    if not loaded then
      code, value = -1, ''
    else
      local earlier = idem ~= '' and idem_of[idem]
      if earlier and not result_of[earlier.rid] then
        earlier = false -- names nothing: taken anew
      end
      if earlier and earlier.rid ~= rid and earlier.fp and earlier.fp ~= fps[i] then
        code, value = -5, ''
      elseif earlier and earlier.rid ~= rid then
        local v = result_of[earlier.rid]
        if type(v) == 'string' then
          v = stored_shown(v, durable)
        end
        code, value = 1, { earlier.rid, v }
        pending_named = pending_named or type(value[2]) == 'number'
      else
        if idem ~= '' and not earlier then
          idem_of[idem] = { rid = rid, fp = fps[i] }
          -- A new marker waits for its sequence number (below).
          result_of[rid] = result_of[rid] or (stored[rid] and stored_queued(qtys[i], '', users[i])) or i
          new_idem[#new_idem + 1] = idem
          new_idem[#new_idem + 1] = idem_value(rid, fps[i])
        end
        -- A client retry of this same request id must not count it twice.
        if not stored[rid] then
          stored[rid] = true
          new_results[n_results + 1], new_results[n_results + 2] = rid, i
          n_results = n_results + 2
          admitted = admitted + 1
          if g then
            spent[g.key] = g.holder
            spends[#spends + 1] = g
          end
        end
      end
    end
  end
  reply[2 * i - 1], reply[2 * i] = code, value
end

-- Sequence numbers in batch order, one HINCRBY for the batch; the markers
-- are completed here, and so are the replies that named one of them.
if admitted > 0 then
  local seq = redis.call('HINCRBY', KEYS[3], 'seq', admitted) - admitted
  local marker = {}
  for j = 2, n_results, 2 do
    local i = new_results[j]
    seq = seq + 1
    marker[i] = stored_queued(qtys[i], seq, users[i])
    new_results[j] = marker[i]
  end
  for i = 1, pending_named and n or 0 do
    local v = reply[2 * i]
    if reply[2 * i - 1] == 1 and type(v[2]) == 'number' then
      v[2] = marker[v[2]]
    end
  end
end

hset_chunks(KEYS[2], new_idem)
hset_chunks(KEYS[1], new_results)
if admitted > 0 then
  redis.call('HINCRBY', KEYS[3], 'admitted', admitted)
  local ids = {}
  for j = 1, n_results, 2 do
    ids[#ids + 1] = new_results[j]
  end
  redis.call('ZADD', KEYS[9], unix_ms(t), table.concat(ids, ' '))
end
-- A challenge key lives no longer than its challenge could be used: nothing
-- needs to remove it.
for _, g in ipairs(spends) do
  redis.call('SET', g.key, g.holder, 'EXAT', g.exat)
end
-- Number arguments keep full precision (tostring would round to 14 digits).
local user_tats = {}
for subject in pairs(moved) do
  if subject == '' then
    redis.call('SET', KEYS[5], tats[''], 'EX', math.max(math.ceil(tats[''] - now), 1))
  else
    user_tats[#user_tats + 1] = subject
    user_tats[#user_tats + 1] = tats[subject]
  end
end
hset_chunks(KEYS[6], user_tats)
local moved_ips = {}
for ip in pairs(ip_moved) do
  moved_ips[#moved_ips + 1] = ip
  moved_ips[#moved_ips + 1] = ip_tats[ip]
end
hset_chunks(KEYS[7], moved_ips)
-- The keys written may be new: they expire with the campaign's other keys.
local written = {}
if #new_results > 0 then written[#written + 1] = KEYS[1]; written[#written + 1] = KEYS[9] end
if #new_idem > 0 then written[#written + 1] = KEYS[2] end
if #user_tats > 0 then written[#written + 1] = KEYS[6] end
if #moved_ips > 0 then written[#written + 1] = KEYS[7] end
if #written > 0 then
  expire_with_campaign(redis.call('HGET', KEYS[8], 'expire_at'), unpack(written))
end
return reply
