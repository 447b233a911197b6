-- The start read of one check run (workers/tasks.py), in one call: the job (the post-exec write
-- plans from it), what its check says to probe (kind, target, config: nothing else of the
-- check is the run's) unless the worker keeps them already, and the run's first-delivery marker, taken only while the lease is this
-- run's (a stale or forged message marks nothing). The maintenance version is not read here:
-- the worker plans with the one its window cache last saw, and complete.lua's guard sends it
-- back to read when that moved. Nor this server's time: the worker keeps it
-- (celery_app.redis.clock.SERVER_CLOCK).
-- The check's fields are read only when the job's digest of them (JOB.PROBE_DIGEST, written
-- with them by store.lua in one call) is not the digest of the copy the worker keeps (ARGV[4]):
-- the job is read anyway, the check's fields change only when an operator edits the check.
-- KEYS: 1 job hash, 2 check hash, 3 the run's started marker (Keys.job, check, run_started)
-- ARGV: 1 the run's lease token, 2 the marker's value (the Celery id), 3 the marker's TTL (ms),
--       4 the digest of the check's fields the worker keeps ('' = none)
-- Returns {job fields and values (flat), {check kind, target, config} (false where absent: all
--          three for a deleted check), or false when the worker's copy is current,
--          1 if this is the lease's first delivery else 0}
local job = redis.call('HGETALL', KEYS[1])
local first, current = 0, false
for i = 1, #job, 2 do
  if job[i] == JOB.LEASE_TOKEN then
    if job[i + 1] == ARGV[1] and redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then
      first = 1
    end
  elseif job[i] == JOB.PROBE_DIGEST then
    current = ARGV[4] ~= '' and job[i + 1] == ARGV[4]
  end
end
local check = false
if not current then check = redis.call('HMGET', KEYS[2], CHECK.KIND, CHECK.TARGET, CHECK.CONFIG) end
return {job, check, first}
