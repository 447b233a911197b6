-- Deliver a transition held back by a maintenance window, once the window is over: beat runs it
-- for each check in the held index whose window end has passed.
-- KEYS: 1 check state hash, 2 check transitions stream, 3 tenant transitions stream,
--       4 transition outbox, 5 transition payloads, 6 maintenance held zset, 7 last-result hash,
--       7 + i the job hash of the check's i-th region (ARGV 3)
-- ARGV: 1 uid, 2 tenant, 3 regions comma list, 4 now, 5 the end of a window the check is in
--       now ('' = none), 6 check transitions maxlen, 7 tenant transitions maxlen
-- Returns the transition id, or 0 (nothing to deliver, or held again by a window).
--#include transition
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[6], ARGV[1])
  return 0
end
local observed = redis.call('HGET', KEYS[1], CHECK_STATE.OBSERVED) or STATE.UP
local announced = redis.call('HGET', KEYS[1], CHECK_STATE.STATE) or STATE.UP
local regions = split_commas(ARGV[3])
local jobs = {}
for i = 1, #regions do jobs[i] = KEYS[7 + i] end
if observed == announced then
  redis.call('HDEL', KEYS[1], CHECK_STATE.HELD_UNTIL)
  redis.call('ZREM', KEYS[6], ARGV[1])
  unhold_jobs(jobs)
  return 0
end
if ARGV[5] ~= '' then
  hold_jobs(KEYS[1], KEYS[6], jobs, ARGV[1], ARGV[5])
  return 0
end
redis.call('ZREM', KEYS[6], ARGV[1])
return make_transition({
  state = KEYS[1], check_stream = KEYS[2], tenant_stream = KEYS[3], outbox = KEYS[4],
  payloads = KEYS[5], last = KEYS[7], jobs = jobs, regions = regions, uid = ARGV[1],
  tenant = ARGV[2], from = announced, to = observed, now = ARGV[4], check_maxlen = ARGV[6],
  tenant_maxlen = ARGV[7], held = true,
})
