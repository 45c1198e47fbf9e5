-- delay_move.lua moves a partition's due delayed messages into its stream, in
-- due order, as the entries Publish would have added. Reading, adding and
-- removing happen in one atomic step, so any number of consumers may run it
-- at once: each due message is moved exactly once. "Now" is Redis's clock,
-- the one delay_add.lua scored with. Members are those of delay_add.lua.
--
-- KEYS[1]  delayed set, fsq:{<topic>:<partition>}:delayed
-- KEYS[2]  the partition's stream, fsq:{<topic>:<partition>}
-- ARGV[1]  the most messages to move
--
-- Reply: the number of messages moved; fewer than ARGV[1] means none is
-- left due.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])
for _, m in ipairs(due) do
  local _, last, idlen, keylen = string.find(m, '^%d+:(%d+):(%d+):')
  local id = last + 1
  local key = id + tonumber(idlen)
  local body = key + tonumber(keylen)
  redis.call('XADD', KEYS[2], '*',
    'id', string.sub(m, id, key - 1), 'key', string.sub(m, key, body - 1), 'body', string.sub(m, body))
end
if #due > 0 then
  -- The lowest-ranked members are exactly those just moved.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #due - 1)
end
return #due
