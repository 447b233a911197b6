-- Abandon one run that raised before its probe (celery_app/checks/abandon.py): its lease
-- released and its job placed at its next tick, at once, instead of holding the slot until the
-- reaper; the tick it was claimed for is lost and counted in the job (JOB.ABANDONED), not run
-- again. Only while the lease token is this run's (a reaper, a completion or a second call that
-- got there first wins: nothing is written), and only if no other delivery of the lease started
-- (the run's started marker is absent or holds this run's Celery id: a start read that failed
-- after it set the marker is still this run's).
-- KEYS: 1 job hash, 2 due zset, 3 leases fast, 4 leases slow, 5 the run's started marker
--       (Keys.job, due, leases(region, 0), leases(region, 1), run_started)
-- ARGV: 1 lease token, 2 job id, 3 the run's Celery id, 4 next scheduled_at, 5 next
--       effective_scheduled_at (both Unix s, planned from the job and Redis's time by the caller),
--       6 the ticks between the abandoned one and the next, passed over (JOB.PASSED; 0 = none)
-- Returns 1 released and placed; 0 the lease is not this run's (nothing written); -1 another
-- delivery of the lease started (nothing written: its own completion, or the reaper, ends it).
if redis.call('HGET', KEYS[1], JOB.LEASE_TOKEN) ~= ARGV[1] then return 0 end
local started = redis.call('GET', KEYS[5])
if started and started ~= ARGV[3] then return -1 end
-- First the writes that can fail on a torn hash (a count not an integer): then nothing is.
local passed = tonumber(ARGV[6])
if passed > 0 then
  local before = redis.call('HGET', KEYS[1], JOB.PASSED)
  local count = tonumber(before or '0')
  if not count or count ~= math.floor(count) or count < 0 or count > 1e15 then
    return redis.error_reply('torn job field ' .. JOB.PASSED)
  end
end
redis.call('HINCRBY', KEYS[1], JOB.ABANDONED, 1)
if passed > 0 then redis.call('HINCRBY', KEYS[1], JOB.PASSED, passed) end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
redis.call('HDEL', KEYS[1], JOB.LEASE_TOKEN, JOB.LEASE_EXPIRY)
redis.call('HSET', KEYS[1], JOB.SCHEDULED_AT, ARGV[4], JOB.EFFECTIVE_AT, ARGV[5])
if redis.call('HEXISTS', KEYS[1], JOB.DISABLED) == 0 then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
end
return 1
