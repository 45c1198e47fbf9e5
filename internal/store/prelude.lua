-- prelude.lua: what the store's scripts share, a helper per paragraph.
-- scripts.go puts before every script the helpers it calls (each is a
-- closure made at every call of the script, so it gets no other), then
-- admit.go's ARGV positions for admit.lua: they are locals of the script's
-- chunk, and a script must not declare a local of the same name
-- (TestPreludeNames). Not a script of its own.

-- The stored result, a request's value in a results hash:
-- "status|qty|order_id|reason|user", the user id last since it may hold
-- '|'. A queued marker (admit.lua) keeps its admission sequence number in
-- the reason field, a success its decision number (deduct.lua; '' when
-- durable by definition, see stored_shown). Go's storedResult (stored.go)
-- is the same codec; TestStoredFormat pins both to the same strings.
local function stored_result(status, qty, order, reason, user)
  return status .. '|' .. qty .. '|' .. order .. '|' .. reason .. '|' .. user
end

local function stored_queued(qty, seq, user)
  return 'queued|' .. qty .. '||' .. seq .. '|' .. user
end

-- parse_stored splits a stored result: status, qty, order id, reason and,
-- for a queued marker, its sequence number (nil when it has none; its
-- reason is then ''). All nil when v is malformed. The user id is
-- stored_user's: most callers have it already, and a string read is a
-- string made.
local function parse_stored(v)
  local status, qty, order, reason = string.match(v, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|')
  if status == 'queued' then
    return status, qty, order, '', tonumber(reason)
  end
  return status, qty, order, reason, nil
end

local function stored_user(v)
  return string.match(v, '^[^|]*|[^|]*|[^|]*|[^|]*|(.*)$')
end

-- stored_shown is stored result v as a shopper may see it while its tag's
-- durable mark (counters durable, durable.lua) is durable: a success
-- decided after the mark is still queued, with no order id, since its
-- order may not be in MySQL yet. Go's storedResult.shown is the same.
local function stored_shown(v, durable)
  local made = string.match(v, '^success|[^|]*|[^|]*|([^|]*)|')
  if made and made ~= '' and tonumber(made) > durable then
    local qty = string.match(v, '^[^|]*|([^|]*)|')
    return stored_queued(qty, '', stored_user(v))
  end
  return v
end

-- is_queued says whether a stored result is a queued marker: not final yet.
local function is_queued(v)
  return string.sub(v, 1, 7) == 'queued|'
end

-- An Idempotency-Key's value in an idem hash: "<request id>|<fingerprint>",
-- or a bare request id, written before fingerprints, which matches any
-- (fingerprint false). admit.go's parseIdemValue reads it in Go.
local function idem_value(rid, fp)
  return rid .. '|' .. fp
end

local function parse_idem(v)
  local sep = string.find(v, '|', 1, true)
  if sep then
    return string.sub(v, 1, sep - 1), string.sub(v, sep + 1)
  end
  return v, false
end

-- loaded_epoch is the epoch of a campaign (or bucket) whose meta hash was
-- read as { stock, epoch, ... }: nil when it is not loaded, 0 when it was
-- loaded before epochs existed.
local function loaded_epoch(meta)
  if meta[1] then
    return tonumber(meta[2] or '0')
  end
  return nil
end

-- expire_with_campaign gives the keys a script wrote, which may be new,
-- the lifetime of the campaign's other keys: at, its meta's expire_at
-- (rebuild.lua), false or nil when it has none.
local function expire_with_campaign(at, ...)
  if at then
    for i = 1, select('#', ...) do
      redis.call('EXPIREAT', (select(i, ...)), at)
    end
  end
end

-- hset_chunks writes the field/value pairs list[from..to] (all of list by
-- default) into hash key, in chunks that stay clear of Lua's unpack limit.
local function hset_chunks(key, list, from, to)
  from, to = from or 1, to or #list
  for j = from, to, 4000 do
    redis.call('HSET', key, unpack(list, j, math.min(j + 3999, to)))
  end
end

-- unix_ms is a reply of TIME in Unix milliseconds.
local function unix_ms(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end


-- read_marks reads the queue's line from a tag's counters hash (key):
-- decided, seq, passed_ms, and the marks notenqueued.lua keeps (every
-- request numbered above a mark's seq was admitted after its ms), each as
-- { seq, ms, field }. A mark with a seq below decided is passed, whether
-- or not a sweep has confirmed it into passed_ms yet.
local function read_marks(key)
  local decided, seq, passed, marks = 0, 0, 0, {}
  local counters = redis.call('HGETALL', key)
  for i = 1, #counters, 2 do
    local f, v = counters[i], tonumber(counters[i + 1])
    local s = string.match(f, '^mark:(%d+)$')
    if f == 'decided' then
      decided = v
    elseif f == 'seq' then
      seq = v
    elseif f == 'passed_ms' then
      passed = v
    elseif s then
      marks[#marks + 1] = { tonumber(s), v, f }
    end
  end
  return decided, seq, passed, marks
end
