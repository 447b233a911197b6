-- Apply a batch of check changes atomically: every precondition is checked before anything is
-- written, so a refused change writes nothing (and neither does the rest of its batch).
-- Built by celery_app.checks.store (encode_changes), which declares every key in KEYS and refers
-- to them by number in the payload.
-- KEYS: every key the batch touches: check hashes, the checks set, tenants' check sets, job
--       hashes, the due index, ready, lease and held indexes, results streams, last-result hashes
-- ARGV: 1 JSON {"checks": k, "due": k, "wake": channel, "changes": [change, ...]}: k a KEYS
--   number; channel the one sleeping beats listen on (a batch that wrote PUBLISHes on it);
--   a change is {uid, check: k, expect: -1 (must not exist) | version, op: "put" | "delete",
--    fields: {CheckField: value} (put), tenant_add: k | 0, tenant_remove: k | 0,
--    drop: [k] (delete: results, last result),
--    remove: [job], jobs: [job + {fields: {JobField: value}, place, off, sa, ea}]}
--   and a job is {id, key: k, tenant (the one its hash holds, if any), held: [k fast, k slow]
--   (that tenant's held indexes), ready: [k fast, k slow], leases: [k fast, k slow]}
-- Returns {"ok"} or {"exists"|"conflict"|"missing"|"stale", uid}; "stale": a job's hash holds
-- another tenant than the one declared (read it again and re-plan).
--#include lease
local batch = cjson.decode(ARGV[1])
local DUE = KEYS[batch.due]

for _, ch in ipairs(batch.changes) do
  local v = redis.call('HGET', KEYS[ch.check], CHECK.VERSION)
  if ch.expect == -1 then
    if v then return {'exists', ch.uid} end
  elseif not v then
    return {'missing', ch.uid}
  elseif tonumber(v) ~= ch.expect then
    return {'conflict', ch.uid}
  end
  -- Held indexes are per tenant: only the declared tenant's may hold the job.
  for _, list in ipairs({ch.remove or {}, ch.jobs or {}}) do
    for _, job in ipairs(list) do
      local tenant = redis.call('HGET', KEYS[job.key], JOB.TENANT)
      if tenant and tenant ~= job.tenant then return {'stale', ch.uid} end
    end
  end
end

-- Out of its tenant's held index (rate-limited jobs wait there instead of in ready).
local function unhold(job)
  redis.call('ZREM', KEYS[job.held[1]], job.id)
  redis.call('ZREM', KEYS[job.held[2]], job.id)
end

-- A job whose tenant changes leaves the old tenant's held index for the ready index, at the
-- same effective deadline: the claim holds it again if the new tenant's bucket is empty. Left
-- there, the old tenant's release would claim it a second time (the job is in two indexes).
local function unhold_to_ready(job)
  for lane = 1, 2 do
    local score = redis.call('ZSCORE', KEYS[job.held[lane]], job.id)
    if score then
      redis.call('ZREM', KEYS[job.held[lane]], job.id)
      redis.call('ZADD', KEYS[job.ready[lane]], score, job.id)
    end
  end
end

local function remove_job(job)
  unhold(job)
  redis.call('DEL', KEYS[job.key])
  redis.call('ZREM', DUE, job.id)
  for _, k in ipairs({job.ready[1], job.ready[2], job.leases[1], job.leases[2]}) do
    redis.call('ZREM', KEYS[k], job.id)
  end
end

local function hset_all(key, fields)
  local args = {}
  for k, val in pairs(fields) do
    args[#args + 1] = k
    args[#args + 1] = val
  end
  redis.call('HSET', key, unpack(args))
end

local checks = KEYS[batch.checks]
for _, ch in ipairs(batch.changes) do
  local ckey = KEYS[ch.check]
  for _, job in ipairs(ch.remove or {}) do remove_job(job) end
  if ch.tenant_remove ~= 0 then redis.call('SREM', KEYS[ch.tenant_remove], ch.uid) end
  if ch.op == 'delete' then
    redis.call('DEL', ckey)
    for _, k in ipairs(ch.drop or {}) do redis.call('DEL', KEYS[k]) end
    redis.call('SREM', checks, ch.uid)
  else
    hset_all(ckey, ch.fields)
    if not ch.fields[CHECK.REGION_SPREAD] then redis.call('HDEL', ckey, CHECK.REGION_SPREAD) end
    redis.call('HINCRBY', ckey, CHECK.VERSION, 1)
    redis.call('SADD', checks, ch.uid)
    redis.call('SADD', KEYS[ch.tenant_add], ch.uid)
    for _, job in ipairs(ch.jobs or {}) do
      local key = KEYS[job.key]
      local rf, rs = KEYS[job.ready[1]], KEYS[job.ready[2]]
      local is_leased = holds_lease(redis.call('HGET', key, JOB.LEASE_TOKEN))
      if job.off or (job.place and not is_leased) then
        unhold(job)
      elseif job.fields[JOB.TENANT] ~= job.tenant then
        unhold_to_ready(job)
      end
      hset_all(key, job.fields)
      if not job.fields[JOB.REGION_SPREAD] then redis.call('HDEL', key, JOB.REGION_SPREAD) end
      if job.off then
        redis.call('HSET', key, JOB.DISABLED, '1')
        redis.call('ZREM', DUE, job.id)
        redis.call('ZREM', rf, job.id)
        redis.call('ZREM', rs, job.id)
      else
        redis.call('HDEL', key, JOB.DISABLED)
        if job.place and not is_leased then
          redis.call('HSET', key, JOB.SCHEDULED_AT, job.sa, JOB.EFFECTIVE_AT, job.ea)
          redis.call('ZREM', rf, job.id)
          redis.call('ZREM', rs, job.id)
          redis.call('ZADD', DUE, job.sa, job.id)
        end
      end
    end
  end
end
-- Sleeping beats dispatch now: a new tick may come before their planned wake-up.
redis.call('PUBLISH', batch.wake, '')
return {'ok'}
