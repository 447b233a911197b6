-- Move due jobs (scheduled_at <= now) into the ready index of their (region, lane), scored by the
-- job's STORED effective deadline: a job deferred by the rate limit keeps its old, receding one.
-- Second phase of a promote (celery_app.checks.claiming.promote_due): Python read the due ids
-- and declares every key here. A job no longer due (promoted by another beat, rescheduled) is
-- skipped, so concurrent promotes move each job once.
-- A heartbeat check's job (JOB.HEARTBEAT) is not run by a worker: due means its ping is late,
-- so it goes to the late heartbeats zset instead (scored by its deadline), where beat's
-- dispatcher records the miss (celery_app.checks.heartbeat).
-- KEYS: 1 due zset, 2 late heartbeats zset;
--       3 .. 2+2R the ready indexes: region r (1..R) fast at 2r+1, slow at 2r+2;
--       then one job hash per job, in ARGV's order (job i at 2+2R+i)
-- ARGV: 1 now, 2 R, 3 the job ids packed "id\nid\n..." (job ids hold no whitespace),
--       4 each job's region number r, packed "r r ..."
-- Returns {the number of jobs this call moved out of the due index, then the number it put in
--   each ready index, in KEYS' order (3 .. 2+2R), then the number of late heartbeats}
--   (the dispatch metrics count per region, lane).
local now = tonumber(ARGV[1])
local R = tonumber(ARGV[2])
local regions = {}
for r in string.gmatch(ARGV[4], '%d+') do regions[#regions + 1] = tonumber(r) end
local ids = {}
for job in string.gmatch(ARGV[3], '%S+') do ids[#ids + 1] = job end
-- Their due scores now, a ZMSCORE per chunk (unpack stays far below Lua's limit of 8000 values).
local CHUNK = 1000
local scores = {}
for a = 1, #ids, CHUNK do
  local b = math.min(a + CHUNK - 1, #ids)
  local current = redis.call('ZMSCORE', KEYS[1], unpack(ids, a, b))
  for k = a, b do scores[k] = tonumber(current[k - a + 1]) end
end
local moved, by_index, late = {}, {}, {}
for i, job in ipairs(ids) do
  local score = scores[i]
  if score and score <= now then
    local v = redis.call('HMGET', KEYS[2 + 2 * R + i], JOB.LANE, JOB.EFFECTIVE_AT, JOB.HEARTBEAT)
    if v[3] == '1' then
      late[#late + 1] = score
      late[#late + 1] = job
    elseif v[2] then
      local k = 2 * regions[i] + ((v[1] == '1') and 1 or 0)
      local entries = by_index[k]
      if not entries then
        entries = {}
        by_index[k] = entries
      end
      entries[#entries + 1] = v[2]
      entries[#entries + 1] = job
    end
    moved[#moved + 1] = job
  end
end
-- Batched writes.
for k, entries in pairs(by_index) do
  for s = 1, #entries, 2 * CHUNK do
    redis.call('ZADD', KEYS[k + 1], unpack(entries, s, math.min(s + 2 * CHUNK - 1, #entries)))
  end
end
for s = 1, #late, 2 * CHUNK do
  redis.call('ZADD', KEYS[2], unpack(late, s, math.min(s + 2 * CHUNK - 1, #late)))
end
for s = 1, #moved, CHUNK do
  redis.call('ZREM', KEYS[1], unpack(moved, s, math.min(s + CHUNK - 1, #moved)))
end
local out = {#moved}
for k = 2, 1 + 2 * R do
  out[#out + 1] = by_index[k] and (#by_index[k] / 2) or 0
end
out[#out + 1] = #late / 2
return out
