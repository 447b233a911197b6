-- The end of one cron run (the worker's signals): record it and release the in-flight key if it
-- is still this run's window (a later run may hold it already).
-- KEYS: 1 in-flight key, 2 state hash, 3 stats hash, 4 failing index (Keys.cron_inflight,
--       cron_state, cron_stats, cron_failing)
-- ARGV: 1 window id, 2 outcome (CRON_OUTCOME), 3 now (Unix s), 4 error, 5 failing member
--       ("task|tenant"), 6 tenant
local wid, outcome, now, err, member, tenant = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if redis.call('GET', KEYS[1]) == wid then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[2], CRON_STATE.LAST_END, now, CRON_STATE.OUTCOME, outcome)
redis.call('HSET', KEYS[3], CRON_STATS.LAST_END, now, CRON_STATS.LAST_OUTCOME, outcome,
           CRON_STATS.LAST_TENANT, tenant)
if outcome == CRON_OUTCOME.SUCCESS then
  redis.call('HDEL', KEYS[4], member)
else
  redis.call('HSET', KEYS[2], CRON_STATE.LAST_ERROR, err, CRON_STATE.LAST_ERROR_AT, now)
  redis.call('HSET', KEYS[3], CRON_STATS.LAST_ERROR, err, CRON_STATS.LAST_ERROR_AT, now)
  redis.call('HINCRBY', KEYS[2], CRON_STATE.FAILED, 1)
  redis.call('HINCRBY', KEYS[3], CRON_STATS.FAILED, 1)
  redis.call('HSET', KEYS[4], member, err)
end
return 1
