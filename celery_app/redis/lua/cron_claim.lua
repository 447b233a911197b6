-- Claim one window for a chunk of (task, tenant) entries: per entry, the one caller (beat
-- replica or run-now) whose SET NX wins the window key fires it; every other caller gets TAKEN.
-- A singleton whose previous run still holds its in-flight key consumes the window as skipped.
-- A window older than the last one its (task, tenant) handled (for a singleton: not newer) is
-- TAKEN: a beat whose clock stepped back must not fire it again once its window key expired.
-- A custom entry (a schedule without a fixed grid) names its window by the task's shared last
-- run: it fires only while that last run is still the one the caller read (another beat has
-- not fired it meanwhile), and firing moves the last run to now, atomically with the window key.
-- KEYS: 5 per entry: window key, in-flight key, state hash, stats hash, reference key
--       (Keys.cron_window, cron_inflight, cron_state, cron_stats, cron_ref); a mark entry only
--       touches its stats hash.
-- ARGV: 1 window start (Unix s), 2 window id, 3 now (Unix s), 4 owner, 5 manual ("1" / "0"),
--       6 window key TTL ms, 7 the window key value of a skipped window; then 1 per entry:
--       "<kind>:<in-flight TTL ms>", kind a
--       CRON_CLAIM_KIND (e.g. "S:305000"); a custom entry: "C:<the last run the caller read>".
-- Returns ONE string, the CRON_CLAIM code (a digit) of each entry in order: one bulk reply
-- parses far faster than one per entry.
local wts, wid, now, owner, manual, winttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local skipped_by = ARGV[7]
-- Read once: this loop runs for every entry of a window (thousands).
local sub = string.sub
local wts_n = tonumber(wts)
local FIRE, TAKEN, IN_FLIGHT, MARKED = CRON_CLAIM.FIRE, CRON_CLAIM.TAKEN, CRON_CLAIM.IN_FLIGHT,
  CRON_CLAIM.MARKED
local MARK, CUSTOM, SINGLETON, OVERLAP = CRON_CLAIM_KIND.MARK, CRON_CLAIM_KIND.CUSTOM,
  CRON_CLAIM_KIND.SINGLETON, CRON_CLAIM_KIND.OVERLAP
local S_LAST_WINDOW, S_LAST_SENT_AT, S_MANUAL, S_FIRED = CRON_STATE.LAST_WINDOW,
  CRON_STATE.LAST_SENT_AT, CRON_STATE.MANUAL, CRON_STATE.FIRED
local T_FIRED, T_LAST_WINDOW = CRON_STATS.FIRED, CRON_STATS.LAST_WINDOW
local out = {}
for i = 0, #KEYS / 5 - 1 do
  local k = 5 * i
  local win, infl, state, stats, ref = KEYS[k+1], KEYS[k+2], KEYS[k+3], KEYS[k+4], KEYS[k+5]
  local spec = ARGV[8+i]
  local kind = sub(spec, 1, 1)
  local code = FIRE
  if kind == MARK then
    code = MARKED
  elseif kind == CUSTOM then
    if redis.call('GET', ref) == sub(spec, 3)
        and redis.call('SET', win, owner, 'NX', 'PX', winttl) then
      redis.call('SET', ref, now)
      redis.call('HSET', state, S_LAST_WINDOW, wts, S_LAST_SENT_AT, now, S_MANUAL, manual)
      redis.call('HINCRBY', state, S_FIRED, 1)
      redis.call('HINCRBY', stats, T_FIRED, 1)
    else
      code = TAKEN
    end
  else
    local keyed = kind == SINGLETON or kind == OVERLAP
    local last = tonumber(redis.call('HGET', state, S_LAST_WINDOW) or '0')
    local stale = last > wts_n or (keyed and last == wts_n)
    if stale then
      code = TAKEN
    elseif keyed then
      if redis.call('SET', win, owner, 'NX', 'PX', winttl) then
        if kind == SINGLETON and not redis.call('SET', infl, wid, 'NX', 'PX', sub(spec, 3)) then
          code = IN_FLIGHT
          redis.call('SET', win, skipped_by, 'PX', winttl)
        end
      else
        code = TAKEN
      end
    end
    if code == FIRE then
      redis.call('HSET', state, S_LAST_WINDOW, wts, S_LAST_SENT_AT, now, S_MANUAL, manual)
      redis.call('HINCRBY', state, S_FIRED, 1)
      redis.call('HINCRBY', stats, T_FIRED, 1)
    elseif code == IN_FLIGHT then
      redis.call('HSET', state, S_LAST_WINDOW, wts, CRON_STATE.LAST_SKIP_WINDOW, wts,
           CRON_STATE.LAST_SKIP_REASON, CRON_SKIP.IN_FLIGHT)
      redis.call('HINCRBY', state, CRON_STATE.SKIPPED, 1)
      redis.call('HINCRBY', stats, CRON_STATS.SKIPPED, 1)
    end
  end
  -- Windows of one task are claimed in order, so this only moves forward.
  if code ~= TAKEN then redis.call('HSET', stats, T_LAST_WINDOW, wts) end
  out[i+1] = code
end
return table.concat(out)
