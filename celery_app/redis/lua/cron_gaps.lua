-- Record windows nobody fired, as gap records for diagnose: one range record per task (and per
-- tenant of a per-tenant task) covering every missed window. A range is recorded only if no
-- caller handled a window of the task since (another replica may have fired it), and only once:
-- a range overlapping one recorded before (another beat found the same stall) keeps only its
-- windows after that record.
-- KEYS: 1 gaps list (Keys.cron_gaps); then one stats hash per gap (Keys.cron_stats)
-- ARGV: 1 now (Unix s), 2 detector, 3 records kept; then 8 per gap: task id, from, to (Unix s),
--       count (0: unknown), period (s between its windows, 0: uneven), tenants (JSON list, []:
--       the task record), note (empty for none), if seen ("1": only if the task has a handled
--       window, so a first start's catch-up window is not a loss)
-- Returns how many gaps were new.
local recorded = 0
local now, detector = tonumber(ARGV[1]), ARGV[2]
for i = 2, #KEYS do
  local at = 8 * (i - 2) + 3
  local task, from, to = ARGV[at+1], tonumber(ARGV[at+2]), tonumber(ARGV[at+3])
  local count, period = tonumber(ARGV[at+4]), tonumber(ARGV[at+5])
  local tenants, note = cjson.decode(ARGV[at+6]), ARGV[at+7]
  local last = tonumber(redis.call('HGET', KEYS[i], CRON_STATS.LAST_WINDOW) or '0')
  local gap_to = tonumber(redis.call('HGET', KEYS[i], CRON_STATS.LAST_GAP_TO) or '0')
  local unseen = ARGV[at+8] == '1' and last == 0
  if last < from and gap_to < to and not unseen then
    if gap_to > from then
      if period > 0 and count > 0 then
        local skip = math.ceil((gap_to - from) / period)
        from, count = from + skip * period, count - skip
      else
        from, count = gap_to, 0
      end
    end
    if from < to then
      local record = {
        [CRON_GAP.TASK] = task,
        [CRON_GAP.FROM] = from,
        [CRON_GAP.TO] = to,
        [CRON_GAP.DETECTED_AT] = now,
        [CRON_GAP.DETECTOR] = detector,
      }
      if count > 0 then record[CRON_GAP.COUNT] = count end
      if note ~= '' then record[CRON_GAP.NOTE] = note end
      if #tenants == 0 then
        redis.call('LPUSH', KEYS[1], cjson.encode(record))
      else
        for _, tenant in ipairs(tenants) do
          record[CRON_GAP.TENANT] = tenant
          redis.call('LPUSH', KEYS[1], cjson.encode(record))
        end
      end
      redis.call('HSET', KEYS[i], CRON_STATS.LAST_GAP_FROM, from, CRON_STATS.LAST_GAP_TO, to)
      recorded = recorded + 1
    end
  end
end
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
return recorded
