-- Claim, in one atomic step, as many ready jobs of one region as its workers have free slots,
-- lowest effective deadline first across both lanes, slow jobs only up to the shared capacity,
-- each tenant's token bucket permitting. Atomic, so dispatchers on several beats never claim
-- the same job and never claim past the free slots together.
-- KEYS: 1 ready fast, 2 ready slow, 3 leases fast, 4 leases slow, 5 region workers set,
--       6 lease sequence counter, 7 held tenants set of the region
-- ARGV: 1 now, 2 lease expiry, 3 worker key prefix, 4 job key prefix, 5 rate-limit key prefix,
--       6 max claims in this call, 7 max rate-limited jobs to hold in this call,
--       8 held key prefix of the region ("<prefix>:held:<region>:")
-- Returns {total slots, slow capacity, in flight fast, in flight slow, rate-limited, claims}
-- where claims is ONE string, a line per claim: "job token scheduled_at effective cost lane"
-- (job ids hold no whitespace; one bulk reply parses far faster than six per claim).
local now = tonumber(ARGV[1])

-- Capacity: live workers (their heartbeat key exists) of this region.
local total, slowcap = 0, 0
for _, host in ipairs(redis.call('SMEMBERS', KEYS[5])) do
  local w = redis.call('HMGET', ARGV[3] .. host, WORKER.ROLE, WORKER.CONCURRENCY)
  if w[2] then
    local c = tonumber(w[2]) or 0
    total = total + c
    if w[1] == ROLE.SHARED then slowcap = slowcap + c end
  else
    redis.call('SREM', KEYS[5], host)  -- stale: its heartbeat expired
  end
end
local in_fast = redis.call('ZCARD', KEYS[3])
local in_slow = redis.call('ZCARD', KEYS[4])
local free = total - in_fast - in_slow
local free_slow = math.min(slowcap - in_slow, free)
local max_claims = tonumber(ARGV[6])
if free > max_claims then free = max_claims end
local claims = {}
if free <= 0 then
  return {total, slowcap, in_fast, in_slow, 0, ''}
end

local skip_limit = tonumber(ARGV[7])
local held_prefix = ARGV[8]
local LANE = {[0] = 'fast', [1] = 'slow'}

-- Token buckets, read once per tenant per call and written back at the end.
local buckets = {}
local function bucket(tenant)
  local b = buckets[tenant]
  if b == nil then
    local v = redis.call('HMGET', ARGV[5] .. tenant, BUCKET.RATE, BUCKET.BURST, BUCKET.TOKENS,
      BUCKET.UPDATED)
    if not v[1] then
      b = false
    else
      local rate, burst = tonumber(v[1]), tonumber(v[2])
      local tokens = tonumber(v[3]) or burst
      local ts = tonumber(v[4]) or now
      if now > ts then
        tokens = math.min(burst, tokens + (now - ts) * rate / 60.0)
        ts = now
      end
      b = {tokens = tokens, ts = ts}
    end
    buckets[tenant] = b
  end
  return b
end

-- A rate-limited job's missed ticks are skipped runs: scheduled_at moves on to its latest tick,
-- the effective deadline does not (it recedes, and wins the next token).
local function account_skipped(key)
  local v = redis.call('HMGET', key, JOB.SCHEDULED_AT, JOB.PERIOD)
  local sa, period = tonumber(v[1]), tonumber(v[2])
  if sa and period and period > 0 and now >= sa + period then
    local missed = math.floor((now - sa) / period)
    redis.call('HSET', key, JOB.SCHEDULED_AT, string.format('%.3f', sa + missed * period))
    redis.call('HINCRBY', key, JOB.SKIPPED, missed)
  end
end

