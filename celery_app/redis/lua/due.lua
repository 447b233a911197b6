-- Read-only: the ids of up to ARGV[2] jobs due at ARGV[1] (score <= now), for the first phase
-- of a promote (celery_app.checks.claiming.promote_due).
-- KEYS: 1 due zset. ARGV: 1 now, 2 how many.
-- Returns ONE string, the job ids separated by '\n' (they hold no whitespace).
return table.concat(
  redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2])), '\n')
