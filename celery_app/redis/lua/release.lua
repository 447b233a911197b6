-- Undo one claim whose message could not be published: lease dropped and, unless the check was
-- disabled meanwhile, back into the ready index at its effective deadline; only if the lease
-- token is still ours. A disabled job stays out of every index (enabling places it again).
-- KEYS: 1 job hash, 2 leases zset of its lane, 3 ready zset of its lane
-- ARGV: 1 lease token, 2 job id
if redis.call('HGET', KEYS[1], JOB.LEASE_TOKEN) ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], JOB.LEASE_TOKEN, JOB.LEASE_EXPIRY)
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('HEXISTS', KEYS[1], JOB.DISABLED) == 1 then return 1 end
redis.call('ZADD', KEYS[3], redis.call('HGET', KEYS[1], JOB.EFFECTIVE_AT), ARGV[2])
return 1
