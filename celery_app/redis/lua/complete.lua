-- Complete one run of a job: the single write after a run, by the worker or by the reaper.
-- Its call site is celery_app.checks.completion.CompleteCall, which owns KEYS and ARGV.
-- KEYS: 1 job hash, 2 due zset, 3 leases fast, 4 leases slow, 5 results stream,
--       6 last-result hash, 7 maintenance version; with a plan.health only: 8 check state hash,
--       9 check transitions stream, 10 tenant transitions stream, 11 transition outbox,
--       12 transition payloads, 13 maintenance held zset,
--       13 + i the job hash of the check's i-th region (plan.health.regions)
-- ARGV: 1 the plan, JSON: {id, token, cost, delay, ea, lane, sa (next tick), region, maxlen,
--       record (the result's JSON, absent = none),
--       health (absent = the check's state is not moved): {state, streak_state, streak, quorum,
--         hold_until (a maintenance window's end, absent = none), now, check_maxlen, tenant_maxlen,
--         tenant, uid, regions (list)},
--       guard (absent = unguarded; a write planned from what the run read when it started,
--         celery_app.checks.completion.ReadGuard): {count (the job's field count then),
--         fields {name: value} (every field but the lease's), maintenance (version then, '' =
--         unset)}}
-- Returns {0} when the lease is no longer ours (reaped, deleted, re-claimed): a token completes
-- a job at most once; {-1} when the guard found the job or the maintenance windows changed
-- since the run read them (nothing written: read again, plan again); else {1, the id of the
-- transition this run made or ''}.
--
-- Why one HGETALL: the lease check, the guard, the run count, the disabled flag and the
-- region's previous state all come from the one read. Why the quorum part only runs when the
-- region's state moved, a maintenance window holds a change back, or the quorum or the regions
-- changed since the check's state was last counted (CHECK_STATE.BASIS): the check's observed
-- state is a function of those, so a run that moves none cannot move it.
--#include transition
local plan = cjson.decode(ARGV[1])
local flat = redis.call('HGETALL', KEYS[1])
local job, count = {}, 0
for i = 1, #flat, 2 do
  job[flat[i]] = flat[i + 1]
  count = count + 1
end
if job[JOB.LEASE_TOKEN] ~= plan.token then return {0} end
local guard = plan.guard
if guard then
  local lease_fields = (job[JOB.LEASE_EXPIRY] and 1 or 0) + 1
  if count - lease_fields ~= guard.count then return {-1} end
  for name, value in pairs(guard.fields) do
    if job[name] ~= value then return {-1} end
  end
  if (redis.call('GET', KEYS[7]) or '') ~= guard.maintenance then return {-1} end
end
local runs = tonumber(job[JOB.RUNS] or '0')
if not runs or runs ~= math.floor(runs) or runs < 0 or runs > 1e15 then
  return redis.error_reply('torn job field ' .. JOB.RUNS)
end
local id = plan.id
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
local health = plan.health
local fields = {JOB.COST_EWMA_MS, plan.cost, JOB.DELAY_EWMA_MS, plan.delay, JOB.EFFECTIVE_AT,
  plan.ea, JOB.LANE, plan.lane, JOB.SCHEDULED_AT, plan.sa, JOB.RUNS, string.format('%d', runs + 1)}
if health then
  fields[#fields + 1] = JOB.HEALTH
  fields[#fields + 1] = health.state
  fields[#fields + 1] = JOB.STREAK_STATE
  fields[#fields + 1] = health.streak_state
  fields[#fields + 1] = JOB.STREAK
  fields[#fields + 1] = health.streak
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HDEL', KEYS[1], JOB.LEASE_TOKEN, JOB.LEASE_EXPIRY)
if not job[JOB.DISABLED] then
  redis.call('ZADD', KEYS[2], plan.sa, id)
end
if plan.record then
  redis.call('XADD', KEYS[5], 'MAXLEN', plan.maxlen, '*', RESULT.REGION, plan.region,
    RESULT.RECORD, plan.record)
  redis.call('HSET', KEYS[6], plan.region, plan.record)
end
if not health then return {1, ''} end
local basis = health.quorum .. '|' .. table.concat(health.regions, ',')
if (job[JOB.HEALTH] or STATE.UP) == health.state then
  local seen = redis.call('HMGET', KEYS[8], CHECK_STATE.HELD_UNTIL, CHECK_STATE.BASIS)
  if not seen[1] and seen[2] == basis then return {1, ''} end
end

-- The region's state moved (decided in Python: scheduling_core.health.region_step), a held
-- change may be due, or the basis changed: the check's state from the quorum of its regions
-- (scheduling_core.health.overall_state).
local regions = health.regions
local jobs = {}
local down, bad = 0, 0
for i = 1, #regions do
  jobs[i] = KEYS[13 + i]
  local st
  if jobs[i] == KEYS[1] then st = health.state
  else st = redis.call('HGET', jobs[i], JOB.HEALTH) or STATE.UP end
  if st == STATE.DOWN then
    down = down + 1
    bad = bad + 1
  elseif st == STATE.DEGRADED then
    bad = bad + 1
  end
end
local quorum = tonumber(health.quorum)
local observed = STATE.UP
if down >= quorum then
  observed = STATE.DOWN
elseif bad >= quorum then
  observed = STATE.DEGRADED
end
redis.call('HSET', KEYS[8], CHECK_STATE.OBSERVED, observed, CHECK_STATE.BASIS, basis)
local announced = redis.call('HGET', KEYS[8], CHECK_STATE.STATE) or STATE.UP
local was_held = redis.call('HEXISTS', KEYS[8], CHECK_STATE.HELD_UNTIL) == 1
if observed == announced then
  if was_held then
    redis.call('HDEL', KEYS[8], CHECK_STATE.HELD_UNTIL)
    redis.call('ZREM', KEYS[13], health.uid)
  end
  return {1, ''}
end
if health.hold_until then
  -- Inside a maintenance window: hold the change; beat delivers it at the window's end if the
  -- state still differs then (transition_release.lua).
  redis.call('HSET', KEYS[8], CHECK_STATE.HELD_UNTIL, health.hold_until)
  redis.call('ZADD', KEYS[13], health.hold_until, health.uid)
  return {1, ''}
end
redis.call('ZREM', KEYS[13], health.uid)
return {1, make_transition({
  state = KEYS[8], check_stream = KEYS[9], tenant_stream = KEYS[10], outbox = KEYS[11],
  payloads = KEYS[12], last = KEYS[6], jobs = jobs, regions = regions, uid = health.uid,
  tenant = health.tenant, from = announced, to = observed, now = health.now,
  check_maxlen = health.check_maxlen, tenant_maxlen = health.tenant_maxlen, held = was_held,
})}
