-- restore.lua: release a campaign's restore lock (Store.LockRestore) for
-- its holder only: a holder that outlived the lock's TTL must not release
-- the lock another process took since.
--
-- KEYS[1] the restore lock
-- ARGV[1] the holder's token
--
-- Reply: 1 released; 0 nothing changed: the lock is not that token's (it
--        expired, and maybe another holder has it now)

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
