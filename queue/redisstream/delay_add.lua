-- delay_add.lua schedules messages of one partition: each becomes a member of
-- the partition's delayed set, scored by its due time in ms on Redis's clock
-- (so publishers' clocks do not matter), rounded up so it is never early.
-- A member is "<seq>:<len(id)>:<len(key)>:<id><key><body>": seq, from the
-- partition's counter and 16 digits wide, keeps members unique and orders
-- those due in the same ms by publish; the lengths delimit the fields
-- whatever bytes they hold. delay_move.lua reads this format.
--
-- KEYS[1]  delayed set, fsq:{<topic>:<partition>}:delayed
-- KEYS[2]  its counter, fsq:{<topic>:<partition>}:delayseq (never expires)
-- ARGV[1]  delay in ms, > 0
-- ARGV[2..] id, key and body of each message, in publish order
--
-- Reply: the number of messages scheduled.
local n = (#ARGV - 1) / 3
local t = redis.call('TIME')
local due = string.format('%d', tonumber(t[1]) * 1000 + math.ceil(tonumber(t[2]) / 1000) + tonumber(ARGV[1]))
local seq = redis.call('INCRBY', KEYS[2], n) - n
for i = 0, n - 1 do
  local id, key, body = ARGV[2 + 3 * i], ARGV[3 + 3 * i], ARGV[4 + 3 * i]
  seq = seq + 1
  redis.call('ZADD', KEYS[1], due,
    string.format('%016d', seq) .. ':' .. #id .. ':' .. #key .. ':' .. id .. key .. body)
end
return n
