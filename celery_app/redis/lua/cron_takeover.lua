-- Take over one claim whose lease ended unconfirmed (its claimer died or stalled between taking
-- window keys and publishing): compare-and-set on the lease, so of all beats that saw it
-- expire exactly one wins and publishes it.
-- KEYS: 1 pending hash, 2 lease ZSET (Keys.cron_pending, cron_pending_lease)
-- ARGV: 1 claim id, 2 now (Unix s), 3 the taker's lease end (Unix s)
-- Returns the claim's JSON record when this caller won, else false.
local batch, now = ARGV[1], tonumber(ARGV[2])
local lease = redis.call('ZSCORE', KEYS[2], batch)
if not lease or tonumber(lease) > now then return false end
local record = redis.call('HGET', KEYS[1], batch)
if not record then
  redis.call('ZREM', KEYS[2], batch)
  return false
end
redis.call('ZADD', KEYS[2], ARGV[3], batch)
return record
