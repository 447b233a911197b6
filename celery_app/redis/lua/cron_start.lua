-- The start of one cron run (the worker, before the task body): the first delivery of a window
-- to get here takes its run key and is recorded as running; any later delivery of the same
-- window (a takeover after a slow publish, a broker redelivery) is suppressed and counted.
-- A delivery that arrives before its window's start (beat fires CHECKBEAT_CRON_LEAD ahead)
-- writes nothing and is told how long to wait, on this server's clock: never the worker's.
-- KEYS: 1 run key, 2 state hash, 3 stats hash (Keys.cron_run, cron_state, cron_stats)
-- ARGV: 1 run key TTL ms, 2 Celery id, 3 window id, 4 now (Unix s), 5 manual ("1" / "0"),
--       6 not before (Unix ms, the window's start; "0": no wait)
-- Returns 1 when this delivery runs, a negative integer (minus the ms still to wait) when it is
-- early, else the Celery id of the delivery that ran first.
local ttl, celery_id, wid, now, manual = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local not_before = tonumber(ARGV[6] or '0')
if not_before > 0 then
  local t = redis.call('TIME')
  local server_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if server_ms < not_before then return server_ms - not_before end
end
if redis.call('SET', KEYS[1], celery_id, 'NX', 'PX', ttl) then
  redis.call('HSET', KEYS[2], CRON_STATE.OUTCOME, CRON_OUTCOME.RUNNING, CRON_STATE.LAST_START, now,
             CRON_STATE.LAST_RUN_WINDOW, wid, CRON_STATE.MANUAL, manual,
             CRON_STATE.CELERY_ID, celery_id)
  redis.call('HSET', KEYS[3], CRON_STATS.LAST_START, now)
  return 1
end
redis.call('HINCRBY', KEYS[2], CRON_STATE.SUPPRESSED, 1)
redis.call('HSET', KEYS[2], CRON_STATE.LAST_SUPPRESSED_AT, now)
redis.call('HINCRBY', KEYS[3], CRON_STATS.SUPPRESSED, 1)
return redis.call('GET', KEYS[1]) or ''
