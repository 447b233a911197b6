-- Apply a batch of check changes atomically: every precondition is checked before anything is
-- written, so a refused change writes nothing (and neither does the rest of its batch).
-- KEYS: none (standalone Redis; names come from ARGV[1], the key prefix)
-- ARGV: 1 key prefix, 2 JSON {"changes": [change, ...]} where change is
--   {uid, op: "put"|"delete", expect: -1 (must not exist) | version,
--    check: {field: value} (put), old_tenant: "" | tenant,
--    remove: [job id], jobs: [{id, f: {field: value}, place: bool, sa, ea, off: bool}]}
-- Returns {"ok"} or {"exists"|"conflict"|"missing", uid}.
local P = ARGV[1]
local changes = cjson.decode(ARGV[2]).changes

local function lanes_of(prefix_kind, region)
  return P .. ':' .. prefix_kind .. ':' .. region .. ':fast', P .. ':' .. prefix_kind .. ':' .. region .. ':slow'
end

for _, ch in ipairs(changes) do
  local v = redis.call('HGET', P .. ':check:' .. ch.uid, CHECK.VERSION)
  if ch.expect == -1 then
    if v then return {'exists', ch.uid} end
  elseif not v then
    return {'missing', ch.uid}
  elseif tonumber(v) ~= ch.expect then
    return {'conflict', ch.uid}
  end
end

-- Out of its tenant's held index (rate-limited jobs wait there instead of in ready).
local function unhold(id, region, key)
  local tenant = redis.call('HGET', key, JOB.TENANT)
  if tenant then
    redis.call('ZREM', P .. ':held:' .. region .. ':fast:' .. tenant, id)
    redis.call('ZREM', P .. ':held:' .. region .. ':slow:' .. tenant, id)
  end
end

local function remove_job(id)
  local region = string.match(id, '@([^@]+)$')
  unhold(id, region, P .. ':job:' .. id)
  redis.call('DEL', P .. ':job:' .. id)
  redis.call('ZREM', P .. ':due', id)
  local rf, rs = lanes_of('ready', region)
  local lf, ls = lanes_of('leases', region)
  redis.call('ZREM', rf, id)
  redis.call('ZREM', rs, id)
  redis.call('ZREM', lf, id)
  redis.call('ZREM', ls, id)
end

for _, ch in ipairs(changes) do
  local ckey = P .. ':check:' .. ch.uid
  for _, id in ipairs(ch.remove or {}) do remove_job(id) end
  if ch.op == 'delete' then
    redis.call('DEL', ckey, P .. ':results:' .. ch.uid, P .. ':last:' .. ch.uid)
    redis.call('SREM', P .. ':checks', ch.uid)
    if ch.old_tenant ~= '' then
      redis.call('SREM', P .. ':tenant:' .. ch.old_tenant .. ':checks', ch.uid)
    end
  else
    local args = {}
    for k, val in pairs(ch.check) do
      args[#args + 1] = k
      args[#args + 1] = val
    end
    redis.call('HSET', ckey, unpack(args))
    if not ch.check[CHECK.REGION_SPREAD] then redis.call('HDEL', ckey, CHECK.REGION_SPREAD) end
    redis.call('HINCRBY', ckey, CHECK.VERSION, 1)
    redis.call('SADD', P .. ':checks', ch.uid)
    if ch.old_tenant ~= '' and ch.old_tenant ~= ch.check[CHECK.TENANT] then
      redis.call('SREM', P .. ':tenant:' .. ch.old_tenant .. ':checks', ch.uid)
    end
    redis.call('SADD', P .. ':tenant:' .. ch.check[CHECK.TENANT] .. ':checks', ch.uid)
    for _, job in ipairs(ch.jobs or {}) do
      local key = P .. ':job:' .. job.id
      local region = string.match(job.id, '@([^@]+)$')
      local rf, rs = lanes_of('ready', region)
      local leased = redis.call('HEXISTS', key, JOB.LEASE_TOKEN) == 1
      if job.off or (job.place and not leased) then unhold(job.id, region, key) end
      local fargs = {}
      for k, val in pairs(job.f) do
        fargs[#fargs + 1] = k
        fargs[#fargs + 1] = val
      end
      redis.call('HSET', key, unpack(fargs))
      if not job.f[JOB.REGION_SPREAD] then redis.call('HDEL', key, JOB.REGION_SPREAD) end
      if job.off then
        redis.call('HSET', key, JOB.DISABLED, '1')
        redis.call('ZREM', P .. ':due', job.id)
        redis.call('ZREM', rf, job.id)
        redis.call('ZREM', rs, job.id)
      else
        redis.call('HDEL', key, JOB.DISABLED)
        if job.place and not leased then
          redis.call('HSET', key, JOB.SCHEDULED_AT, job.sa, JOB.EFFECTIVE_AT, job.ea)
          redis.call('ZREM', rf, job.id)
          redis.call('ZREM', rs, job.id)
          redis.call('ZADD', P .. ':due', job.sa, job.id)
        end
      end
    end
  end
end
return {'ok'}
