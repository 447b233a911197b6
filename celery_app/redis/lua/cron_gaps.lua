-- Record windows nobody fired, as gap records for diagnose. A gap is recorded only if no caller
-- handled a window of the task since (another replica may have fired it), and only once.
-- KEYS: 1 gaps list (Keys.cron_gaps); then one stats hash per gap (Keys.cron_stats)
-- ARGV: 1 now (Unix s), 2 detector, 3 records kept; then 3 per gap: task id, from, to (Unix s)
-- Returns how many gaps were new.
local recorded = 0
for i = 2, #KEYS do
  local task, from, to = ARGV[3*i-2], ARGV[3*i-1], ARGV[3*i]
  local last = tonumber(redis.call('HGET', KEYS[i], CRON_STATS.LAST_WINDOW) or '0')
  local gap_to = tonumber(redis.call('HGET', KEYS[i], CRON_STATS.LAST_GAP_TO) or '0')
  if last < tonumber(from) and gap_to < tonumber(to) then
    redis.call('LPUSH', KEYS[1], cjson.encode({
      [CRON_GAP.TASK] = task,
      [CRON_GAP.FROM] = tonumber(from),
      [CRON_GAP.TO] = tonumber(to),
      [CRON_GAP.DETECTED_AT] = tonumber(ARGV[1]),
      [CRON_GAP.DETECTOR] = ARGV[2],
    }))
    redis.call('HSET', KEYS[i], CRON_STATS.LAST_GAP_FROM, from, CRON_STATS.LAST_GAP_TO, to)
    recorded = recorded + 1
  end
end
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
return recorded
