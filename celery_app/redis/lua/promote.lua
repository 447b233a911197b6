-- Move due jobs (scheduled_at <= now) into the ready index of their (region, lane), scored by the
-- job's STORED effective deadline: a job deferred by the rate limit keeps its old, receding one.
-- KEYS: 1 due zset
-- ARGV: 1 now, 2 job key prefix, 3 ready key prefix, 4 max jobs to move
-- Returns the number of jobs moved.
local jobs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[4]))
for _, job in ipairs(jobs) do
  local v = redis.call('HMGET', ARGV[2] .. job, JOB.LANE, JOB.EFFECTIVE_AT)
  local region = string.match(job, '@([^@]+)$')
  if v[2] and region then
    local lane = (v[1] == '1') and 'slow' or 'fast'
    redis.call('ZADD', ARGV[3] .. region .. ':' .. lane, v[2], job)
  end
  redis.call('ZREM', KEYS[1], job)
end
return #jobs
