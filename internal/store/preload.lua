-- preload.lua: load a campaign's stock, limit and window into Redis.
-- Loading the same values again is a no-op. Resetting a campaign whose sale has
-- started would hand out its stock a second time (oversell), so it is refused
-- unless forced.
--
-- KEYS[1] meta, KEYS[2] stock, KEYS[3] soldout, KEYS[4] counters,
-- KEYS[5] users, KEYS[6] results, KEYS[7] idem
-- ARGV[1] stock, ARGV[2] limit, ARGV[3] start_ms, ARGV[4] end_ms,
-- ARGV[5] now_ms, ARGV[6] force ("1" or "0")
--
-- Reply: 0 loaded (fresh or reset), 1 already loaded with these values (unchanged),
--        -1 refused: the loaded sale has started and force is not set

local meta = redis.call('HMGET', KEYS[1], 'stock', 'limit', 'start_ms', 'end_ms')
if meta[1] then
  if meta[1] == ARGV[1] and meta[2] == ARGV[2] and meta[3] == ARGV[3] and meta[4] == ARGV[4] then
    return 1
  end
  if tonumber(meta[3]) <= tonumber(ARGV[5]) and ARGV[6] ~= '1' then
    return -1
  end
end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('SET', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'limit', ARGV[2], 'start_ms', ARGV[3], 'end_ms', ARGV[4])
return 0
