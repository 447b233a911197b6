-- The start read of one check run (workers/tasks.py), in one call: the job (the post-exec write
-- plans from it), what its check says to probe (kind, target, config: nothing else of the
-- check is the run's), this server's time (the run starts on its tick on it), and the run's
-- first-delivery marker, taken only while the lease is this run's (a stale or forged message
-- marks nothing). The maintenance version is not read here: the worker plans with the one its
-- window cache last saw, and complete.lua's guard sends it back to read when that moved.
-- KEYS: 1 job hash, 2 check hash, 3 the run's started marker (Keys.job, check, run_started)
-- ARGV: 1 the run's lease token, 2 the marker's value (the Celery id), 3 the marker's TTL (ms)
-- Returns {job fields and values (flat), {check kind, target, config} (false where absent: all
--          three for a deleted check), {seconds, micros}, 1 if this is the lease's first
--          delivery else 0}
local job = redis.call('HGETALL', KEYS[1])
local first = 0
for i = 1, #job, 2 do
  if job[i] == JOB.LEASE_TOKEN then
    if job[i + 1] == ARGV[1] and redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then
      first = 1
    end
    break
  end
end
return {job, redis.call('HMGET', KEYS[2], CHECK.KIND, CHECK.TARGET, CHECK.CONFIG),
        redis.call('TIME'), first}
