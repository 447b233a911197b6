-- Claim, in one atomic step, as many ready jobs of one region as its workers have free slots,
-- lowest effective deadline first across both lanes, slow jobs only up to the shared capacity,
-- each tenant's token bucket permitting. Atomic, so dispatchers on several beats (and workers
-- refilling their slots) never claim the same job and never claim past the free slots together.
--
-- Second phase of a claim (celery_app.checks.claiming.RegionClaimer): Python read the region's
-- workers, its held tenants, the rate-limited tenants and the top of both ready indexes, and
-- declares every key the claim may touch. This script re-validates all of it: only workers whose
-- key still exists count; a candidate is claimed only if it is still in its ready index at the
-- score Python read; a candidate whose tenant has a bucket that is not declared here (the tenant
-- became rate-limited meanwhile) is left in place. Either of the last two makes the result
-- 'more', and Python reads again.
--
-- Python keeps the workers and tenant sets it read between claims (the claimer's cache): the
-- workers are re-validated here on every call as above, and a change this script makes to the
-- held tenants set moves the claim tenants version (KEYS[8]) so every claimer reads it again.
--
-- KEYS: 1 ready fast, 2 ready slow, 3 leases fast, 4 leases slow, 5 region workers set,
--       6 held tenants set of the region, 7 rate-limited tenants set,
--       8 claim tenants version counter, then W worker hashes (9 .. 8+W),
--       then per declared tenant t (1..T) three keys: its token bucket at TK+3t-2, its held
--       index of the fast lane at TK+3t-1 and of the slow lane at TK+3t (TK = 8+W),
--       then the job hashes (job j at JK+j, JK = TK+3T)
-- ARGV: 1 now, 2 lease expiry (now + the lease; a job claimed ahead of its tick, within the
--       dispatch lead, holds its lease from its tick: its worker waits until then), 3 max claims in this call, 4 max rate-limited jobs to hold,
--       5 W, 6 T, then W worker hostnames (7 .. 6+W), then, packed (P = 6+W; tenants and job
--       ids hold no whitespace; t and j below are their numbers):
--       P+1 the declared tenants "name name ...", P+2 the job ids "id\nid\n...",
--       P+3 held tenants to settle "t t ...", P+4 held jobs to release "t j lane\n...",
--       P+5 the number F of fast candidates, P+6 the number S of slow ones: jobs 1..F are the
--       fast candidates in index order, F+1..F+S the slow ones, P+7 their scores "s s ...",
--       P+8 the fast list's full flag ('1' = the index may hold more than was read),
--       P+9 the slow list's, P+10 the lease token prefix (claiming.lease_token_prefix): the
--       k-th claim's lease token is "<prefix>.<k>".
-- A tenant that is neither declared nor in the rate-limited set has no bucket: unlimited.
-- Returns {total slots, slow capacity, in flight fast, in flight slow, rate-limited (held now),
--          stop, claims, declared workers found gone}
-- stop: 'full' (no free slot left), 'limit' (the hold limit was reached), 'more' (a candidate
-- list ran out while its index may hold more, or a candidate was stale: read again), 'done'.
-- claims is ONE string, a line per claim in claim order: "j scheduled_at cost_ewma_ms lane"
-- (lane: the one it runs in; a fast job never measured runs in the slow one, see below).
--#include lease
local now = tonumber(ARGV[1])
local expiry = ARGV[2]
local lease_s = tonumber(expiry) - now
local max_claims, skip_limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local W, T = tonumber(ARGV[5]), tonumber(ARGV[6])
local TK = 8 + W
local JK = TK + 3 * T
local P = 6 + W
local CHUNK = 1000  -- values per batched command (Lua's unpack limit is 8000)

-- Capacity: live workers (their heartbeat key exists) of this region; a slot whose probe thread
-- still runs past its deadline (stuck) is busy, never free.
local total, slowcap, gone = 0, 0, 0
for w = 1, W do
  local v = redis.call('HMGET', KEYS[8 + w], WORKER.ROLE, WORKER.CONCURRENCY, WORKER.STUCK)
  if v[2] then
    local c = math.max(0, (tonumber(v[2]) or 0) - (tonumber(v[3]) or 0))
    total = total + c
    if v[1] == ROLE.SHARED then slowcap = slowcap + c end
  else
    redis.call('SREM', KEYS[5], ARGV[6 + w])  -- stale: its heartbeat expired
    gone = gone + 1
  end
end
local in_fast = redis.call('ZCARD', KEYS[3])
local in_slow = redis.call('ZCARD', KEYS[4])
local free = total - in_fast - in_slow
local free_slow = math.min(slowcap - in_slow, free)
if free > max_claims then free = max_claims end
if free <= 0 then
  return {total, slowcap, in_fast, in_slow, 0, 'full', '', gone}
end

local tenants, tenant_number, ids = {}, {}, {}
for name in string.gmatch(ARGV[P + 1], '%S+') do
  tenants[#tenants + 1] = name
  tenant_number[name] = #tenants
end
for id in string.gmatch(ARGV[P + 2], '%S+') do ids[#ids + 1] = id end
local function held_key(t, lane) return KEYS[TK + 3 * t - 1 + lane] end

-- Token buckets, read once per tenant per call and written back at the end.
local buckets = {}
local function bucket(t)
  local b = buckets[t]
  if b == nil then
    local v = redis.call('HMGET', KEYS[TK + 3 * t - 2], BUCKET.RATE, BUCKET.BURST, BUCKET.TOKENS,
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
    buckets[t] = b
  end
  return b
end

-- The declared number of a job's tenant; 0 = unlimited (no bucket); nil = it has a bucket this
-- call did not declare (it became rate-limited after Python read the set).
local undeclared = {}
local function tenant_of(name)
  local t = tenant_number[name]
  if t then return t end
  local limited = undeclared[name]
  if limited == nil then
    limited = redis.call('SISMEMBER', KEYS[7], name) == 1
    undeclared[name] = limited
  end
  if limited then return nil end
  return 0
end

-- A rate-limited job's missed ticks are skipped runs: scheduled_at moves on to its latest tick,
-- the effective deadline does not (it recedes, and wins the next token).
-- Fields that are no numbers (or counts past 10^13) are left as they are, never a script error
-- halfway through a claim (a job whose data is bad is quarantined by Python, not here).
local function account_skipped(key)
  local v = redis.call('HMGET', key, JOB.SCHEDULED_AT, JOB.PERIOD, JOB.SKIPPED)
  local sa, period = tonumber(v[1]), tonumber(v[2])
  local counted = (not v[3]) or (#v[3] <= 15 and string.match(v[3], '%d+') == v[3])
  if counted and sa and period and period > 0 and now >= sa + period
      and (now - sa) / period < 1e13 then
    local missed = math.floor((now - sa) / period)
    redis.call('HSET', key, JOB.SCHEDULED_AT, string.format('%.3f', sa + missed * period))
    redis.call('HINCRBY', key, JOB.SKIPPED, missed)
  end
end

local tenants_changed = false  -- the held tenants set: claimers read it again (KEYS[8])

-- Release held jobs of tenants whose bucket has tokens again (all of them if the bucket is
-- gone), oldest effective deadline first, back into the ready index at that old deadline.
local releases = {}
for t, j, lane in string.gmatch(ARGV[P + 4], '(%d+) (%d+) (%d)') do
  t = tonumber(t)
  local list = releases[t]
  if not list then
    list = {}
    releases[t] = list
  end
  list[#list + 1] = {tonumber(j), tonumber(lane)}
end
for t in string.gmatch(ARGV[P + 3], '%d+') do
  t = tonumber(t)
  local b = bucket(t)
  local n = b and math.floor(b.tokens) or -1
  if n ~= 0 then
    local released = {[0] = 0, [1] = 0}
    for _, entry in ipairs(releases[t] or {}) do
      local j, lane = entry[1], entry[2]
      if n < 0 or released[lane] < n then
        local id, hk = ids[j], held_key(t, lane)
        local score = redis.call('ZSCORE', hk, id)
        if score then
          released[lane] = released[lane] + 1
          redis.call('ZREM', hk, id)
          -- A deleted job has nothing to run; a leased one runs already (a stray held entry,
          -- e.g. a tenant change once left one): releasing it would lease it a second time.
          local exists = redis.call('EXISTS', KEYS[JK + j]) == 1
          if exists and not holds_lease(redis.call('HGET', KEYS[JK + j], JOB.LEASE_TOKEN)) then
            account_skipped(KEYS[JK + j])
            redis.call('ZADD', KEYS[1 + lane], score, id)
          end
        end
      end
    end
    if redis.call('EXISTS', held_key(t, 0), held_key(t, 1)) == 0 then
      tenants_changed = redis.call('SREM', KEYS[6], tenants[t]) == 1 or tenants_changed
    end
  end
end

-- The candidates: the score Python read, and the one each has now (a ZMSCORE per chunk, after
-- the releases); job j's candidate entry is j itself (see ARGV).
local F, S = tonumber(ARGV[P + 5]), tonumber(ARGV[P + 6])
local expected, current = {}, {}
for score in string.gmatch(ARGV[P + 7], '%S+') do expected[#expected + 1] = tonumber(score) end
for lane = 0, 1 do
  local first, last = 1, F
  if lane == 1 then first, last = F + 1, F + S end
  for a = first, last, CHUNK do
    local b = math.min(a + CHUNK - 1, last)
    local scores = redis.call('ZMSCORE', KEYS[1 + lane], unpack(ids, a, b))
    for k = a, b do current[k] = tonumber(scores[k - a + 1]) end
  end
end
local full = {[0] = ARGV[P + 8] == '1', [1] = ARGV[P + 9] == '1'}
local prefix = ARGV[P + 10]
local next_of = {[0] = 1, [1] = F + 1}
local last_of = {[0] = F, [1] = F + S}

local unready = {[0] = {}, [1] = {}}  -- ZREM'd from the ready index at the end, in batches
local leased = {[0] = {}, [1] = {}}   -- ZADD'ed to the lease index at the end
local claims = {}
local skipped = 0
local stale = false
local stop = 'done'
while true do
  if free <= 0 then
    stop = 'full'
    break
  end
  local f = next_of[0] <= last_of[0] and next_of[0] or nil
  local s = nil
  if free_slow > 0 and next_of[1] <= last_of[1] then s = next_of[1] end
  -- A list that ran out although its index holds more: the next entry is unknown, so taking
  -- from the other lane now could break the deadline order.
  if (not f and full[0]) or (free_slow > 0 and not s and full[1]) then
    stop = 'more'
    break
  end
  if not f and not s then break end
  local lane = 0
  if s and (not f or expected[s] < expected[f]) then lane = 1 end
  local j = (lane == 1) and s or f
  next_of[lane] = j + 1
  local id, key, ready_key = ids[j], KEYS[JK + j], KEYS[1 + lane]
  local score = expected[j]
  if current[j] ~= score then
    stale = true  -- claimed by another dispatcher, held, or re-scored since it was read
  else
    local v = redis.call('HMGET', key, JOB.TENANT, JOB.SCHEDULED_AT, JOB.COST_EWMA_MS,
      JOB.LEASE_TOKEN, JOB.RUNS)
    local t = v[1] and tenant_of(v[1])
    -- A fast-lane job that never ran has no measured cost: it may be slow, so it runs in a
    -- shared slot (slow queue and lease index), never one reserved for the fast lane; it keeps
    -- its place in the fast index (FIFO by deadline) and waits there for a shared slot.
    local unmeasured = lane == 0 and slowcap > 0 and (tonumber(v[5]) or 0) == 0
    local claim_lane = unmeasured and 1 or lane
    if not v[1] then
      redis.call('ZREM', ready_key, id)  -- the job was deleted: nothing to run
    elseif holds_lease(v[4]) then
      redis.call('ZREM', ready_key, id)  -- leased already (a stray entry): never a second lease
    elseif not t then
      stale = true  -- its tenant's bucket is not declared here: read again
    elseif unmeasured and free_slow <= 0 then
      -- no shared slot free: left in place for the next claim (not stale: nothing changed)
    else
      local b = t > 0 and bucket(t)
      if b and b.tokens < 1 then
        -- Rate-limited: held (out of the way of other tenants' jobs) at its old effective
        -- deadline, and released first when the tenant's bucket has tokens again.
        skipped = skipped + 1
        redis.call('ZREM', ready_key, id)
        redis.call('ZADD', held_key(t, lane), score, id)
        tenants_changed = redis.call('SADD', KEYS[6], v[1]) == 1 or tenants_changed
        if skipped >= skip_limit then
          stop = 'limit'
          break
        end
      else
        if b then b.tokens = b.tokens - 1 end
        claims[#claims + 1] = j .. ' ' .. (v[2] or '0') .. ' ' .. (v[3] or '0') .. ' ' ..
          claim_lane
        local sa = tonumber(v[2])
        local lx = expiry
        if sa and sa > now then lx = string.format('%.6f', sa + lease_s) end
        redis.call('HSET', key, JOB.LEASE_TOKEN, prefix .. '.' .. #claims, JOB.LEASE_EXPIRY, lx)
        local u, l = unready[lane], leased[claim_lane]
        u[#u + 1] = id
        l[#l + 1] = lx
        l[#l + 1] = id
        free = free - 1
        if claim_lane == 1 then free_slow = free_slow - 1 end
      end
    end
  end
end
if stop == 'done' and stale then stop = 'more' end

for lane = 0, 1 do
  local u, l = unready[lane], leased[lane]
  for a = 1, #u, CHUNK do
    redis.call('ZREM', KEYS[1 + lane], unpack(u, a, math.min(a + CHUNK - 1, #u)))
  end
  for a = 1, #l, 2 * CHUNK do
    redis.call('ZADD', KEYS[3 + lane], unpack(l, a, math.min(a + 2 * CHUNK - 1, #l)))
  end
end
if tenants_changed then redis.call('INCR', KEYS[8]) end
for t, b in pairs(buckets) do
  if b then
    redis.call('HSET', KEYS[TK + 3 * t - 2], BUCKET.TOKENS, string.format('%.6f', b.tokens),
      BUCKET.UPDATED, string.format('%.3f', b.ts))
  end
end
return {total, slowcap, in_fast, in_slow, skipped, stop, table.concat(claims, '\n'), gone}
