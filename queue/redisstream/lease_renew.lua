-- lease_renew.lua extends a partition lease, but only for its holder: a
-- consumer whose lease expired and was taken by another must not extend the
-- new holder's lease (compare-and-set on the lease value).
--
-- KEYS[1]  lease key, fsq:{<topic>:<partition>}:lease
-- ARGV[1]  the caller's lease value, "<owner>#<token>"
-- ARGV[2]  new TTL in milliseconds
--
-- Replies:
--   1  renewed: the caller holds the lease for ARGV[2] ms from now
--   0  not renewed: the lease expired or belongs to another tenure
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
