-- soldout.lua: the own sold-out flag of a campaign of several buckets (the
-- one gateways read), which no script on a bucket can set atomically with
-- the buckets' units: they live on other slots. A unit given back to any
-- bucket bumps the campaign's returns counter here after its units are in
-- (down); a worker that scanned every bucket empty sets the flag only if
-- the counter still holds what it read before that scan (up). So a return
-- the scan did not see, once done, keeps the flag down: the flag goes up
-- only while every unit the scan missed is still on its way, and that
-- return's own down then takes it off.
--
-- KEYS[1] soldout   the campaign's own flag
-- KEYS[2] meta      the campaign's own meta hash: expire_at, returns
-- ARGV[1] up | down
-- ARGV[2] (up) the returns counter as read before the scan ("" = none)
--
-- Reply: up: 1 the flag is up, 0 refused (a return came since);
--        down: 1

local returns = redis.call('HGET', KEYS[2], 'returns') or ''
if ARGV[1] == 'down' then
  -- Only a loaded campaign has a counter (a missing meta is not created).
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HINCRBY', KEYS[2], 'returns', 1)
  end
  redis.call('DEL', KEYS[1])
  return 1
end
if returns ~= ARGV[2] then
  return 0
end
if redis.call('SET', KEYS[1], '1', 'NX') then
  -- New: it expires with the campaign's other keys.
  expire_with_campaign(redis.call('HGET', KEYS[2], 'expire_at'), KEYS[1])
end
return 1
