-- Finish one run of a job: the single write after a run, by the worker or by the reaper.
-- KEYS: 1 job hash, 2 due zset, 3 leases fast, 4 leases slow, 5 results stream, 6 last-result hash
-- ARGV: 1 lease token, 2 cost_ewma_ms, 3 delay_ewma_ms, 4 effective_scheduled_at, 5 lane,
--       6 next scheduled_at, 7 result JSON ('' = none), 8 region, 9 results maxlen, 10 job id
-- Health (optional: no ARGV 11, or '', skips it; the check's state, tests/test_health_state.py):
-- KEYS: 7 check state hash, 8 check transitions stream, 9 tenant transitions stream,
--       10 transition outbox, 11 transition payloads, 12 maintenance held zset,
--       12 + i the job hash of the check's i-th region (ARGV 21)
-- ARGV: 11 region state, 12 streak state, 13 streak, 14 quorum, 15 maintenance window end
--       ('' = not in a window), 16 now, 17 check transitions maxlen, 18 tenant transitions
--       maxlen, 19 tenant, 20 uid, 21 the check's regions, comma list
-- Guard (optional: no ARGV 22, or '', skips it; a write planned from what the run read when it
-- started, celery_app.checks.jobs.ReadGuard): ARGV 22 the job's HLEN then, 23 its field names
-- (space-separated, the lease's excepted), 24 their values then ('<length> <value>'...), 25 the
-- maintenance version then ('' = unset); KEYS[#KEYS] the maintenance version key. ARGV 11-21
-- are then given too ('' in ARGV 11 still skips the health part).
-- Returns 0 when the lease is no longer ours (reaped, deleted, re-claimed): the same token can
-- complete a job at most once; -1 when the guard found the job or the maintenance windows
-- changed since the run read them (nothing written: read again, plan again); else the id of
-- the transition this run made, or 1.
--#include transition
--#include job_unchanged
local current = redis.call('HGET', KEYS[1], JOB.LEASE_TOKEN)
if (not current) or current ~= ARGV[1] then
  return 0
end
if (ARGV[22] or '') ~= '' then
  if not job_unchanged(KEYS[1], ARGV[22], ARGV[23], ARGV[24])
      or (redis.call('GET', KEYS[#KEYS]) or '') ~= ARGV[25] then
    return -1
  end
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
if (ARGV[11] or '') == '' then return 1 end

-- The region's state (decided in Python: scheduling_core.health.region_step), then the check's
-- from the quorum of its regions (scheduling_core.health.overall_state).
redis.call('HSET', KEYS[1], JOB.HEALTH, ARGV[11], JOB.STREAK_STATE, ARGV[12], JOB.STREAK, ARGV[13])
local regions = split_commas(ARGV[21])
local jobs = {}
local down, bad = 0, 0
for i = 1, #regions do
  jobs[i] = KEYS[12 + i]
  local st = redis.call('HGET', jobs[i], JOB.HEALTH) or STATE.UP
  if st == STATE.DOWN then
    down = down + 1
    bad = bad + 1
  elseif st == STATE.DEGRADED then
    bad = bad + 1
  end
end
local quorum = tonumber(ARGV[14])
local observed = STATE.UP
if down >= quorum then
  observed = STATE.DOWN
elseif bad >= quorum then
  observed = STATE.DEGRADED
end
redis.call('HSET', KEYS[7], CHECK_STATE.OBSERVED, observed)
local announced = redis.call('HGET', KEYS[7], CHECK_STATE.STATE) or STATE.UP
local was_held = redis.call('HEXISTS', KEYS[7], CHECK_STATE.HELD_UNTIL) == 1
if observed == announced then
  if was_held then
    redis.call('HDEL', KEYS[7], CHECK_STATE.HELD_UNTIL)
    redis.call('ZREM', KEYS[12], ARGV[20])
  end
  return 1
end
if ARGV[15] ~= '' then
  -- Inside a maintenance window: hold the change; beat delivers it at the window's end if the
  -- state still differs then (transition_release.lua).
  redis.call('HSET', KEYS[7], CHECK_STATE.HELD_UNTIL, ARGV[15])
  redis.call('ZADD', KEYS[12], ARGV[15], ARGV[20])
  return 1
end
redis.call('ZREM', KEYS[12], ARGV[20])
return make_transition({
  state = KEYS[7], check_stream = KEYS[8], tenant_stream = KEYS[9], outbox = KEYS[10],
  payloads = KEYS[11], last = KEYS[6], jobs = jobs, regions = regions, uid = ARGV[20],
  tenant = ARGV[19], from = announced, to = observed, now = ARGV[16], check_maxlen = ARGV[17],
  tenant_maxlen = ARGV[18], held = was_held,
})
