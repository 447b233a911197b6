-- Included (the --#include line) by complete.lua and transition_release.lua: the one place a
-- transition of a check's overall state is made. Inside the caller's atomic script it takes the
-- next id (<uid>#<seq>), records the regions' states and last results, moves the announced
-- state, appends the JSON to the check's and the tenant's capped streams and puts the id in the
-- outbox (score = now: publishable at once), from where exactly one publisher claims it.
-- KEYS: none of its own: the caller's, passed in t
-- t = {state, check_stream, tenant_stream, outbox, payloads, last, jobs = {job key per region},
--      regions = {region...}, uid, tenant, from, to, now (string), check_maxlen, tenant_maxlen,
--      held (boolean)}
local function split_commas(text)
  local out = {}
  for item in string.gmatch(text, '([^,]+)') do out[#out + 1] = item end
  return out
end

-- A window holds the check's change back until ``held_until``: the check's state and the held
-- index say so, and so does every region's job (JOB.HOLD), whose runs then count the state
-- again (complete.lua reads no check state for a run whose job says nothing changed).
local function hold_jobs(state, held_index, jobs, uid, held_until)
  redis.call('HSET', state, CHECK_STATE.HELD_UNTIL, held_until)
  redis.call('ZADD', held_index, held_until, uid)
  for _, key in ipairs(jobs) do
    if redis.call('EXISTS', key) == 1 then redis.call('HSET', key, JOB.HOLD, '1') end
  end
end

-- The hold is over: no region's job carries it any more.
local function unhold_jobs(jobs)
  for _, key in ipairs(jobs) do redis.call('HDEL', key, JOB.HOLD) end
end

local function make_transition(t)
  local seq = redis.call('HINCRBY', t.state, CHECK_STATE.SEQ, 1)
  local id = t.uid .. '#' .. seq
  local regions = {}
  for i, region in ipairs(t.regions) do
    local st = redis.call('HGET', t.jobs[i], JOB.HEALTH) or STATE.UP
    local last = redis.call('HGET', t.last, region)
    local entry = {}
    entry[TRANSITION.STATE] = st
    entry[TRANSITION.RESULT] = last and cjson.decode(last) or cjson.null
    regions[region] = entry
  end
  local record = {}
  record[TRANSITION.ID] = id
  record[TRANSITION.UID] = t.uid
  record[TRANSITION.TENANT] = t.tenant
  record[TRANSITION.FROM] = t.from
  record[TRANSITION.TO] = t.to
  record[TRANSITION.AT] = tonumber(t.now)
  record[TRANSITION.HELD] = t.held
  if next(regions) ~= nil then record[TRANSITION.REGIONS] = regions end
  local json = cjson.encode(record)
  redis.call('HSET', t.state, CHECK_STATE.STATE, t.to, CHECK_STATE.SINCE, t.now,
    CHECK_STATE.LAST_TRANSITION, id)
  redis.call('HDEL', t.state, CHECK_STATE.HELD_UNTIL)
  if t.held then unhold_jobs(t.jobs) end
  redis.call('XADD', t.check_stream, 'MAXLEN', t.check_maxlen, '*', TRANSITION.ID, id,
    TRANSITION.RECORD, json)
  redis.call('XADD', t.tenant_stream, 'MAXLEN', t.tenant_maxlen, '*', TRANSITION.ID, id,
    TRANSITION.RECORD, json)
  redis.call('ZADD', t.outbox, t.now, id)
  redis.call('HSET', t.payloads, id, json)
  return id
end