-- Release held jobs of tenants whose bucket has tokens again (all of them if the bucket is
-- gone), oldest effective deadline first, back into the ready index at that old deadline.
for _, tenant in ipairs(redis.call('SMEMBERS', KEYS[7])) do
  local b = bucket(tenant)
  local n = b and math.floor(b.tokens) or -1
  if n ~= 0 then
    for lane = 0, 1 do
      local hk = held_prefix .. LANE[lane] .. ':' .. tenant
      local members = redis.call('ZRANGE', hk, 0, n < 0 and -1 or n - 1, 'WITHSCORES')
      for k = 1, #members, 2 do
        local job = members[k]
        redis.call('ZREM', hk, job)
        if redis.call('EXISTS', ARGV[4] .. job) == 1 then
          account_skipped(ARGV[4] .. job)
          redis.call('ZADD', KEYS[lane + 1], members[k + 1], job)
        end
      end
    end
    if redis.call('EXISTS', held_prefix .. 'fast:' .. tenant, held_prefix .. 'slow:' .. tenant) == 0 then
      redis.call('SREM', KEYS[7], tenant)
    end
  end
end

-- Read each ready index lazily, a page at a time: usually one page of `free` entries is all it
-- takes. Every entry visited leaves the index (claimed, held, or deleted), so each next page
-- starts at the top again (`kept` counts entries stepped over and left in place: none today).
local function pager(key, enabled)
  return {key = key, buf = {}, pos = 1, kept = 0, done = not enabled}
end
local function peek(p)
  if p.done then return nil end
  if p.buf[p.pos] == nil then
    local size = math.max(free, 32)
    p.buf = redis.call('ZRANGE', p.key, p.kept, p.kept + size - 1, 'WITHSCORES')
    p.pos = 1
    if p.buf[1] == nil then
      p.done = true
      return nil
    end
  end
  return p.buf[p.pos], p.buf[p.pos + 1]
end
local F = pager(KEYS[1], true)
local S = pager(KEYS[2], free_slow > 0)

local seq = nil
local skipped = 0
local n = 0
while free > 0 do
  local fjob, fea = peek(F)
  local sjob, sea = nil, nil
  if free_slow > 0 then sjob, sea = peek(S) end
  local take_slow
  if fjob and sjob then
    take_slow = tonumber(sea) < tonumber(fea)
  elseif fjob then
    take_slow = false
  elseif sjob then
    take_slow = true
  else
    break
  end
  local job, ea, lane, ready_key, lease_key, page
  if take_slow then
    job, ea, lane, ready_key, lease_key, page = sjob, sea, 1, KEYS[2], KEYS[4], S
  else
    job, ea, lane, ready_key, lease_key, page = fjob, fea, 0, KEYS[1], KEYS[3], F
  end
  page.pos = page.pos + 2
  local key = ARGV[4] .. job
  local v = redis.call('HMGET', key, JOB.TENANT, JOB.SCHEDULED_AT, JOB.COST_EWMA_MS, JOB.PERIOD)
  if not v[1] then
    redis.call('ZREM', ready_key, job)  -- the job was deleted: nothing to run
  else
    local b = bucket(v[1])
    if b and b.tokens < 1 then
      -- Rate-limited: held (out of the way of other tenants' jobs) at its old effective
      -- deadline, and released first when the tenant's bucket has tokens again.
      skipped = skipped + 1
      redis.call('ZREM', ready_key, job)
      redis.call('ZADD', held_prefix .. LANE[lane] .. ':' .. v[1], ea, job)
      redis.call('SADD', KEYS[7], v[1])
      if skipped >= skip_limit then break end
    else
      if b then b.tokens = b.tokens - 1 end
      if not seq then seq = redis.call('INCR', KEYS[6]) end
      n = n + 1
      local token = seq .. '.' .. n
      redis.call('HSET', key, JOB.LEASE_TOKEN, token, JOB.LEASE_EXPIRY, ARGV[2])
      redis.call('ZREM', ready_key, job)
      redis.call('ZADD', lease_key, ARGV[2], job)
      claims[#claims + 1] = job .. ' ' .. token .. ' ' .. v[2] .. ' ' .. ea .. ' ' ..
        (v[3] or '0') .. ' ' .. lane
      free = free - 1
      if take_slow then free_slow = free_slow - 1 end
    end
  end
end

for tenant, b in pairs(buckets) do
  if b then
    redis.call('HSET', ARGV[5] .. tenant, BUCKET.TOKENS, string.format('%.6f', b.tokens),
      BUCKET.UPDATED, string.format('%.3f', b.ts))
  end
end
return {total, slowcap, in_fast, in_slow, skipped, table.concat(claims, '\n')}
