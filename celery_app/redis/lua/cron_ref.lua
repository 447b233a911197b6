-- Read each task's reference instant (Keys.cron_ref), setting it where no beat has: the first
-- instant a beat saw the task with this schedule. A task that fired before any reference was
-- kept for it (its stats have a last window, no reference fingerprint: a deployment that
-- predates references) gets "0", the Unix epoch: it keeps catching up within its grace and its
-- interval keeps the epoch's phase, as before. A task whose schedule changed (another
-- fingerprint recorded) starts afresh at ARGV[1], as a new one.
-- KEYS: 2 per task: reference key, stats hash (Keys.cron_ref, cron_stats).
-- ARGV: 1 now (Unix s, whole), then 1 per task: its schedule fingerprint.
-- Returns the reference of each task, in order, as stored.
local now = ARGV[1]
local out = {}
for i = 0, #KEYS / 2 - 1 do
  local ref, stats = KEYS[2*i+1], KEYS[2*i+2]
  local value = redis.call('GET', ref)
  if not value then
    value = now
    if not redis.call('HGET', stats, CRON_STATS.REF_FINGERPRINT)
        and redis.call('HEXISTS', stats, CRON_STATS.LAST_WINDOW) == 1 then
      value = '0'
    end
    redis.call('SET', ref, value)
    redis.call('HSET', stats, CRON_STATS.REF_FINGERPRINT, ARGV[2+i])
  end
  out[i+1] = value
end
return out
