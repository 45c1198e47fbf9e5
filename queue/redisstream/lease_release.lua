-- lease_release.lua deletes a partition lease, but only for its holder
-- (compare-and-delete on the lease value), so a consumer that lost its lease
-- cannot free the partition under the new holder.
--
-- KEYS[1]  lease key, fsq:{<topic>:<partition>}:lease
-- ARGV[1]  the caller's lease value, "<owner>#<token>"
--
-- Replies:
--   1  released
--   0  not released: the lease expired or belongs to another tenure
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
