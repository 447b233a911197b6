-- Complete one run of a job: the single write after a run, by the worker or by the reaper.
-- Its call site is celery_app.checks.completion.CompleteCall, which owns KEYS and ARGV.
-- KEYS: 1 job hash, 2 due zset, 3 leases fast, 4 leases slow, 5 results stream,
--       6 last-result hash, 7 maintenance version;
--       with a plan.handoff, from H = 8: H the worker's hash (Keys.worker), H+1 ready fast,
--       H+2 ready slow (of the job's region), H+3 the region's held tenants, H+4 the
--       rate-limited tenants;
--       with a plan.health, from S (8, or 13 after the hand-off's): S check state hash,
--       S+1 check transitions stream, S+2 tenant transitions stream, S+3 transition outbox,
--       S+4 transition payloads, S+5 maintenance held zset,
--       S+5+i the job hash of the check's i-th region (plan.health.regions)
-- ARGV: 1 the plan, JSON: {id, token, cost, delay, ea, lane, sa (next tick), region, maxlen,
--       passed (absent = 0: the ticks between the run's and the next one, passed over because
--         the run ended late; added to JOB.PASSED),
--       record (the result's JSON, absent = none),
--       health (absent = the check's state is not moved): {state, streak_state, streak, quorum,
--         hold_until (a maintenance window's end, absent = none), now, check_maxlen, tenant_maxlen,
--         tenant, uid, regions (list)},
--       guard (absent = unguarded; a write planned from what the run read when it started,
--         celery_app.checks.completion.ReadGuard): {count (the job's field count then),
--         fields {name: value} (every field but the lease's), maintenance (the version planned
--         with, '' = unset: compared only when the run counts the check's state)},
--       lease_lane (absent = unknown): the lane whose lease index holds the lease,
--       run_ended (absent = no): a heartbeat's success or fail ping ended the run its start
--         ping began (JOB.HEARTBEAT_STARTED is removed: a later ping is not timed from it),
--       handoff (absent = none; a worker's completion): {lease_s (a claim's lease), now (the
--         Redis time the run's write was planned at: the handed lease runs from it), token
--         (the handed lease's token, made by the worker: claiming.lease_token_prefix says why),
--         live (absent = read the worker's hash; '1'/'0': whether the freed slot is live, as
--         the worker's registering process knows: checks.completion.Handoff says why),
--         limited (absent = read H+4; {tenant: 1}: the tenants with a bucket, as the worker's
--         process read them within checks.ratelimit.LIMITED_REFRESH_S)}}
-- Returns {0} when the lease is no longer ours (reaped, deleted, re-claimed): a token completes
-- a job at most once (a plan without a token completes a job that holds no lease: a heartbeat
-- check's ping or miss, always guarded); {-1} when the guard found the job changed since the
-- run read it, or the maintenance windows changed since the plan's version when the run counts
-- the check's state (nothing written: read again, plan again); else
-- {1, the id of the transition this run made or ''}, and with a plan.handoff three more: the
-- job handed the freed slot, "id scheduled_at effective_at cost_ewma_ms lane token" ('' =
-- none), the plan's now as a TIME reply {seconds, micros}, and what a refill would find
-- (celery_app.checks.dispatch.RefillNeeds: the first due job {id, score} or {}, how many of
-- ready fast, ready slow, held tenants exist;
-- {} and 0 when a job was handed the slot: then there is no refill).
--
-- The hand-off: the slot this run frees goes at once to the region's next ready job, when the
-- choice needs nothing a full claim (claim.lua) would weigh: this worker is registered with no
-- stuck slot (so the slot is a live one), no tenant of the region is held by its rate limit,
-- and the job is valid, of a tenant without a token bucket, and fits the freed slot (a fast
-- slot takes a measured fast job; a shared one the lower deadline of both lanes). The number
-- of leases does not change, so no capacity needs counting. Otherwise nothing is handed off
-- and the worker's refill (a full claim) runs on what the reply says waits.
--
-- Why one HGETALL: the lease check, the guard, the run count, the disabled flag, the region's
-- previous state and whether the quorum part must run all come from the one read. Why the
-- quorum part only runs when the region's state moved, a maintenance window holds a change
-- back (JOB.HOLD, set on every region's job with CHECK_STATE.HELD_UNTIL), or the quorum or the
-- regions changed since this region last counted the check's state (JOB.COUNTED): the check's
-- observed state is a function of those, so a run that moves none cannot move it. Both are
-- the job's own fields, so such a run reads nothing of the check's state.
--#include transition
--#include lease
local plan = cjson.decode(ARGV[1])

-- Whether ``best`` (ready in ``lane`` at ``score``) may take the slot freed in lane ``freed``,
-- and if so its lease, written: the hand-off's line, else ''. Its ready entry is the caller's.
local function hand(h, freed, now, waiting, ready, best, score, lane)
  -- the freed slot is a live one: the worker registered with no stuck slot (one held by a
  -- probe past its deadline), as its registering process said (h.live, '0' refused before
  -- anything was read) or, when that process is not this one, its hash says
  if not h.live then
    local w = redis.call('HMGET', KEYS[8], WORKER.CONCURRENCY, WORKER.STUCK)
    if not w[1] or (tonumber(w[2]) or 0) > 0 then return '' end
  end
  -- held tenants: what ``waiting`` counts past the ready indexes read (both, from a shared
  -- slot), asked only when a fast slot's look leaves it open
  if waiting > ready and (freed == 1 or redis.call('EXISTS', KEYS[11]) == 1) then
    return ''
  end
  -- its hash: this job's key with the id swapped (the same prefix and hash tag: the same slot)
  local key = KEYS[1]:sub(1, #KEYS[1] - #plan.id) .. best
  local v = redis.call('HMGET', key, JOB.TENANT, JOB.SCHEDULED_AT, JOB.COST_EWMA_MS,
    JOB.LEASE_TOKEN, JOB.RUNS)
  local sa = tonumber(v[2])
  if not v[1] or holds_lease(v[4]) or not sa then return '' end
  -- a fast job never measured runs in a shared slot (claim.lua), never in a fast one
  local claim_lane = lane
  if lane == 0 and (tonumber(v[5]) or 0) == 0 then
    if freed == 0 then return '' end
    claim_lane = 1
  end
  local limited
  if h.limited then limited = h.limited[v[1]] ~= nil
  else limited = redis.call('SISMEMBER', KEYS[12], v[1]) == 1 end
  if limited then return '' end
  local token = h.token
  local expiry = string.format('%.6f', math.max(now, sa) + tonumber(h.lease_s))
  redis.call('HSET', key, JOB.LEASE_TOKEN, token, JOB.LEASE_EXPIRY, expiry)
  redis.call('ZADD', KEYS[3 + claim_lane], expiry, best)
  return table.concat({best, v[2], score, v[3] or '0', claim_lane, token}, ' ')
end

-- The hand-off (see above): the line of the job given the slot freed in lane ``freed``, or ''.
-- ``waiting``: how many of the region's ready fast, ready slow and held tenants exist.
-- A fast slot takes fast work only, so its candidate is popped off the fast index at once (one
-- command, not a read and a removal) and put back, with its score, when the hand-off is
-- refused; a shared slot weighs both tops first and removes the one it hands.
local function handoff(h, freed, now, waiting)
  if freed == nil or h.live == '0' then return '' end
  local best, score, lane = nil, nil, nil
  local ready = 0  -- of the ready indexes read here, those not empty
  if freed == 0 then
    local top = redis.call('ZPOPMIN', KEYS[9])
    if top[1] then best, score, lane, ready = top[1], top[2], 0, 1 end
  else
    for l = 0, 1 do
      local top = redis.call('ZRANGE', KEYS[9 + l], 0, 0, 'WITHSCORES')
      if top[1] then ready = ready + 1 end
      if top[1] and (best == nil or tonumber(top[2]) < tonumber(score)) then
        best, score, lane = top[1], top[2], l
      end
    end
  end
  if best == nil then return '' end
  local line = hand(h, freed, now, waiting, ready, best, score, lane)
  if line == '' then
    if freed == 0 then redis.call('ZADD', KEYS[9], score, best) end
  elseif freed ~= 0 then
    redis.call('ZREM', KEYS[9 + lane], best)
  end
  return line
end

local flat = redis.call('HGETALL', KEYS[1])
local job, count = {}, 0
for i = 1, #flat, 2 do
  job[flat[i]] = flat[i + 1]
  count = count + 1
end
local held = job[JOB.LEASE_TOKEN]
if not holds_lease(held) then held = nil end
if held ~= plan.token then return {0} end
local guard = plan.guard
if guard then
  local lease_fields = (job[JOB.LEASE_TOKEN] and 1 or 0) + (job[JOB.LEASE_EXPIRY] and 1 or 0)
  if count - lease_fields ~= guard.count then return {-1} end
  for name, value in pairs(guard.fields) do
    if job[name] ~= value then return {-1} end
  end
end
local health = plan.health
local basis, recount = nil, false
if health then
  basis = health.quorum .. '|' .. table.concat(health.regions, ',')
  recount = (job[JOB.HEALTH] or STATE.UP) ~= health.state or job[JOB.COUNTED] ~= basis
    or job[JOB.HOLD] ~= nil
end
-- The windows only decide something here when the check's state is counted (a change held
-- or delivered): only then must they be the ones the plan was made with.
if guard and recount and (redis.call('GET', KEYS[7]) or '') ~= guard.maintenance then
  return {-1}
end
local runs = tonumber(job[JOB.RUNS] or '0')
if not runs or runs ~= math.floor(runs) or runs < 0 or runs > 1e15 then
  return redis.error_reply('torn job field ' .. JOB.RUNS)
end
local passed = nil
if plan.passed then
  passed = tonumber(job[JOB.PASSED] or '0')
  if not passed or passed ~= math.floor(passed) or passed < 0 or passed > 1e15 then
    return redis.error_reply('torn job field ' .. JOB.PASSED)
  end
  passed = passed + tonumber(plan.passed)
end
local id = plan.id
-- the lease is in the index of the lane it was claimed in: the queue the run came from says
-- which (plan.lease_lane), else both are tried
local freed_lane = nil
local hint = tonumber(plan.lease_lane)
for _, l in ipairs(hint and {hint, 1 - hint} or {0, 1}) do
  if redis.call('ZREM', KEYS[3 + l], id) == 1 then
    freed_lane = l
    break
  end
end
-- the lease is released in the same HSET (its fields emptied: see include/lease.lua)
local fields = {JOB.COST_EWMA_MS, plan.cost, JOB.DELAY_EWMA_MS, plan.delay, JOB.EFFECTIVE_AT,
  plan.ea, JOB.LANE, plan.lane, JOB.SCHEDULED_AT, plan.sa, JOB.RUNS, string.format('%d', runs + 1),
  JOB.LEASE_TOKEN, '', JOB.LEASE_EXPIRY, ''}
if passed then
  fields[#fields + 1] = JOB.PASSED
  fields[#fields + 1] = string.format('%d', passed)
end
if health then
  fields[#fields + 1] = JOB.HEALTH
  fields[#fields + 1] = health.state
  fields[#fields + 1] = JOB.STREAK_STATE
  fields[#fields + 1] = health.streak_state
  fields[#fields + 1] = JOB.STREAK
  fields[#fields + 1] = health.streak
  if recount then
    fields[#fields + 1] = JOB.COUNTED
    fields[#fields + 1] = basis
  end
end
redis.call('HSET', KEYS[1], unpack(fields))
if plan.run_ended then redis.call('HDEL', KEYS[1], JOB.HEARTBEAT_STARTED) end
if not job[JOB.DISABLED] then
  redis.call('ZADD', KEYS[2], plan.sa, id)
end
if plan.record then
  redis.call('XADD', KEYS[5], 'MAXLEN', plan.maxlen, '*', RESULT.REGION, plan.region,
    RESULT.RECORD, plan.record)
  redis.call('HSET', KEYS[6], plan.region, plan.record)
end
local reply = {1, ''}
local S = 8
if plan.handoff then
  S = 13
  local now = tonumber(plan.handoff.now)
  -- One EXISTS says whether anything waits in the region: nothing (the usual case with spare
  -- capacity) means no hand-off to look for and nothing more for the refill to read of it.
  local waiting = redis.call('EXISTS', KEYS[9], KEYS[10], KEYS[11])
  reply[3] = waiting > 0 and handoff(plan.handoff, freed_lane, now, waiting) or ''
  local seconds = math.floor(now)
  reply[4] = {seconds, math.floor((now - seconds) * 1000000)}  -- as TIME replies
  if reply[3] == '' then  -- what a refill would find; a slot handed off needs no refill
    reply[5] = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    reply[6] = waiting  -- the hand-off wrote nothing when it handed nothing
  else
    reply[5], reply[6] = {}, 0
  end
end
if not recount then return reply end

-- The region's state moved (decided in Python: scheduling_core.health.region_step), a held
-- change may be due, or the basis changed: the check's state from the quorum of its regions
-- (scheduling_core.health.overall_state).
local regions = health.regions
local jobs = {}
local down, bad = 0, 0
for i = 1, #regions do
  jobs[i] = KEYS[S + 5 + i]
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
redis.call('HSET', KEYS[S], CHECK_STATE.OBSERVED, observed)
redis.call('HSETNX', KEYS[S], CHECK_STATE.FIRST, health.now)  -- an uptime report's start
local announced = redis.call('HGET', KEYS[S], CHECK_STATE.STATE) or STATE.UP
local was_held = redis.call('HEXISTS', KEYS[S], CHECK_STATE.HELD_UNTIL) == 1
if observed == announced then
  if was_held then
    redis.call('HDEL', KEYS[S], CHECK_STATE.HELD_UNTIL)
    redis.call('ZREM', KEYS[S + 5], health.uid)
    unhold_jobs(jobs)
  elseif job[JOB.HOLD] then
    redis.call('HDEL', KEYS[1], JOB.HOLD)  -- the hold ended elsewhere: this job knows it now
  end
  return reply
end
if health.hold_until then
  -- Inside a maintenance window: hold the change; beat delivers it at the window's end if the
  -- state still differs then (transition_release.lua).
  hold_jobs(KEYS[S], KEYS[S + 5], jobs, health.uid, health.hold_until)
  return reply
end
redis.call('ZREM', KEYS[S + 5], health.uid)
reply[2] = make_transition({
  state = KEYS[S], check_stream = KEYS[S + 1], tenant_stream = KEYS[S + 2], outbox = KEYS[S + 3],
  payloads = KEYS[S + 4], last = KEYS[6], jobs = jobs, regions = regions, uid = health.uid,
  tenant = health.tenant, from = announced, to = observed, now = health.now,
  check_maxlen = health.check_maxlen, tenant_maxlen = health.tenant_maxlen, held = was_held,
})
return reply
