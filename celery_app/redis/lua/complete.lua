-- Finish one run of a job: the single write after a run, by the worker or by the reaper.
-- KEYS: 1 job hash, 2 due zset, 3 leases fast, 4 leases slow, 5 results stream, 6 last-result hash
-- ARGV: 1 lease token, 2 cost_ewma_ms, 3 delay_ewma_ms, 4 effective_scheduled_at, 5 lane,
--       6 next scheduled_at, 7 result JSON ('' = none), 8 region, 9 results maxlen, 10 job id
-- Returns 1 when written, 0 when the lease is no longer ours (reaped, deleted, re-claimed):
-- the same token can complete a job at most once.
local current = redis.call('HGET', KEYS[1], JOB.LEASE_TOKEN)
if (not current) or current ~= ARGV[1] then
  return 0
end
-- First the one write that can fail on a torn hash (runs not an integer): then nothing else is.
redis.call('HINCRBY', KEYS[1], JOB.RUNS, 1)
redis.call('ZREM', KEYS[3], ARGV[10])
redis.call('ZREM', KEYS[4], ARGV[10])
redis.call('HSET', KEYS[1], JOB.COST_EWMA_MS, ARGV[2], JOB.DELAY_EWMA_MS, ARGV[3],
  JOB.EFFECTIVE_AT, ARGV[4], JOB.LANE, ARGV[5], JOB.SCHEDULED_AT, ARGV[6])
redis.call('HDEL', KEYS[1], JOB.LEASE_TOKEN, JOB.LEASE_EXPIRY)
if redis.call('HEXISTS', KEYS[1], JOB.DISABLED) == 0 then
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[10])
end
if ARGV[7] ~= '' then
  redis.call('XADD', KEYS[5], 'MAXLEN', ARGV[9], '*', RESULT.REGION, ARGV[8],
    RESULT.RECORD, ARGV[7])
  redis.call('HSET', KEYS[6], ARGV[8], ARGV[7])
end
return 1
